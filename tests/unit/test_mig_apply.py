"""`gpuprov mig apply` over a fake fleet and cluster whose MIG manager follows the real label protocol
(NVIDIA mig-parted k8s-mig-manager: acts on a change of nvidia.com/mig.config only, pauses the operand
labels, reports nvidia.com/mig.config.state, leaves the operands paused when it fails). Checks refuse bad
layouts before anything is touched; a failure leaves the node cordoned with its operands restored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_inventory import inventory

from provisioner.errors import EXIT_FAILED, EXIT_OK, InputError
from provisioner.mig import parse_mig_devices
from provisioner.migapply import verb
from provisioner.migapply.fleet import (
    CONFIG_LABEL,
    PAUSED,
    STATE_LABEL,
    ClusterMig,
    GpuRow,
    MigProbe,
    parse_gpu_clients,
    parse_gpu_rows,
)
from provisioner.rollout.model import NodeInfo, StepFailed

INVENTORY = inventory(
    "gpu1: {ansible_host: 192.0.2.11, gpuprov_mig_config: all-1g.18gb}",
    "gpu2: {ansible_host: 192.0.2.12, gpuprov_mig_config: all-balanced}",
    "gpu3: {ansible_host: 192.0.2.13}",
    gpu_vars=("gpuprov_mig_strategy: mixed",),
)

CONFIG = (Path(__file__).resolve().parents[1] / "fixtures" / "mig" / "layouts.yaml").read_text()

GPUS = {"gpu1": (0x2335, 1), "gpu2": (0x2330, 8), "gpu3": (0x20B2, 4)}
DEPLOY = {
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    "nvidia.com/gpu.deploy.dcgm-exporter": "true",
}


class FakeKube:
    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster

    def node(self, name: str) -> NodeInfo | None:
        n = self.c.nodes.get(name)
        if n is None:
            return None
        return NodeInfo(name, n["cordoned"], dict(n["labels"]), machine_id=f"{name:0>32}"[-32:])

    def cordon(self, name: str) -> None:
        self.c.log.append(("cordon", name))
        self.c.nodes[name]["cordoned"] = True

    def uncordon(self, name: str) -> None:
        self.c.log.append(("uncordon", name))
        self.c.nodes[name]["cordoned"] = False

    def drain(self, name: str, timeout: float) -> None:
        raise AssertionError("mig apply evicts GPU pods only")

    def evict_gpu_pods(self, name: str, timeout: float) -> None:
        self.c.log.append(("evict", name))

    def set_labels(self, name: str, labels: dict[str, str | None]) -> None:
        self.c.log.append(("label", name, dict(labels)))
        node = self.c.nodes[name]["labels"]
        before = node.get(CONFIG_LABEL)
        for k, v in labels.items():
            if v is None:
                node.pop(k, None)
            else:
                node[k] = v
        if node.get(CONFIG_LABEL) != before and CONFIG_LABEL in labels:
            self.c.manager(name)  # the manager sees the change

    def wait_operands_gone(self, name: str, timeout: float) -> None:
        raise AssertionError("the MIG manager takes the operands off, not gpuprov")

    def annotate(self, name: str, text: str | None) -> None:
        self.c.nodes[name]["annotation"] = text

    def close(self) -> None:
        pass


class FakeCluster:
    """Nodes, and a MIG manager that applies a layout to the fake GPUs when the label changes."""

    def __init__(self, strategy: str = "mixed", fail_on: set[str] | None = None) -> None:
        self.strategy = strategy
        self.fail_on = fail_on or set()
        self.kubelet_broken = False
        self.log: list[Any] = []
        self.nodes: dict[str, dict[str, Any]] = {
            h: {
                "cordoned": False,
                "labels": dict(DEPLOY),
                "devices": {},
                "mig": False,
                "annotation": None,
                "kubelet": True,
            }
            for h in GPUS
        }

    def manager(self, node: str) -> None:
        from provisioner.mig import parse_config, wanted_devices

        n = self.nodes[node]
        labels = n["labels"]
        layout = labels[CONFIG_LABEL]
        labels[STATE_LABEL] = "pending"
        for k in DEPLOY:
            if labels.get(k) == "true":
                labels[k] = PAUSED
        if node in self.fail_on:
            # Operands stay paused and the host's kubelet stopped, as the real manager (v0.15.0) leaves
            # them once it has had one success in the same pod.
            labels[STATE_LABEL] = "failed"
            n["kubelet"] = False
            return
        device_id, count = GPUS[node]
        wanted = wanted_devices(parse_config(CONFIG, "cm")[layout], dict.fromkeys(range(count), device_id))
        n["devices"] = {i: dict(c) for i, c in wanted.items() if c}
        n["mig"] = bool(n["devices"])
        for k in DEPLOY:
            if labels.get(k) == PAUSED:
                labels[k] = "true"
        labels[STATE_LABEL] = "success"

    def allocatable(self, node: str) -> dict[str, str]:
        n = self.nodes[node]
        _device_id, count = GPUS[node]
        out = {"nvidia.com/gpu": str(count - len(n["devices"]))}
        for counts in n["devices"].values():
            for p, c in counts.items():
                key = f"nvidia.com/mig-{p}"
                out[key] = str(int(out.get(key, "0")) + c)
        return out


class FakeMigFleet:
    poll_s = 0.0

    def __init__(self, cluster: FakeCluster, **kw: Any) -> None:
        self.c = cluster
        self.namespace = kw.get("namespace", "gpu-operator")
        self.kube = FakeKube(cluster)
        self.restarts: list[str] = []

    def probe(self, hosts: list[str]) -> dict[str, MigProbe]:
        out = {}
        for h in hosts:
            device_id, count = GPUS[h]
            n = self.c.nodes[h]
            out[h] = MigProbe(
                h,
                loaded="580.159.04",
                node=h,
                machine_id=f"{h:0>32}"[-32:],
                gpus=[
                    GpuRow(i, device_id, "Enabled" if i in n["devices"] else "Disabled") for i in range(count)
                ],
                mig_devices={i: dict(n["devices"].get(i, {})) for i in range(count)},
            )
        return out

    def cluster_mig(self) -> ClusterMig:
        return ClusterMig(self.c.strategy, True, "default-mig-parted-config", CONFIG)

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.c.nodes[node]["labels"])

    def node_doc(self, node: str) -> dict[str, Any]:
        return {"status": {"allocatable": self.c.allocatable(node)}}

    def restart_manager(self, node: str) -> None:
        self.restarts.append(node)
        self.c.manager(node)  # a new pod reads the label at start

    def manager_log(self, node: str, lines: int = 5) -> str:
        return "Applying the selected MIG config failed"

    def start_stopped_services(self, host: str, services: tuple[str, ...]) -> list[str]:
        assert "kubelet.service" in services
        n = self.c.nodes[host]
        if n["kubelet"]:
            return []
        if self.c.kubelet_broken:
            raise StepFailed("systemctl start kubelet.service: Job for kubelet.service failed")
        n["kubelet"] = True
        return ["kubelet.service"]

    def node_ready(self, node: str) -> bool:
        return bool(self.c.nodes[node]["kubelet"])

    def wait_state(self, node: str, layout: str, timeout: float) -> tuple[str, dict[str, str]]:
        labels = self.labels(node)
        return labels.get(STATE_LABEL) or "timeout", labels

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(verb.MIG_PARTED_ENV, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-mig-parted unless a test names one
    inv = tmp_path / "hosts.yml"
    inv.write_text(INVENTORY)
    return inv


def apply(inv: Path, cluster: FakeCluster, **kw: Any) -> tuple[verb.MigResult, FakeMigFleet]:
    made: list[FakeMigFleet] = []

    def factory(**args: Any) -> FakeMigFleet:
        made.append(FakeMigFleet(cluster, **args))
        return made[-1]

    result = verb.run_mig_apply(inventory=inv, fleet_factory=factory, **kw)  # type: ignore[arg-type]
    return result, made[0]


def test_layouts_applied_and_verified(env: Path) -> None:
    cluster = FakeCluster()
    result, _ = apply(env, cluster)
    assert result.exit_code == EXIT_OK, result.summary
    hosts = {h["host"]: h for h in result.summary["hosts"]}  # type: ignore[index]
    assert set(hosts) == {"gpu1", "gpu2"}  # gpu3 declares no layout
    assert hosts["gpu1"]["result"] == "applied"
    assert "nvidia.com/mig-1g.18gb=7" in hosts["gpu1"]["reason"]
    assert "nvidia.com/mig-1g.10gb=16" in hosts["gpu2"]["reason"]
    assert "nvidia.com/mig-3g.40gb=8" in hosts["gpu2"]["reason"]
    for node in ("gpu1", "gpu2"):
        assert cluster.nodes[node]["cordoned"] is False
        assert ("evict", node) in cluster.log
    # One batch at a time: gpu1 is back before gpu2 is cordoned.
    order = [e for e in cluster.log if e[0] in ("cordon", "uncordon")]
    assert order == [("cordon", "gpu1"), ("uncordon", "gpu1"), ("cordon", "gpu2"), ("uncordon", "gpu2")]
    # Applied hosts are skipped the second time.
    again, _ = apply(env, cluster)
    assert {h["result"] for h in again.summary["hosts"]} == {"skipped"}  # type: ignore[index]


def test_layout_beyond_the_gpu_is_refused_before_anything(env: Path) -> None:
    env.write_text(INVENTORY.replace("all-1g.18gb}", "too-many}"))
    cluster = FakeCluster()
    with pytest.raises(InputError) as exc:
        apply(env, cluster)
    assert "gpu1: too-many: NVIDIA H200 141GB holds at most 4 × 1g.35gb, not 5" in str(exc.value)
    assert cluster.log == []
    assert not (env.parent / "home" / "runs").exists()


def test_unknown_layout_and_single_strategy_refused(env: Path) -> None:
    env.write_text(INVENTORY.replace("all-1g.18gb}", "all-3g.99gb}").replace("mixed", "single"))
    with pytest.raises(InputError) as exc:
        apply(env, FakeCluster(strategy="single"))
    text = str(exc.value)
    assert "no MIG configuration named 'all-3g.99gb'" in text
    assert "gpu2: all-balanced mixes profiles 1g.10gb, 2g.20gb, 3g.40gb on one node" in text


def test_strategy_must_match_the_cluster(env: Path) -> None:
    cluster = FakeCluster(strategy="single")
    with pytest.raises(
        InputError, match=r"ClusterPolicy has mig\.strategy single, the inventory declares mixed"
    ):
        apply(env, cluster)
    assert cluster.log == []


def test_disagreeing_strategies_refused(env: Path) -> None:
    env.write_text(
        INVENTORY.replace(
            "gpu1: {ansible_host: 192.0.2.11,",
            "gpu1: {gpuprov_mig_strategy: single, ansible_host: 192.0.2.11,",
        )
    )
    with pytest.raises(InputError, match="one setting for the whole cluster"):
        apply(env, FakeCluster())


def test_manager_failure_leaves_node_cordoned_with_operands_restored(env: Path) -> None:
    cluster = FakeCluster(fail_on={"gpu1"})
    result, _ = apply(env, cluster, limit="gpu1")
    assert result.exit_code == EXIT_FAILED
    host = result.summary["hosts"][0]  # type: ignore[index]
    assert host["result"] == "failed"
    assert "nvidia.com/mig.config.state=failed" in host["reason"]
    assert "operand labels restored" in host["reason"]
    assert "kubelet.service left stopped by the MIG manager: started again, node gpu1 Ready" in host["reason"]
    node = cluster.nodes["gpu1"]
    assert node["kubelet"] is True
    assert node["cordoned"] is True
    assert all(node["labels"][k] == "true" for k in DEPLOY)
    assert "failed" in (node["annotation"] or "")
    assert result.summary["resumable"]  # type: ignore[index]

    # The cause is fixed; the same label value would be ignored by the manager, so --resume restarts it.
    cluster.fail_on.clear()
    resumed, fleet = apply(env, cluster, resume=True)
    assert resumed.exit_code == EXIT_OK, resumed.summary
    assert fleet.restarts == ["gpu1"]
    assert cluster.nodes["gpu1"]["cordoned"] is False
    assert cluster.nodes["gpu1"]["annotation"] is None


def test_no_control_plane_refused(env: Path) -> None:
    env.write_text(INVENTORY.replace("kube_control_plane", "other_group"))
    with pytest.raises(InputError, match="needs a kube_control_plane host"):
        apply(env, FakeCluster())


def test_bad_layout_name_names_host_and_key(env: Path) -> None:
    env.write_text(INVENTORY.replace("all-1g.18gb}", "'all 1g;rm -rf'}"))
    with pytest.raises(
        InputError, match=r"gpuprov_mig_config: .* is no Kubernetes label value .*\(host gpu1\)"
    ):
        apply(env, FakeCluster())


def test_real_mig_parted_refuses_an_unknown_field(tmp_path: Path) -> None:
    """NVIDIA's own parser (nvidia-mig-parted v0.15.0 built from source) judges the config map."""
    from gpuprov_lab import vendor

    tool = vendor.artifact("mig-parted", "bin/nvidia-mig-parted")
    verb.assert_valid_config(str(tool), CONFIG, {"all-1g.18gb", "all-balanced"}, "cm")
    bad = CONFIG.replace('mig-devices:\n        "1g.18gb": 7', 'migdevices:\n        "1g.18gb": 7')
    with pytest.raises(InputError, match=r"nvidia-mig-parted refuses all-1g\.18gb"):
        verb.assert_valid_config(str(tool), bad, {"all-1g.18gb"}, "cm")


