"""`gpuprov reset` on the session lab, through the real CLI, held to the hosts' own state as the session
read it before gpuprov first ran (tests/integration/conftest.py), not to reset's own ledger.

In this order: `reset --only gpu_operator` takes the operator out of the cluster and helm off cp1,
nothing else → `--check` on gpu1 lists what would go (packages, holds, files with their diffs) and
changes nothing → reset of gpu1 (drained and deleted from the cluster, then every stage in reverse):
exactly the packages, holds, apt sources, keyrings and engine files it had before (daemon.json and
containerd's config.toml as another tool left them, which gpuprov merged into), and none of the stack's
directories that were not there → a second reset changes nothing → one bootstrap of the whole fleet
brings both back: the operator on cp1, every stage on gpu1, on the other hosts no stage but the
kubernetes one (their routes to gpu1's new pod network); verify passes everywhere. The fleet ends as
the default settings make it, for the next phase. (One bootstrap serves both round trips: each costs
minutes of the suite's budget.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from labkit import Lab, gpuprov, host_state

pytestmark = pytest.mark.lab
LAB_PHASE = "reset"  # see tests/conftest.py

WORKER = "gpu1"  # has the engine settings another tool left (FOREIGN_* in conftest.py)
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"


def run(lab: Lab, verb: str, *args: str, timeout: float = 1800) -> tuple[int, dict[str, Any], str]:
    res = gpuprov(verb, "-i", str(lab.inventory), "--format", "json", *args, timeout=timeout)
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"{verb} printed no JSON (rc {res.returncode}):\n{res.stderr[-4000:]}")
    return res.returncode, doc, res.stderr


def by_host(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in doc["hosts"]}


def kubectl(lab: Lab, command: str) -> Any:
    res = lab.ssh("cp1", f"{KUBECTL} {command} -o json")
    assert res.returncode == 0, f"kubectl {command}: {res.stderr}"
    return json.loads(res.stdout)


def changed_stages(doc: dict[str, Any]) -> dict[str, list[str]]:
    return {
        h["host"]: sorted(s for s, state in h["stages"].items() if state == "changed") for h in doc["hosts"]
    }


def bootstrap_all(lab: Lab) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A bootstrap of the whole fleet: every host done and verified clean."""
    rc, doc, err = run(lab, "bootstrap", "--yes", timeout=3600)
    assert rc == 0, f"{[h for h in doc['hosts'] if h['status'] != 'done']}\n{err[-4000:]}"
    for h in doc["hosts"]:
        assert h["status"] == "done" and h["verify"] is not None, h  # verified, nothing found
    return doc, changed_stages(doc)


@pytest.fixture(scope="module")
def fleet(bootstrapped) -> Any:
    return bootstrapped


def test_reset_of_the_operator_alone_leaves_the_rest(fleet) -> None:
    lab: Lab = fleet.lab
    others = {h: host_state(lab, h) for h in lab.hosts if h not in ("cp1", WORKER)}
    rc, doc, err = run(lab, "reset", "--only", "gpu_operator", "--yes")
    assert rc == 0, f"{doc}\n{err[-4000:]}"
    assert set(by_host(doc)["cp1"]["stages"]) == {"Facts", "gpu_operator", "proof"}
    namespaces = {n["metadata"]["name"] for n in kubectl(lab, "get namespaces")["items"]}
    assert "gpu-operator" not in namespaces
    for node in kubectl(lab, "get nodes")["items"]:
        left = [k for k in node["metadata"].get("labels", {}) if k.startswith("nvidia.com/")]
        assert left == [], (node["metadata"]["name"], left)
    assert lab.ssh("cp1", "command -v helm").returncode != 0
    cp1 = host_state(lab, "cp1")
    assert "kubeadm" in cp1.packages and "/etc/kubernetes" in cp1.dirs  # Kubernetes stays
    assert {h: s.differences(host_state(lab, h)) for h, s in others.items()} == {h: [] for h in others}


def test_check_lists_what_would_go_and_changes_nothing(fleet) -> None:
    lab: Lab = fleet.lab
    before = host_state(lab, WORKER)
    rc, doc, err = run(lab, "reset", "--limit", WORKER, "--check")
    assert rc == 0, f"{doc}\n{err[-3000:]}"
    changes = doc["changes"][WORKER]
    tasks = {(c["stage"], c["task"]) for c in changes}
    assert ("kubernetes", "Purge the packages the stage installed") in tasks, changes
    purge = next(c for c in changes if c["task"].startswith("Purge") and c["stage"] == "kubernetes")
    assert "kubeadm" in purge["diff"] and "kubelet" in purge["diff"]
    # containerd's configuration goes back to what it was before the stage, shown as a diff.
    restore = [c for c in changes if c["task"] == "Put back the files as they were before the stage"]
    assert any("/etc/containerd/config.toml" in c["diff"] for c in restore), restore
    # The stages below come after the later ones in the same run: predicted, with their packages named.
    assert any(c["stage"] == "nvidia_driver" and "nvidia-smi" in c["diff"] for c in changes), changes
    assert host_state(lab, WORKER).differences(before) == []
    node = kubectl(lab, f"get node {WORKER}")
    assert not node["spec"].get("unschedulable")


def test_reset_takes_the_worker_back_to_how_it_was(fleet) -> None:
    lab: Lab = fleet.lab
    rc, doc, err = run(lab, "reset", "--limit", WORKER, "--yes")
    host = by_host(doc)[WORKER]
    assert rc == 0 and host["status"] == "done", f"{host}\n{err[-4000:]}"
    assert set(host["stages"]) >= {"kubernetes", "nvidia_container_toolkit", "docker", "nvidia_driver"}
    after = host_state(lab, WORKER)
    assert fleet.before[WORKER].differences(after) == []
    assert WORKER in fleet.foreign_hosts and "/etc/docker/daemon.json" in after.files  # the site's, back
    nodes = {n["metadata"]["name"] for n in kubectl(lab, "get nodes")["items"]}
    assert WORKER not in nodes and "cp1" in nodes
    assert json.loads((Path(doc["record"]) / "summary.json").read_text())["verb"] == "reset"


def test_a_second_reset_changes_nothing(fleet) -> None:
    lab: Lab = fleet.lab
    rc, doc, err = run(lab, "reset", "--limit", WORKER, "--yes")
    host = by_host(doc)[WORKER]
    assert rc == 0 and host["status"] == "done", f"{host}\n{err[-3000:]}"
    assert host["changed"] == 0, host
    assert fleet.before[WORKER].differences(host_state(lab, WORKER)) == []


def test_a_bootstrap_brings_the_operator_and_the_worker_back_and_verify_passes(fleet) -> None:
    lab: Lab = fleet.lab
    _doc, changed = bootstrap_all(lab)
    # gpu1 joins as a new node with a pod network of its own: every other node's routes to its pods
    # change (the kubernetes stage), and cp1 labels it; nothing else changes there but the operator.
    assert "gpu_operator" in changed["cp1"] and set(changed["cp1"]) <= {"gpu_operator", "kubernetes"}, changed
    assert {"nvidia_driver", "docker", "kubernetes"} <= set(changed[WORKER]), changed
    for name in lab.hosts:
        if name not in ("cp1", WORKER):
            assert set(changed[name]) <= {"kubernetes"}, (name, changed)
    namespaces = {n["metadata"]["name"] for n in kubectl(lab, "get namespaces")["items"]}
    assert "gpu-operator" in namespaces
    node = kubectl(lab, f"get node {WORKER}")
    assert int(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) > 0
