"""Day-2 operations on the bootstrapped session lab, through the real CLI and the real cluster: MIG
layouts, GPU sharing, tenants and monitoring.

The lab's GPU hosts are gpu1 (1x H200, 0x2335), gpu2 (8x H100 80GB, 0x2330) and gpu3 (4x A100 80GB). A copy
of the lab's inventory declares the mixed MIG strategy, time-slicing ×4 on gpu3 and a tenant with a quota
of 2 GPUs. Then, in order: the gpu_operator and gpu_tenants stages deliver the settings → `mig apply`
drives the real MIG manager through its label protocol (the layout lands on the GPUs; the device
plugin cannot follow it, see below), a MIG-manager failure leaves the node cordoned with its operands
back, and `--resume` brings it back → time-slicing: the real device plugin advertises 4 × GPUs and the
real scheduler leaves one pod more than that Pending → the real API server refuses a tenant over its
quota → without an exporter the monitoring check skips, and fails under a policy that wants one. The
module leaves MIG disabled, sharing off and every node schedulable.

Real: gpuprov, Ansible, helm, Kubernetes (API server, scheduler, kubelets, admission), NVIDIA's chart, the
operator, the device plugin, GPU feature discovery and the MIG manager. Simulated: the GPUs' MIG state
(the MIG manager's nvidia-mig-parted is the lab's front end on the host). NVIDIA's mock NVML has no MIG
devices, so the device plugin never advertises MIG resources here: `mig apply`'s check of them fails
in the lab, which the first test shows, and its success path is tested with fakes (test_mig_apply.py).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuprov_lab import vendor
from labkit import Lab, gpuprov

pytestmark = pytest.mark.lab
LAB_PHASE = "day2"  # see tests/conftest.py
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
TS4 = {
    "version": "v1",
    "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
}
TENANT = {"name": "team-a", "gpus": 2, "max_gpus_per_pod": 2}


@dataclass
class Day2:
    lab: Lab
    inventory: Path
    home: Path

    def run(self, *args: str, timeout: float = 1800) -> tuple[int, str, str]:
        # The controller's nvidia-mig-parted: NVIDIA's own, built from source (the vendor artifacts).
        tool = vendor.artifact("mig-parted", "bin/nvidia-mig-parted")
        env = {"GPUPROV_HOME": str(self.home), "GPUPROV_MIG_PARTED": str(tool)}
        res = gpuprov(*args, timeout=timeout, env=env)
        return res.returncode, res.stdout, res.stderr

    def mig_apply(self, *args: str) -> tuple[int, dict[str, Any], str]:
        rc, out, err = self.run("mig", "apply", "-i", str(self.inventory), "--format", "json", *args)
        try:
            summary = json.loads(out) if out.strip() else {}
        except ValueError:
            pytest.fail(f"mig apply printed no JSON (rc {rc}):\n{out[-2000:]}\n{err[-3000:]}")
        return rc, summary, err

    def kubectl(self, command: str, check: bool = True) -> str:
        res = self.lab.ssh("cp1", f"{KUBECTL} {command}")
        if check:
            assert res.returncode == 0, f"kubectl {command}: {res.stderr}"
        return res.stdout + res.stderr

    def node(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl(f"get node {name} -o json"))

    def allocatable(self, name: str) -> dict[str, str]:
        alloc = self.node(name)["status"].get("allocatable") or {}
        return {k: v for k, v in alloc.items() if k.startswith("nvidia.com/")}

    def wait_allocatable(self, name: str, want: dict[str, str], timeout: float = 180) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            got = self.allocatable(name)
            if all(got.get(k) == v for k, v in want.items()):
                return got
            if time.monotonic() > deadline:
                pytest.fail(f"{name} advertises {got}, expected {want}")
            time.sleep(3)

    def set_vars(self, group: str, **values: Any) -> None:
        path = self.inventory.parent / "group_vars" / f"{group}.yml"
        doc = yaml.safe_load(path.read_text()) if path.exists() else {}
        doc.update(values)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def set_host(self, host: str, **values: Any) -> None:
        path = self.inventory.parent / "host_vars" / f"{host}.yml"
        path.parent.mkdir(exist_ok=True)
        doc = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
        doc.update(values)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def verify(self, checks: str, *extra: str) -> tuple[int, dict[str, dict[str, Any]]]:
        rc, out, err = self.run(
            "verify", "-i", str(self.inventory), "--format", "json", "--checks", checks, *extra
        )
        assert rc in (0, 1), err
        return rc, {h["host"]: h for h in json.loads(out)["hosts"]}


def statuses(host: dict[str, Any], check_id: str) -> list[str]:
    return [c["status"] for c in host["checks"] if c["id"] == check_id]


@pytest.fixture(scope="module")
def day2(bootstrapped, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Day2]:
    lab: Lab = bootstrapped.lab
    base = tmp_path_factory.mktemp("day2")
    inv_dir = base / "inventory"
    (inv_dir / "group_vars").mkdir(parents=True)
    inventory = inv_dir / "hosts.yml"
    shutil.copyfile(lab.inventory, inventory)
    env = Day2(lab, inventory, base / "home")
    env.set_vars(
        "all",
        gpuprov_mig_strategy="mixed",
        gpuprov_gpu_sharing_profiles={"ts4": TS4},
        gpuprov_tenants=[TENANT],
    )
    env.set_host("gpu3", gpuprov_gpu_sharing="ts4")
    try:
        rc, out, err = env.run(
            "bootstrap",
            "-i",
            str(inventory),
            "--only",
            "gpu_operator,gpu_tenants",
            "--yes",
            "--format",
            "json",
        )
        assert rc == 0, f"gpu_operator/gpu_tenants stages failed:\n{out[-3000:]}\n{err[-3000:]}"
        # The layouts are declared once the strategy is set: `mig apply` rolls them node by node.
        env.set_host("gpu1", gpuprov_mig_config="all-1g.18gb")
        env.set_host("gpu2", gpuprov_mig_config="all-disabled")
        yield env
    finally:
        # Back to whole GPUs, every node schedulable, no test namespace. The operator's settings (MIG
        # strategy, sharing) stay: the phase after this one re-provisions every stage from the lab's own
        # inventory (tests/integration/test_upgrade_lab.py), which puts them back.
        for host in lab.hosts:
            lab.cli("lab", "fault", host, "clear")
        for host in ("gpu1", "gpu2"):
            env.set_host(host, gpuprov_mig_config="all-disabled")
        env.mig_apply("--batch", "2")
        for host in lab.hosts:
            lab.ssh("cp1", f"{KUBECTL} uncordon {host}")
        lab.ssh("cp1", f"{KUBECTL} delete namespace day2-ts team-a --wait=false")


def test_mig_apply_drives_the_real_mig_manager(day2: Day2) -> None:
    """The label protocol against the real API server and NVIDIA's MIG manager: the node is cordoned,
    the manager applies the layout (all-1g.18gb: seven instances on the H200), reports success, and puts
    the operands it paused back. The device plugin (on NVIDIA's mock NVML, which has no MIG devices)
    then advertises the whole GPU, not seven MIG devices: `mig apply` says so and leaves the node
    cordoned, as it would on a cluster whose device plugin did not take the layout up."""
    rc, plan, err = day2.mig_apply("--dry-run", "--batch", "2")
    assert rc == 0, err
    # gpu2's declared all-disabled is what its MIG manager already applied: only gpu1 has work to do.
    assert plan["dry_run"] and plan["batches"] == [["gpu1"]], plan
    assert day2.node("gpu1")["metadata"]["labels"].get("nvidia.com/mig.config") != "all-1g.18gb"

    # The mock NVML has no MIG devices, so the node never advertises them: 30 s is enough to say so.
    rc, summary, err = day2.mig_apply("--limit", "gpu1", "--timeout", "240", "--advertise-timeout", "30")
    assert rc == 1, f"{summary}\n{err[-3000:]}"
    host = summary["hosts"][0]
    assert host["result"] == "failed", host
    assert "nvidia.com/mig-1g.18gb=0 (expected 7)" in host["reason"], host
    node = day2.node("gpu1")
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/mig.config"] == "all-1g.18gb"
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert not {k: v for k, v in labels.items() if v == "paused-for-mig-change"}, labels
    assert node["spec"].get("unschedulable") is True
    listing = day2.lab.ssh("gpu1", "nvidia-smi -L").stdout
    assert listing.count("MIG 1g.18gb") == 7, listing

    # Back to whole GPUs: a layout the device plugin does follow, so the node is uncordoned.
    day2.set_host("gpu1", gpuprov_mig_config="all-disabled")
    rc, summary, err = day2.mig_apply("--resume", "--timeout", "240")
    assert rc == 0, f"{summary}\n{err[-3000:]}"
    day2.wait_allocatable("gpu1", {"nvidia.com/gpu": "1"})
    assert not day2.node("gpu1")["spec"].get("unschedulable")
    assert "MIG" not in day2.lab.ssh("gpu1", "nvidia-smi -L").stdout


def test_a_layout_the_gpu_cannot_hold_is_refused_before_anything(day2: Day2) -> None:
    day2.set_host("gpu1", gpuprov_mig_config="all-1g.10gb")  # an A100/H100 profile: not on an H200
    try:
        rc, _summary, err = day2.mig_apply()
        assert rc == 2, err
        assert "gpu1:" in err and "1g.10gb" in err, err
        assert not day2.node("gpu1")["spec"].get("unschedulable")
    finally:
        day2.set_host("gpu1", gpuprov_mig_config="all-disabled")


def test_mig_manager_failure_leaves_node_cordoned_with_operands_back(day2: Day2) -> None:
    """The GPUs refuse the MIG mode change (the mig-fail fault): NVIDIA's MIG manager reports failed and
    leaves the operands it paused paused (and, after an earlier success, the kubelet stopped); `mig apply`
    puts them back, starts what it stopped, keeps the node cordoned and says why. Once the fault is gone,
    `--resume` restarts the node's manager and finishes (here back to whole GPUs, which the device plugin
    follows)."""
    lab = day2.lab
    assert lab.cli("lab", "fault", "gpu1", "mig-fail").returncode == 0
    day2.set_host("gpu1", gpuprov_mig_config="all-balanced")
    try:
        rc, summary, err = day2.mig_apply("--limit", "gpu1", "--timeout", "240")
        assert rc == 1, f"{summary}\n{err[-2000:]}"
        host = summary["hosts"][0]
        assert host["result"] == "failed" and "mig.config.state=failed" in host["reason"], host
        node = day2.node("gpu1")
        labels = node["metadata"]["labels"]
        assert node["spec"].get("unschedulable") is True
        assert labels.get("nvidia.com/mig.config.state") == "failed"
        paused = {k: v for k, v in labels.items() if v == "paused-for-mig-change"}
        assert not paused, f"operand labels left paused: {paused}"
        assert labels.get("nvidia.com/gpu.deploy.device-plugin") == "true"
        assert "gpuprov.io/mig-apply" in (node["metadata"].get("annotations") or {})
        # A manager pod that has had a success leaves the host's kubelet stopped after a failure
        # (mig-parted v0.15.0): gpuprov starts it again and the node is Ready, only cordoned.
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions.get("Ready") == "True", (conditions, host["reason"])
        if "kubelet.service" in host["reason"]:
            assert "started again, node gpu1 Ready" in host["reason"], host

        assert lab.cli("lab", "fault", "gpu1", "clear").returncode == 0
        day2.set_host("gpu1", gpuprov_mig_config="all-disabled")
        rc, summary, err = day2.mig_apply("--resume", "--timeout", "240")
        assert rc == 0, f"{summary}\n{err[-2000:]}"
        day2.wait_allocatable("gpu1", {"nvidia.com/gpu": "1"})
        assert not day2.node("gpu1")["spec"].get("unschedulable")
    finally:
        lab.cli("lab", "fault", "gpu1", "clear")
        day2.set_host("gpu1", gpuprov_mig_config="all-disabled")


def test_time_slicing_multiplies_allocatable_and_the_next_pod_pends(day2: Day2) -> None:
    gpus = day2.lab.hosts["gpu3"].gpu_count
    day2.wait_allocatable("gpu3", {"nvidia.com/gpu": str(4 * gpus)})
    labels = day2.node("gpu3")["metadata"]["labels"]
    assert labels.get("nvidia.com/gpu.replicas") == "4"
    assert labels.get("nvidia.com/gpu.sharing-strategy") == "time-slicing"
    _rc, hosts = day2.verify("gpu.sharing,k8s.gpu_allocatable")
    assert statuses(hosts["gpu3"], "gpu.sharing") == ["pass"], hosts["gpu3"]
    assert statuses(hosts["gpu3"], "k8s.gpu_allocatable") == ["pass"], hosts["gpu3"]

    pods = 4 * gpus + 1
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"shared-{i}", "namespace": "day2-ts"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "gpu3"},
                "containers": [
                    {"name": "sleep", "image": day2.lab.tools_image,
                     "command": ["sleep", "3600"], "resources": {"limits": {"nvidia.com/gpu": 1}}}
                ],
            },
        }
        for i in range(pods)
    ]  # fmt: skip
    manifest = yaml.safe_dump_all(
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "day2-ts"}}, *docs]
    )
    res = day2.lab.ssh(
        "cp1", f"cat > /tmp/day2-ts.yaml <<'EOF'\n{manifest}EOF\n{KUBECTL} apply -f /tmp/day2-ts.yaml"
    )
    assert res.returncode == 0, res.stderr
    try:
        deadline = time.monotonic() + 180
        while True:
            items = json.loads(day2.kubectl("get pods -n day2-ts -o json"))["items"]
            bound = [p for p in items if p["spec"].get("nodeName")]
            pending = [p for p in items if not p["spec"].get("nodeName")]
            reasons = [
                c.get("message", "")
                for p in pending
                for c in (p.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ]
            if len(bound) == pods - 1 and len(pending) == 1 and reasons:
                break
            assert time.monotonic() < deadline, (len(bound), len(pending), reasons)
            time.sleep(3)
        assert "Insufficient nvidia.com/gpu" in reasons[0], reasons
    finally:
        day2.kubectl("delete namespace day2-ts --wait=false", check=False)


def test_a_tenant_over_its_quota_is_refused(day2: Day2) -> None:
    _rc, hosts = day2.verify("tenants.quota")
    assert statuses(hosts["cp1"], "tenants.quota") == ["pass"], hosts["cp1"]
    quota = json.loads(day2.kubectl("get resourcequota -n team-a -o json"))["items"]
    assert quota and quota[0]["spec"]["hard"]["requests.nvidia.com/gpu"] == "2", quota

    def pod(name: str, gpus: int) -> str:
        doc = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": day2.lab.tools_image, "command": ["sleep", "60"],
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        }  # fmt: skip
        res = day2.lab.ssh("cp1", f"{KUBECTL} create -f - <<'EOF'\n{json.dumps(doc)}\nEOF")
        return (res.stdout + res.stderr).strip()

    try:
        assert "created" in pod("within", 2)
        refused = pod("over", 1)
        assert "exceeded quota" in refused and "requests.nvidia.com/gpu" in refused, refused
    finally:
        day2.kubectl("delete pod -n team-a within over --ignore-not-found --wait=false", check=False)


def test_without_an_exporter_the_check_skips_and_a_policy_that_wants_one_fails(day2: Day2) -> None:
    """The lab runs no DCGM exporter (no source of it here; docs/lab.md): the check finds no exporter
    pod through the real API (with the node's own credentials) and, as nothing declares monitoring,
    skips; a policy that wants every GPU node monitored makes it fail, naming what is missing."""
    _rc, hosts = day2.verify("monitoring.dcgm_exporter")
    for host in ("gpu1", "gpu2", "gpu3"):
        assert statuses(hosts[host], "monitoring.dcgm_exporter") == ["skip"], hosts[host]
    policy = day2.inventory.parent / "monitored.yml"
    policy.write_text("groups:\n  gpu_nodes:\n    monitoring.dcgm_exporter: true\n")
    rc, hosts = day2.verify("monitoring.dcgm_exporter", "--policy", str(policy))
    assert rc == 1
    for host in ("gpu1", "gpu2", "gpu3"):
        assert statuses(hosts[host], "monitoring.dcgm_exporter") == ["fail"], hosts[host]
    detail = next(c["detail"] for c in hosts["gpu3"]["checks"] if c["id"] == "monitoring.dcgm_exporter")
    assert "exporter" in detail, detail