def test_parsers_read_real_formats() -> None:
    rows = parse_gpu_rows("0, 0x233510DE, 580.159.04, Disabled\n")
    assert rows == [GpuRow(0, 0x2335, "Disabled")]
    with pytest.raises(ValueError):
        parse_gpu_rows("0, 0x233510DF, 580.159.04, Disabled\n")
    listing = (
        "GPU 0: NVIDIA H200 (UUID: GPU-1)\n"
        "  MIG 1g.18gb     Device  0: (UUID: MIG-a)\n"
        "  MIG 1g.18gb     Device  1: (UUID: MIG-b)\n"
        "GPU 1: NVIDIA H200 (UUID: GPU-2)\n"
    )
    assert parse_mig_devices(listing) == {0: {"1g.18gb": 2}, 1: {}}


def test_state_file_records_the_run(env: Path) -> None:
    result, _ = apply(env, FakeCluster(), limit="gpu1")
    record = Path(result.summary["record"])  # type: ignore[index]
    doc = json.loads((record / "state.json").read_text())
    assert doc["verb"] == "mig-apply"
    assert doc["hosts"]["gpu1"]["to"] == "all-1g.18gb"


def test_step_failed_in_cluster_read_is_bad_input(env: Path) -> None:
    class Broken(FakeMigFleet):
        def cluster_mig(self) -> ClusterMig:
            raise StepFailed("clusterpolicies.nvidia.com not found")

    with pytest.raises(InputError, match=r"cannot read the GPU Operator's MIG settings"):
        verb.run_mig_apply(inventory=env, fleet_factory=lambda **kw: Broken(FakeCluster(), **kw))  # type: ignore[arg-type]


