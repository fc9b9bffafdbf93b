"""The lab's MIG manager (lab/gpuprov_lab/sim/kube_mig.py) and the device plugin's advertised resources
(kube_deviceplugin.py) in an in-process cluster: the real GPU Operator v26.7.0 chart and assets, an
H200 node (1 GPU) and an H100 node (8 GPUs) whose nvidia-smi is kube_testing's MIG fake. The pure parts
(config choice, resources, labels) are checked against the rules of NVIDIA's sources first."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gpuprov_lab.sim import kube, kube_mig
from gpuprov_lab.sim import kube_deviceplugin as dp
from gpuprov_lab.sim import kube_testing as kt

NS = "gpu-operator"
TS4 = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
TS2 = TS4.replace("replicas: 4", "replicas: 2")
BAD = TS4.replace("replicas: 4", "replicas: 1")


# ------------------------------------------------------------------------------------ pure rules
def _gpu(i: int, mig: tuple[str, ...] = (), enabled: bool = False) -> dp.Gpu:
    return dp.Gpu(i, "NVIDIA H100 80GB HBM3", "81559", True, enabled, mig)


def test_mixed_single_and_none_advertise_what_the_real_plugin_does() -> None:
    cfg = dp.parse_config("")
    balanced = [_gpu(i, ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"), True) for i in range(8)]
    assert dp.advertised(cfg, "mixed", balanced) == {
        "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 8,
        "nvidia.com/mig-3g.40gb": 8,
    }
    assert dp.advertised(cfg, "none", balanced) == {"nvidia.com/gpu": 8}
    with pytest.raises(dp.PluginError, match="invalid MIG configuration: more than one MIG device type"):
        dp.advertised(cfg, "single", balanced)
    uniform = [_gpu(0, ("1g.10gb",) * 7, True)]
    assert dp.advertised(cfg, "single", uniform) == {"nvidia.com/gpu": 7}
    with pytest.raises(dp.PluginError, match="same migEnabled value"):
        dp.advertised(cfg, "single", [*uniform, _gpu(1)])
    assert dp.advertised(cfg, "mixed", [*uniform, _gpu(1)]) == {
        "nvidia.com/mig-1g.10gb": 7,
        "nvidia.com/gpu": 1,
    }


def test_sharing_config_replicas_rename_and_errors() -> None:
    gpus = [_gpu(0), _gpu(1)]
    assert dp.advertised(dp.parse_config(TS4), "none", gpus) == {"nvidia.com/gpu": 8}
    renamed = dp.parse_config(TS4.replace("timeSlicing:", "timeSlicing:\n    renameByDefault: true"))
    assert dp.advertised(renamed, "none", gpus) == {"nvidia.com/gpu.shared": 8}
    mps = dp.parse_config(TS4.replace("timeSlicing", "mps"))
    assert mps.strategy == "mps"
    with pytest.raises(dp.PluginError, match="mixed is not supported with MPS"):
        dp.advertised(mps, "mixed", gpus)
    with pytest.raises(
        dp.PluginError, match=r"unable to parse config file: .*number of replicas must be >= 2"
    ):
        dp.parse_config(BAD)
    with pytest.raises(dp.PluginError, match="unknown version: v2"):
        dp.parse_config("version: v2\n")
    labels = dp.gfd_labels(dp.parse_config(TS4), "none", gpus)
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert "nvidia.com/mig.strategy" not in labels


def test_config_manager_picks_label_then_default_then_nothing() -> None:
    keys = ["a", "b"]
    assert dp.select_config("b", keys, "a") == "b"
    assert dp.select_config("", keys, "a") == "a"
    assert dp.select_config("", keys, "") == ""
    with pytest.raises(dp.PluginError, match="specified config c does not exist"):
        dp.select_config("c", keys, "a")


def test_mig_labels_under_mixed_and_an_invalid_single() -> None:
    gpus = [_gpu(0, ("1g.10gb",) * 7, True)]
    mixed = dp.gfd_labels(dp.parse_config(""), "mixed", gpus)
    assert mixed["nvidia.com/mig.strategy"] == "mixed"
    assert mixed["nvidia.com/mig-1g.10gb.count"] == "7"
    assert mixed["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert mixed["nvidia.com/gpu.replicas"] == "0"  # a MIG-enabled GPU's full-GPU labels carry no sharing
    single = dp.gfd_labels(dp.parse_config(""), "single", [*gpus, _gpu(1)])
    assert single["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
    assert single["nvidia.com/gpu.count"] == "0"


def test_the_unknown_config_message_is_the_real_mig_parted_one(tmp_path: Path) -> None:
    """nvidia-mig-parted v0.15.0 itself, on NVIDIA's default config, against kube_mig's wording."""
    import subprocess

    import yaml
    from gpuprov_lab import vendor

    cm = yaml.safe_load(
        vendor.artifact("gpu-operator", "assets/state-mig-manager/0400_configmap.yaml").read_text()
    )
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    binary = vendor.artifact("mig-parted", "bin/nvidia-mig-parted")
    res = subprocess.run(
        [str(binary), "assert", "--valid-config", "-f", str(tmp_path / "config.yaml"), "-c", "all-9g.99gb"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 1
    assert "Error selecting MIG config: selected mig-config not present: all-9g.99gb" in res.stderr
    configs = kube_mig.parse_config(cm["data"]["config.yaml"])
    plan = kube_mig.wanted(configs["all-balanced"], {i: 0x2330 for i in range(8)})
    assert plan[7] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert kube_mig.wanted(configs["all-1g.18gb"], {0: 0x2335}) == {0: {"1g.18gb": 7}}


# ------------------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    cp: kt.SimHost
    h200: kt.SimHost
    h100: kt.SimHost

    def kubectl(self, *args: str) -> tuple[int, str, str]:
        return kt.Tool(self.cp).kubectl(*args)

    def apply(self, doc: dict) -> None:
        self.cp.write("/root/obj.json", json.dumps(doc))
        rc, _out, err = self.kubectl("apply", "-f", "/root/obj.json")
        assert rc == 0, err

    def node(self, name: str) -> dict:
        rc, out, err = self.kubectl("get", "node", name, "-o", "json")
        assert rc == 0, err
        return json.loads(out)

    def labels(self, name: str) -> dict[str, str]:
        return self.node(name)["metadata"].get("labels") or {}

    def allocatable(self, name: str) -> dict[str, str]:
        alloc = self.node(name)["status"].get("allocatable") or {}
        return {k: v for k, v in alloc.items() if k.startswith("nvidia.com/")}

    def label(self, name: str, *kv: str) -> None:
        rc, _o, err = self.kubectl("label", "node", name, "--overwrite", *kv)
        assert rc == 0, err

    def pods(self, selector: str, node: str = "") -> list[dict]:
        args = (
            ["get", "pods", "-A", "-l", selector, "-o", "json"]
            if selector
            else ["get", "pods", "-A", "-o", "json"]
        )
        if node:
            args += ["--field-selector", f"spec.nodeName={node}"]
        rc, out, err = self.kubectl(*args)
        assert rc == 0, err
        return json.loads(out)["items"]

    def mig_log(self, host: kt.SimHost) -> str:
        return "".join(host.read(p, "") or "" for p in host.glob("/var/log/pods/*/nvidia-mig-manager/0.log"))


def _plugin_config_map() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "plugin-config", "namespace": NS},
        "data": {"ts4": TS4, "bad": BAD},
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("mig")
    mirror = root / "mirror"
    for rel, data in kube.extra_mirror_files().items():
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).write_bytes(data)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mirror))
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cp = kt.make_node(root / "cp1", "cp1")
    h200 = kt.make_node(root / "h200", "h200", gpus=1)
    h100 = kt.make_node(root / "h100", "h100", gpus=8)
    h100.gpus = ["NVIDIA H100 80GB HBM3"] * 8
    for g in (h200, h100):
        g.write("/etc/containerd/config.toml", kt.CONTAINERD_OK + kt.NVIDIA_RUNTIME)
        g.commands["systemctl"] = _with_gpu_clients(g)
    nodes = (cp, h200, h100)
    try:
        rc, out, err = kt.Tool(cp).kubeadm(
            "init", "--pod-network-cidr=10.244.0.0/16", f"--apiserver-bind-port={kt.free_port()}",
            "--apiserver-advertise-address=127.0.0.1",
        )  # fmt: skip
        assert rc == 0, err + out
        for g in (h200, h100):
            rc, jout, jerr = kt.Tool(g).kubeadm(*kt.join_argv(out))
            assert rc == 0, jerr + jout
        c = Cluster(cp, h200, h100)
        cp.write("/root/kube-flannel.yml", (mirror / "flannel/v0.27.4/kube-flannel.yml").read_text())
        assert c.kubectl("apply", "-f", "/root/kube-flannel.yml")[0] == 0
        c.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        c.apply(_plugin_config_map())
        values = {
            "driver": {"enabled": False},
            "toolkit": {"enabled": False},
            "cdi": {"enabled": False},
            "operator": {"upgradeCRD": False},
            "mig": {"strategy": "mixed"},
            "devicePlugin": {"config": {"name": "plugin-config", "default": ""}},
        }
        cp.write("/root/values.json", json.dumps(values))
        rc, _out, err = kt.Tool(cp).helm(
            "upgrade", "--install", "gpu-operator", "gpu-operator", "--repo", f"http://127.0.0.1:{srv.server_address[1]}/helm-charts/nvidia",
            "--version", "v26.7.0", "--namespace", NS, "--values", "/root/values.json",
        )  # fmt: skip
        assert rc == 0, err
        for name in ("h200", "h100"):
            kt.wait_for(lambda name=name: c.labels(name).get(kube_mig.STATE_LABEL) == "success", 150)
        kt.wait_for(lambda: c.allocatable("h100").get("nvidia.com/gpu") == "8", 60)
        yield c
    finally:
        kube_mig.stop_all()
        for n in nodes:
            n.services.shutdown()  # type: ignore[union-attr]
        srv.shutdown()
        srv.server_close()
        shutil.rmtree(root, ignore_errors=True)


def _with_gpu_clients(host: kt.SimHost):  # type: ignore[no-untyped-def]
    """systemctl that also knows one host GPU client, nvidia-dcgm.service (in NVIDIA's default list)."""
    base = host.services.systemctl  # type: ignore[union-attr]
    state = {"nvidia-dcgm": True}
    host.dcgm_log = []  # type: ignore[attr-defined]

    def systemctl(args: list[str]) -> tuple[int, str, str]:
        units = [a.removesuffix(".service") for a in args[1:] if not a.startswith("-")]
        if units == ["nvidia-dcgm"]:
            host.dcgm_log.append(args[0])  # type: ignore[attr-defined]
            if args[0] == "is-active":
                return (0, "active\n", "") if state["nvidia-dcgm"] else (3, "inactive\n", "")
            state["nvidia-dcgm"] = args[0] in ("start", "restart")
            return 0, "", ""
        return base(args)

    return systemctl


@pytest.mark.slow
def test_h200_all_1g_18gb_pauses_the_operands_then_advertises_seven_mig_devices(cluster: Cluster) -> None:
    c = cluster
    seen: set[str] = set()
    c.label("h200", "nvidia.com/mig.config=all-1g.18gb")

    def watch() -> bool:
        labels = c.labels("h200")
        seen.add(labels.get(kube_mig.STATE_LABEL, ""))
        if labels.get("nvidia.com/gpu.deploy.device-plugin") == kube_mig.PAUSED:
            seen.add("paused")
        return labels.get(kube_mig.STATE_LABEL) == "success" and "pending" in seen

    kt.wait_for(watch, 90, 0.1)
    assert "paused" in seen
    labels = c.labels("h200")
    for key in kube_mig.OPERAND_LABELS:
        assert labels[key] == "true", key
    assert c.h200.mig.mode == {0: True} and c.h200.mig.instances[0] == ["1g.18gb"] * 7
    assert ["-i", "0", "-mig", "1"] in c.h200.mig.calls
    assert c.h200.dcgm_log.count("stop") == 1 and c.h200.dcgm_log.count("start") == 1  # type: ignore[attr-defined]
    kt.wait_for(lambda: c.allocatable("h200").get("nvidia.com/mig-1g.18gb") == "7", 60)
    assert c.allocatable("h200").get("nvidia.com/gpu", "0") == "0"
    kt.wait_for(lambda: c.labels("h200").get("nvidia.com/mig-1g.18gb.count") == "7", 60)
    assert c.labels("h200")["nvidia.com/mig.strategy"] == "mixed"
    log = c.mig_log(c.h200)
    assert (
        "Waiting for device-plugin to shutdown" in log
        and "Successfully updated to MIG config: all-1g.18gb" in log
    )
    # The same value again: the manager's informer sees no change, nothing runs.
    calls = len(c.h200.mig.calls)
    c.label("h200", f"{kube_mig.STATE_LABEL}=touched")
    c.label("h200", "nvidia.com/mig.config=all-1g.18gb")
    time.sleep(3)
    assert c.labels("h200")[kube_mig.STATE_LABEL] == "touched"
    assert not [x for x in c.h200.mig.calls[calls:] if "-mig" in x or "-cgi" in x]
    c.label("h200", f"{kube_mig.STATE_LABEL}=success")


@pytest.mark.slow
def test_h100_failure_then_all_balanced_mixed(cluster: Cluster) -> None:
    c = cluster
    c.h100.mig.fail_mode_change = "In use by another client"
    c.label("h100", "nvidia.com/mig.config=all-balanced")
    kt.wait_for(lambda: c.labels("h100").get(kube_mig.STATE_LABEL) == "failed", 90)
    labels = c.labels("h100")
    # The manager's first run in its process: setState(failed) re-enables the operands.
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert "In use by another client" in c.mig_log(c.h100)
    c.h100.mig.fail_mode_change = ""
    c.label("h100", "nvidia.com/mig.config=all-disabled")
    kt.wait_for(lambda: c.labels("h100").get(kube_mig.STATE_LABEL) == "success", 60)
    c.label("h100", "nvidia.com/mig.config=all-balanced")
    want = {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}
    kt.wait_for(lambda: all(c.allocatable("h100").get(k) == v for k, v in want.items()), 120)
    assert c.labels("h100")[kube_mig.STATE_LABEL] == "success"
    # An unknown name: failed, with mig-parted's message in the manager's log.
    c.label("h100", "nvidia.com/mig.config=all-9g.99gb")
    kt.wait_for(lambda: c.labels("h100").get(kube_mig.STATE_LABEL) == "failed", 60)
    assert "selected mig-config not present: all-9g.99gb" in c.mig_log(c.h100)


def _gpu_pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "h200"},
            "runtimeClassName": "nvidia",  # the nvidia runtime reads NVIDIA_VISIBLE_DEVICES: it runs
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ],
        },
    }


