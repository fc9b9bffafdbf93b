"""`gpuprov bootstrap` of the 3-host lab: every stage, idempotent, a working GPU Kubernetes cluster."""

from __future__ import annotations

import json

import pytest

from provisioner.stages import STAGE_NAMES

pytestmark = pytest.mark.lab
LAB_PHASE = "bootstrapped"  # see tests/conftest.py


def test_first_run_provisions_every_stage_on_every_host(bootstrapped) -> None:
    run = bootstrapped.first
    assert run.rc == 0
    assert run.summary["stages"] == [*STAGE_NAMES, "verify"]
    for name, spec in bootstrapped.lab.hosts.items():
        host = run.host(name)
        assert host["status"] == "done", host
        assert host["failed"] == 0 and host["unreachable"] == 0
        assert host["changed"] > 0, f"{name}: a bare host must change"
        assert host["verify"] in ("pass", "skip"), host.get("verify_failures")
        expected = {"preflight", "docker", "kubernetes"} | (
            {"nvidia_driver", "cuda_toolkit", "nvidia_container_toolkit"} if spec.gpu_count else set()
        )
        assert expected <= set(host["stages"]), (name, host["stages"])


def test_second_run_changes_nothing(bootstrapped) -> None:
    run = bootstrapped.second
    assert run.rc == 0, run.summary
    changed = {h["host"]: h["changed"] for h in run.summary["hosts"]}
    assert changed == dict.fromkeys(bootstrapped.lab.hosts, 0)


def test_run_record_holds_events_stats_summary(bootstrapped) -> None:
    from pathlib import Path

    record = Path(bootstrapped.second.summary["record"])
    assert json.loads((record / "summary.json").read_text())["hosts"]
    assert set(json.loads((record / "stats.json").read_text())) == set(bootstrapped.lab.hosts)
    assert list(record.glob("runner/artifacts/*/job_events/*.json"))


def test_nodes_ready_with_every_gpu_allocatable(bootstrapped) -> None:
    lab = bootstrapped.lab
    res = lab.ssh("cp1", "kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json")
    assert res.returncode == 0, res.stderr
    nodes = {n["metadata"]["name"]: n for n in json.loads(res.stdout)["items"]}
    assert set(nodes) == set(lab.hosts)
    for name, spec in lab.hosts.items():
        node = nodes[name]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", (name, node["status"]["conditions"])
        allocatable = int(node["status"]["allocatable"].get("nvidia.com/gpu", "0"))
        assert allocatable == spec.gpu_count, (name, node["status"]["allocatable"])