class _RecordingKubectl:
    """kubectl that answers from a table of argv prefixes and records every call."""

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def kubectl(self, *args: str, timeout: float = 60.0) -> Any:
        from provisioner.executors import CommandResult

        self.calls.append(args)
        rc, out = self.answers.get(args[0], (1, ""))
        return CommandResult(rc, out, "" if rc == 0 else "error", 0.0)


def _fleet_with(kube: _RecordingKubectl) -> Any:
    from provisioner.migapply.fleet import MigFleet

    fleet = MigFleet.__new__(MigFleet)
    fleet.namespace = "gpu-operator"
    fleet.kube = kube  # type: ignore[assignment]
    return fleet


def test_manager_log_reads_the_nodes_manager_pod_by_name() -> None:
    """Real kubectl takes no --field-selector on `logs`: the node's pod is looked up, then read by name."""
    kube = _RecordingKubectl({"get": (0, "nvidia-mig-manager-x7k2p"), "logs": (0, "applying\nfailed\n")})
    assert _fleet_with(kube).manager_log("gpu1", lines=3) == "applying\nfailed"
    get, logs = kube.calls
    assert get[:2] == ("get", "pods") and "spec.nodeName=gpu1" in get
    assert (
        logs[0] == "logs"
        and "--field-selector" not in logs
        and logs[-2:] == ("--", "nvidia-mig-manager-x7k2p")
    )
    assert "--tail=3" in logs


