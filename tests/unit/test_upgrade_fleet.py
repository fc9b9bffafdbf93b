"""The real fleet's pure parts: what a probe of a recorded host says, kubectl's arguments and how its
answers are read, which pods use GPUs, the target version resolution, and how a playbook result maps
to each host's outcome."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import InputError
from provisioner.executors import CommandResult, OpenConnections, SnapshotExecutor, to_shell
from provisioner.inventory import HostSpec
from provisioner.probes.base import ProbeResult
from provisioner.rollout.kube import KubectlOverSsh, uses_gpu
from provisioner.rollout.model import StepFailed
from provisioner.runner import Event, Failure, HostStats, PlaybookResult
from provisioner.upgrade.adapters import PROBES, RealFleet, probe_from_results
from provisioner.upgrade.plan import DriverTarget, parse_target
from provisioner.upgrade.verb import resolve_install_version
from provisioner.verification import replay

H200 = Path(__file__).resolve().parent.parent / "fixtures" / "snapshots" / "h200-device" / "vm"


def recorded() -> dict[str, ProbeResult]:
    return replay(SnapshotExecutor(H200), PROBES)


def test_probe_of_the_real_h200() -> None:
    p = probe_from_results("vm", recorded(), "vm")
    assert p.loaded == "580.159.04"
    assert (p.gpus_pci, p.gpus_driver) == (1, 1)
    assert p.xids == ()
    assert p.driver_ok and "580.159.04 loaded" in p.driver_detail
    assert p.error is None


def test_probe_sees_xids_and_a_missing_driver() -> None:
    results = recorded()
    log = results["kernel-log.txt"]
    xid = "[ 4242.000001] NVRM: Xid (PCI:0000:00:06): 79, pid=0, GPU has fallen off the bus."
    results["kernel-log.txt"] = dataclasses.replace(log, stdout=log.stdout + xid + "\n")
    results["proc-driver-nvidia-version"] = ProbeResult("proc-driver-nvidia-version", 1, "", "No such file")
    results["nvidia-smi-q.xml"] = ProbeResult(
        "nvidia-smi-q.xml",
        9,
        "",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    )
    p = probe_from_results("vm", results, None)
    assert p.loaded is None
    assert p.gpus_pci == 1 and p.gpus_driver is None
    assert p.xids == (xid,)
    assert not p.driver_ok
    assert "not loaded" in p.driver_detail


# ------------------------------------------------------------------------------------------ kubectl


class FakeSsh:
    """Answers kubectl command lines like a control plane would; records them."""

    def __init__(self, answers: dict[str, list[CommandResult]]) -> None:
        self.answers = answers
        self.commands: list[str] = []

    def connect(self) -> None:
        return None

    def close(self) -> None:
        return None

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        text = to_shell(command)  # what the SSH executor sends
        self.commands.append(text)
        for key, queue in self.answers.items():
            if key in text and queue:
                return queue.pop(0) if len(queue) > 1 else queue[0]
        return CommandResult(0, "", "", 0.0)


def ok(stdout: str = "") -> CommandResult:
    return CommandResult(0, stdout, "", 0.01)


def err(stderr: str, rc: int = 1) -> CommandResult:
    return CommandResult(rc, "", stderr, 0.01)


def kube(
    answers: dict[str, list[CommandResult]], user: str = "root", **hv: Any
) -> tuple[KubectlOverSsh, FakeSsh]:
    fake = FakeSsh(answers)
    spec = HostSpec(name="cp1", address="192.0.2.10", user=user, vars=hv)
    kubectl = KubectlOverSsh(
        spec,
        OpenConnections(),
        poll_s=0.01,
        executor=fake,  # type: ignore[arg-type]
        annotation="gpuprov.io/driver-upgrade",
    )
    return kubectl, fake


NODE = {
    "metadata": {
        "name": "gpu1",
        "labels": {"nvidia.com/gpu.deploy.device-plugin": "true", "kubernetes.io/hostname": "gpu1"},
    },
    "spec": {"unschedulable": True},
}


def test_node_read_and_not_found() -> None:
    k, fake = kube(
        {
            "get node -o json -- gpu1": [ok(json.dumps(NODE))],
            "get node -o json -- gpu9": [err('Error from server (NotFound): nodes "gpu9" not found')],
        }
    )
    info = k.node("gpu1")
    assert info is not None and info.unschedulable
    assert info.labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert k.node("gpu9") is None
    assert fake.commands[0] == (
        "kubectl --kubeconfig /etc/kubernetes/admin.conf --request-timeout=30s get node -o json -- gpu1"
    )


def test_kubectl_missing_is_a_step_failure_not_a_missing_node() -> None:
    k, _ = kube({"get node": [err("sh: 1: kubectl: not found", rc=127)]})
    with pytest.raises(StepFailed, match="kubectl not found on cp1"):
        k.node("gpu1")
    k, _ = kube({"get node": [err('Error from server (NotFound): pods "gpu1" not found')]})
    with pytest.raises(StepFailed):
        k.node("gpu1")


def test_api_down_is_a_step_failure_not_a_missing_node() -> None:
    k, _ = kube({"get node": [err("The connection to the server 192.0.2.10:6443 was refused")]})
    with pytest.raises(StepFailed, match="kubectl get node gpu1: The connection to the server"):
        k.node("gpu1")


def test_non_root_control_plane_uses_sudo() -> None:
    k, fake = kube({}, user="ops", ansible_become=True)
    k.cordon("gpu1")
    assert fake.commands[0].startswith("sudo -n -- kubectl --kubeconfig /etc/kubernetes/admin.conf")


def test_drain_arguments_and_timeout_reason() -> None:
    k, fake = kube(
        {
            "drain": [
                err(
                    'error: unable to drain node "gpu1" due to error: '
                    '[error when evicting pods/"blocker" -n "default": global timeout reached: 20s], '
                    "continuing command...\n"
                    "There are pending nodes to be drained:\n gpu1\n"
                    'error when evicting pods/"blocker" -n "default": global timeout reached: 20s'
                )
            ]
        }
    )
    with pytest.raises(StepFailed) as exc:
        k.drain("gpu1", 20)
    assert exc.value.reason == (
        'kubectl drain (timeout 20s): error when evicting pods/"blocker" -n "default": '
        "global timeout reached: 20s"
    )
    assert "drain --ignore-daemonsets --delete-emptydir-data --timeout=20s -- gpu1" in fake.commands[0]


def test_labels_and_annotations() -> None:
    k, fake = kube({"annotate --overwrite -- node gpu1 gpuprov.io/driver-upgrade-": [err("not found")]})
    k.set_labels("gpu1", {"nvidia.com/gpu.deploy.dcgm": "paused-for-driver-upgrade", "a": "true"})
    k.annotate("gpu1", "failed: dpkg error")
    k.annotate("gpu1", None)  # removing an absent annotation is fine
    assert fake.commands[0].endswith(
        "label --overwrite -- node gpu1 a=true nvidia.com/gpu.deploy.dcgm=paused-for-driver-upgrade"
    )
    assert fake.commands[1].endswith(
        "annotate --overwrite -- node gpu1 'gpuprov.io/driver-upgrade=failed: dpkg error'"
    )


def test_set_annotations_sets_and_removes_several_in_one_call() -> None:
    k, fake = kube(
        {"gpuprov.io/certified-at-": [err('error: annotation "gpuprov.io/certified-at" not found')]}
    )
    k.set_annotations("gpu1", {"gpuprov.io/certified-at": '{"at": "2026-12-05T10:23:49Z"}', "b": "x y"})
    k.set_annotations("gpu1", {"gpuprov.io/certified-at": None})  # removing an absent one is fine
    assert fake.commands[0].endswith(
        "annotate --overwrite -- node gpu1 'b=x y' "
        '\'gpuprov.io/certified-at={"at": "2026-12-05T10:23:49Z"}\''
    )
    assert fake.commands[1].endswith("annotate --overwrite -- node gpu1 gpuprov.io/certified-at-")
    k, _ = kube({"annotate": [err("Error from server (Forbidden): nodes is forbidden")]})
    with pytest.raises(StepFailed, match="kubectl annotate node gpu1: Error from server"):
        k.set_annotations("gpu1", {"gpuprov.io/certified-at": "x"})


def pod(ns: str, name: str, limits: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, **extra.get("meta", {})},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits or {}}}]},
        "status": {"phase": extra.get("phase", "Running")},
    }


def test_gpu_pods_are_told_apart() -> None:
    assert uses_gpu(pod("a", "train", {"nvidia.com/gpu": "8"}))
    assert uses_gpu(pod("a", "slice", {"nvidia.com/mig-1g.10gb": "1"}))
    assert not uses_gpu(pod("a", "web", {"cpu": "1"}))
    assert not uses_gpu(pod("a", "done", {"nvidia.com/gpu": "1"}, phase="Succeeded"))
    mirror = pod(
        "kube-system",
        "x",
        {"nvidia.com/gpu": "1"},
        meta={"annotations": {"kubernetes.io/config.mirror": "1"}},
    )
    assert not uses_gpu(mirror)


def test_evict_gpu_pods_drains_only_the_gpu_pods() -> None:
    ds = pod("ml", "agent", {"nvidia.com/gpu": "1"})
    ds["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "controller": True, "name": "agent"}]
    listing = {
        "items": [
            pod("ml", "train", {"nvidia.com/gpu": "1"}),
            pod("ml", "infer", {"nvidia.com/gpu": "1"}),
            pod("web", "nginx", {"cpu": "1"}),
            ds,
        ]
    }
    k, fake = kube({"get pods": [ok(json.dumps(listing))]})
    k.evict_gpu_pods("gpu1", 30)
    assert fake.commands[1].endswith(
        "label -n ml --overwrite -- pods infer train gpuprov.io/evict-for-driver-upgrade=gpu1"
    )
    assert fake.commands[2].endswith(
        "drain --pod-selector gpuprov.io/evict-for-driver-upgrade=gpu1 --ignore-daemonsets "
        "--delete-emptydir-data --timeout=30s -- gpu1"
    )
    assert len(fake.commands) == 3


def test_no_gpu_pods_nothing_to_evict() -> None:
    k, fake = kube({"get pods": [ok(json.dumps({"items": [pod("web", "nginx", {"cpu": "1"})]}))]})
    k.evict_gpu_pods("gpu1", 30)
    assert len(fake.commands) == 1


def test_evict_gpu_pods_failure_names_the_pods() -> None:
    listing = {"items": [pod("ml", "train", {"nvidia.com/gpu": "1"})]}
    k, _ = kube(
        {
            "get pods": [ok(json.dumps(listing))],
            "drain": [err('error when evicting pods/"train" -n "ml": global timeout reached: 5s')],
        }
    )
    with pytest.raises(
        StepFailed, match=r"GPU pods not evicted \(ml/train; timeout 5s\): error when evicting"
    ):
        k.evict_gpu_pods("gpu1", 5)


def test_wait_for_operands() -> None:
    left = {"items": [pod("gpu-operator", "nvidia-device-plugin-daemonset-x")]}
    k, fake = kube({"get pods": [ok(json.dumps(left)), ok(json.dumps({"items": []}))]})
    k.wait_operands_gone("gpu1", 30)
    assert "spec.nodeName=gpu1 -o json -l 'app in (nvidia-operator-validator," in fake.commands[0]
    k, _ = kube({"get pods": [ok(json.dumps(left))]})
    with pytest.raises(
        StepFailed, match="GPU Operator pods still on the node after 0s: gpu-operator/nvidia-device"
    ):
        k.wait_operands_gone("gpu1", 0)


# ---------------------------------------------------------------------------------- target version


def spec(name: str, **hv: Any) -> HostSpec:
    return HostSpec(name=name, address="192.0.2.1", groups=["gpu_nodes"], vars=hv)


def test_install_version_resolution() -> None:
    assert resolve_install_version(parse_target("570.195.03"), [spec("a")]) == "570.195.03"
    # A branch resolves to the role's pinned default ...
    assert resolve_install_version(parse_target("580"), [spec("a", nvidia_driver_version="570.195.03")]) == (
        "580.159.04"
    )
    # ... or to the inventory's pin in that branch.
    assert resolve_install_version(parse_target("570"), [spec("a", nvidia_driver_version="570.195.03")]) == (
        "570.195.03"
    )
    with pytest.raises(InputError, match=r"--to 575: no pinned 575.x version to install"):
        resolve_install_version(parse_target("575"), [spec("a")])
    with pytest.raises(InputError, match="pins several versions"):
        resolve_install_version(
            parse_target("580"), [spec("a", nvidia_driver_version="580.95.05"), spec("b")]
        )


# ----------------------------------------------------------------------------------- playbook runs


def fleet(tmp_path: Path) -> RealFleet:
    return RealFleet(
        hosts=[spec("gpu1"), spec("gpu2"), spec("gpu3"), spec("gpu4")],
        control_plane=None,
        inventory_path=tmp_path / "hosts.yml",
        record=tmp_path,
        install_version="580.159.04",
        progress=lambda h, t: None,
    )


def test_extravars_carry_the_exact_version_and_leave_reload_and_reboot_to_the_play(tmp_path: Path) -> None:
    assert fleet(tmp_path).extravars(DriverTarget("580"), reboot_allowed=True) == {
        "nvidia_driver_branch": "580",
        "nvidia_driver_version": "580.159.04",
        "nvidia_driver_reload_modules": False,
        "nvidia_driver_reboot_allowed": False,
        "gpuprov_upgrade_reboot_allowed": True,
    }


def test_playbook_result_to_outcomes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run(playbook: Path, inventory: Path, **kw: Any) -> PlaybookResult:
        seen.update(kw, playbook=playbook)
        emit = kw["on_event"]
        for host in ("gpu1", "gpu2", "gpu3"):
            emit(
                Event("runner_on_ok", host, None, "Step stopping", facts={"gpuprov_upgrade_step": "stopping"})
            )
            emit(Event("runner_on_ok", host, "nvidia_driver", "Unload the modules in dependency order"))
            # A task name is not progress: only the fact is.
            emit(Event("runner_on_ok", host, None, "UPGRADE STEP reloading"))
            emit(Event("runner_on_ok", host, None, "Step", facts={"gpuprov_upgrade_step": "installing"}))
        emit(Event("runner_on_ok", "gpu1", None, "x", facts={"gpuprov_upgrade_step": "reloading"}))
        emit(Event("runner_on_ok", "gpu2", None, "x", facts={"gpuprov_upgrade_note": "reload-impossible"}))
        emit(Event("runner_on_ok", "gpu3", None, "x", facts={"gpuprov_upgrade_step": "made-up\x1b[2J"}))
        return PlaybookResult(
            status="failed",
            rc=2,
            stats={
                "gpu1": HostStats("gpu1"),
                "gpu2": HostStats("gpu2", rescued=1),
                "gpu3": HostStats("gpu3", failed=1),
            },
            failures=[
                # rescued by the unload block: the modules stay loaded, a reboot is pending
                Failure(
                    "gpu2", "nvidia_driver", "No process may hold the NVIDIA modules", "still in use: nvidia"
                ),
                Failure("gpu3", "nvidia_driver", "Install the driver packages", "dpkg: error processing"),
            ],
            reboot_pending={"gpu2"},
        )

    monkeypatch.setattr("provisioner.runner.run_playbook", fake_run)
    monkeypatch.setattr("provisioner.upgrade.adapters.PLAYBOOK", tmp_path / "upgrade_driver.yml")
    (tmp_path / "upgrade_driver.yml").write_text("---\n")
    steps: list[tuple[str, str]] = []
    out = fleet(tmp_path).upgrade(
        ["gpu1", "gpu2", "gpu3", "gpu4"],
        DriverTarget("580"),
        reboot_allowed=False,
        on_step=lambda h, s: steps.append((h, s)),
    )
    assert seen["hosts"] == ["gpu1", "gpu2", "gpu3", "gpu4"] and "limit" not in seen
    assert seen["forks"] == 4
    assert seen["record_dir"] == tmp_path / "install-01"
    assert out["gpu1"].result == "ok"
    assert out["gpu2"].result == "reboot-pending"
    assert out["gpu2"].reason.startswith(
        "the old driver's modules could not be unloaded (still in use); 580.159.04"
    )
    assert (out["gpu3"].result, out["gpu3"].reason) == (
        "failed",
        "nvidia_driver: Install the driver packages: dpkg: error processing",
    )
    assert out["gpu4"].result == "failed" and "did not run on gpu4" in out["gpu4"].reason
    assert [s for h, s in steps if h == "gpu1"] == ["stopping", "installing", "reloading"]
    assert [s for h, s in steps if h == "gpu3"] == ["stopping", "installing"]


def test_label_removal() -> None:
    k, fake = kube({"node gpu1": [err('label "nvidia.com/gpu.deploy.operands" not found.')]})
    k.set_labels("gpu1", {"nvidia.com/gpu.deploy.operands": None})  # already gone: fine
    assert fake.commands[0].endswith("label --overwrite -- node gpu1 nvidia.com/gpu.deploy.operands-")
    k, _ = kube({"node gpu1": [err("Error from server (Forbidden): nodes is forbidden")]})
    with pytest.raises(StepFailed, match="kubectl label node gpu1: Error from server"):
        k.set_labels("gpu1", {"nvidia.com/gpu.deploy.operands": "false"})


# ------------------------------------------------------------------------------- hostile node names


HOSTILE_NAMES = ["-l=kubernetes.io/os=linux", "--all", "gpu1 gpu2", "GPU_1", "x,gpu2", "", "a" * 254]
HOSTILE_NAMES.append("g\x1b[2J")


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_name_that_is_not_a_node_name_never_reaches_kubectl(name: str) -> None:
    """A host names its node through its hostname, which the host controls: `-l=...` would make
    `kubectl cordon` select every node. Such a name is refused before any kubectl runs."""
    k, fake = kube({})
    with pytest.raises(StepFailed, match="not a valid Kubernetes node name"):
        k.node(name)
    assert fake.commands == []


def test_every_positional_argument_comes_after_the_end_of_options() -> None:
    k, fake = kube({"get node": [ok(json.dumps(NODE))]})
    k.node("gpu1")
    k.cordon("gpu1")
    k.uncordon("gpu1")
    k.drain("gpu1", 20)
    k.set_labels("gpu1", {"a": "true"})
    k.annotate("gpu1", "x")
    for cmd in fake.commands:
        assert " -- " in cmd and cmd.split(" -- ", 1)[1].split()[-1] != "--", cmd
        assert "gpu1" not in cmd.split(" -- ", 1)[0], cmd


def test_the_node_reports_its_machine_id_and_internal_ips() -> None:
    node = {
        **NODE,
        "status": {
            "nodeInfo": {"machineID": "0123456789abcdef0123456789abcdef"},
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.5"},
                {"type": "Hostname", "address": "gpu1"},
            ],
        },
    }
    k, _ = kube({"get node": [ok(json.dumps(node))]})
    info = k.node("gpu1")
    assert info is not None
    assert (info.machine_id, info.addresses) == ("0123456789abcdef0123456789abcdef", ("10.0.0.5",))


def test_the_real_kubectl_parses_every_command_line_as_meant(tmp_path: Path) -> None:
    """Each command line gpuprov sends (options, then `--`, then names) is accepted by the real kubectl:
    with an API server that is not there it gets as far as connecting, never to a usage error."""
    import shlex
    import subprocess

    from gpuprov_lab import vendor

    k, fake = kube({"get node": [ok(json.dumps(NODE))], "get pods": [ok(json.dumps({"items": [
        pod("ml", "infer", {"nvidia.com/gpu": "1"})]}))]})  # fmt: skip
    k.node("gpu1")
    k.cordon("gpu1")
    k.drain("gpu1", 20)
    k.evict_gpu_pods("gpu1", 30)
    k.set_labels("gpu1", {"a": "true", "b": None})
    k.annotate("gpu1", "upgrading")
    k.uncordon("gpu1")
    server = ["--kubeconfig", "/dev/null", "--server", "https://127.0.0.1:1", "--token", "x",
              "--insecure-skip-tls-verify", "--request-timeout=2s"]  # fmt: skip
    for command in fake.commands:
        argv = shlex.split(command)
        args = argv[argv.index("--request-timeout=30s") + 1 :]
        real = [str(vendor.kubectl()), *server, *args]
        res = subprocess.run(real, capture_output=True, text=True, timeout=60)
        assert "connection to the server 127.0.0.1:1 was refused" in res.stderr, (command, res.stderr)


def test_taint_and_event_commands() -> None:
    k, fake = kube({"taint nodes -- gpu1 gpuprov.io/needs-service:NoSchedule-": [err('taint "x" not found')]})
    k.taint("gpu1", "gpuprov.io/needs-service", "true", "NoSchedule")
    k.taint("gpu1", "gpuprov.io/needs-service", None, "NoSchedule")  # absent: not an error
    assert "taint nodes --overwrite -- gpu1 gpuprov.io/needs-service=true:NoSchedule" in fake.commands[0]
    k.event("gpu1", "GpuprovNeedsService", "Xid 79 on GPU 0'; rm -rf / #", warning=True)
    sent = fake.commands[-1]
    # the object travels as one quoted word into kubectl's stdin: the message is no shell syntax
    assert sent.startswith("printf '%s' ") and "| kubectl --kubeconfig /etc/kubernetes/admin.conf" in sent
    import shlex

    words = shlex.split(sent)
    doc = json.loads(words[2])
    assert doc["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu1", "uid": "gpu1"}
    assert doc["type"] == "Warning" and doc["message"].endswith("rm -rf / #")