@pytest.mark.slow
def test_time_slicing_replicas_and_the_scheduler(cluster: Cluster) -> None:
    c = cluster
    c.label("h200", "nvidia.com/mig.config=all-disabled")
    kt.wait_for(lambda: c.allocatable("h200").get("nvidia.com/gpu") == "1", 90)
    c.label("h200", "nvidia.com/device-plugin.config=ts4")
    kt.wait_for(lambda: c.allocatable("h200").get("nvidia.com/gpu") == "4", 60)
    kt.wait_for(lambda: c.labels("h200").get("nvidia.com/gpu.replicas") == "4", 60)
    assert c.labels("h200")["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert c.labels("h200")["nvidia.com/gpu.product"].endswith("-SHARED")
    # The GPU the lab's workload containers get (kube_gpu reads the host's GPU profile).
    c.h200.write("/etc/gpuprov-lab/profile.json", json.dumps({"gpus": [{"index": 0, "minor_number": 0}]}))
    for i in range(5):
        c.apply(_gpu_pod(f"shared-{i}"))

    def placed() -> list[dict]:
        pods = [p for p in c.pods("") if p["metadata"]["name"].startswith("shared-")]
        return pods if len(pods) == 5 and sum(1 for p in pods if p["spec"].get("nodeName")) == 4 else []

    pods = kt.wait_for(placed, 30)
    kt.wait_for(lambda: sum(p["status"].get("phase") == "Running" for p in placed()) == 4, 30)
    assert len(placed()) == 5  # running pods keep their GPUs: the fifth stays unscheduled
    pending = next(p for p in pods if not p["spec"].get("nodeName"))
    msg = kt.wait_for(
        lambda: next(
            (
                x.get("message", "")
                for p in c.pods("")
                if p["metadata"]["name"] == pending["metadata"]["name"]
                for x in p["status"].get("conditions") or []
                if x.get("type") == "PodScheduled"
            ),
            "",
        ),
        20,
    )
    assert "Insufficient nvidia.com/gpu" in msg
    # The ConfigMap's content changes: the running plugin keeps what it read...
    cm = _plugin_config_map()
    cm["data"]["ts4"] = TS2
    c.apply(cm)
    time.sleep(3)
    assert c.allocatable("h200")["nvidia.com/gpu"] == "4"
    # ...until its pod is recreated.
    plugin = c.pods("app=nvidia-device-plugin-daemonset", "h200")[0]
    assert c.kubectl("delete", "pod", "-n", NS, plugin["metadata"]["name"])[0] == 0
    kt.wait_for(lambda: c.allocatable("h200").get("nvidia.com/gpu") == "2", 60)
    # An invalid config: the plugin exits with its real error.
    c.label("h200", "nvidia.com/device-plugin.config=bad")
    kt.wait_for(
        lambda: (
            "number of replicas must be >= 2"
            in json.dumps([p["status"] for p in c.pods("app=nvidia-device-plugin-daemonset", "h200")])
        ),
        60,
    )
    kt.wait_for(lambda: c.allocatable("h200").get("nvidia.com/gpu") == "0", 30)