@pytest.mark.parametrize("listing", ["", "-rf /", "Bad_Name"])
def test_manager_log_reads_nothing_without_a_valid_pod_name(listing: str) -> None:
    kube = _RecordingKubectl({"get": (0, listing), "logs": (0, "should not be read")})
    assert _fleet_with(kube).manager_log("gpu1") == ""
    assert [c[0] for c in kube.calls] == ["get"]


def test_a_kubelet_that_will_not_start_is_said(env: Path) -> None:
    cluster = FakeCluster(fail_on={"gpu1"})
    cluster.kubelet_broken = True
    result, _ = apply(env, cluster, limit="gpu1")
    assert result.exit_code == EXIT_FAILED
    reason = result.summary["hosts"][0]["reason"]  # type: ignore[index]
    assert "host services the MIG manager stopped NOT started again" in reason
    assert "Job for kubelet.service failed" in reason
    assert cluster.nodes["gpu1"]["cordoned"] is True


def test_gpu_clients_list_is_read_as_data() -> None:
    text = """
version: v1
systemd-services:
  - nvsm.service
  - dcgm.service
  - "--now"
  - "a b.service"
  - kubelet.service
  - 7
"""
    assert parse_gpu_clients(text) == ("kubelet.service", "nvsm.service", "dcgm.service")
    assert parse_gpu_clients("&a [") == ("kubelet.service",)
    assert parse_gpu_clients("- just a list") == ("kubelet.service",)


def test_a_node_that_never_advertises_the_layout_fails_after_the_advertise_timeout(env: Path) -> None:
    """The manager says success but the device plugin keeps advertising whole GPUs (as over NVIDIA's mock
    NVML): mig apply waits --advertise-timeout, then fails the node and leaves it cordoned."""
    import time

    cluster = FakeCluster()
    cluster.allocatable = lambda node: {"nvidia.com/gpu": str(GPUS[node][1])}  # type: ignore[method-assign]
    start = time.monotonic()
    result, _ = apply(env, cluster, limit="gpu1", advertise_timeout=0.2)
    assert time.monotonic() - start < 30
    assert result.exit_code == EXIT_FAILED
    host = result.summary["hosts"][0]  # type: ignore[index]
    assert "advertises nvidia.com/gpu=1 (expected 0)" in host["reason"], host
    assert cluster.nodes["gpu1"]["cordoned"] is True


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("inf"), float("nan")])
def test_an_advertise_timeout_that_is_no_duration_is_refused(env: Path, seconds: float) -> None:
    cluster = FakeCluster()
    with pytest.raises(InputError, match="--advertise-timeout"):
        apply(env, cluster, advertise_timeout=seconds)
    assert cluster.log == []


class _FakeHostShell:
    """An SSH session to a host whose systemd knows a few units: (active, enabled) per unit."""

    def __init__(self, units: dict[str, tuple[bool, bool]], start_fails: bool = False) -> None:
        self.units = units
        self.start_fails = start_fails
        self.commands: list[list[str]] = []
        self.closed = False

    def run(self, argv: list[str], timeout: float) -> Any:
        from provisioner.executors import CommandResult

        self.commands.append(list(argv))
        verb, name = argv[-3], argv[-1]
        active, enabled = self.units.get(name, (False, False))
        if verb == "is-active":
            return CommandResult(0 if active else 3, "", "", 0.0)
        if verb == "is-enabled":
            return CommandResult(0 if enabled else 1, "", "", 0.0)
        if self.start_fails:
            return CommandResult(1, "", f"Job for {name} failed.\n", 0.0)
        self.units[name] = (True, enabled)
        return CommandResult(0, "", "", 0.0)


def _host_fleet(shell: _FakeHostShell, become: bool) -> Any:
    import contextlib

    from provisioner.migapply.fleet import MigFleet

    fleet = MigFleet.__new__(MigFleet)

    @contextlib.contextmanager
    def session(name: str) -> Any:
        assert name == "gpu1"
        try:
            yield shell, (["sudo", "-n", "--"] if become else [])
        finally:
            shell.closed = True

    fleet._session = session  # type: ignore[method-assign]
    return fleet


def test_only_enabled_services_that_are_not_running_are_started() -> None:
    shell = _FakeHostShell(
        {
            "kubelet.service": (False, True),  # stopped by the manager: started
            "nvidia-persistenced.service": (True, True),  # running: left alone
            "dcgm.service": (False, False),  # disabled: left alone
        }
    )
    fleet = _host_fleet(shell, become=True)
    services = ("kubelet.service", "nvidia-persistenced.service", "dcgm.service", "--now", "x;reboot.service")
    assert fleet.start_stopped_services("gpu1", services) == ["kubelet.service"]
    starts = [c for c in shell.commands if "start" in c]
    assert starts == [["sudo", "-n", "--", "systemctl", "start", "--", "kubelet.service"]]
    # Names that are not plain unit names never reach the host.
    assert not [c for c in shell.commands if c[-1] in ("--now", "x;reboot.service")]
    assert shell.closed


def test_a_start_that_fails_is_a_step_failure_naming_the_unit() -> None:
    shell = _FakeHostShell({"kubelet.service": (False, True)}, start_fails=True)
    with pytest.raises(StepFailed, match=r"systemctl start kubelet.service: Job for kubelet.service failed"):
        _host_fleet(shell, become=False).start_stopped_services("gpu1", ("kubelet.service",))
    assert shell.closed
