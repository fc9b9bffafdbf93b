"""`gpuprov lab fault`: each GPU fault injected is a new event (an id of its own), a host fault a
condition; `drain-block` is a pod on the host's node that a PodDisruptionBudget keeps, made through the
cluster's API; the command returns once it runs (or is gone, after clear), since a drain started before
that would not be blocked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpuprov_lab import faults
from gpuprov_lab.errors import LabError
from gpuprov_lab.plan import PlannedHost
from gpuprov_lab.state import LabState


def _lab() -> LabState:
    return LabState(
        name="t", subnet="10.9.0.0/24", gateway="10.9.0.1", mirror_port=1,
        hosts=[PlannedHost("cp1", 1, "10.9.0.11", "cpu", 0), PlannedHost("gpu1", 2, "10.9.0.12", "h200", 1)],
    )  # fmt: skip


def _pod(ready: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"gpuprov.lab/fault": "drain-block"}},
        "spec": {"nodeName": "gpu1"},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def test_the_blocking_pod_is_pinned_to_the_node_and_its_budget_allows_no_eviction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(faults, "read_faults", lambda lp, host: [{"kind": "drain-block"}])
    docs = json.loads(faults._drain_block_objects(_lab(), "gpu1"))["items"]
    assert [d["kind"] for d in docs] == ["Namespace", "Pod", "PodDisruptionBudget"]
    ns, pod, pdb = docs
    assert ns["metadata"]["name"] == faults.DRAIN_BLOCK_NS == pod["metadata"]["namespace"]
    assert pod["spec"]["nodeName"] == "gpu1"
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": pod["metadata"]["labels"]}}
    assert pod["metadata"]["labels"]["gpuprov.lab/fault"] == "drain-block"
    # On clear the pod and its budget go; the namespace stays for other hosts' faults.
    monkeypatch.setattr(faults, "read_faults", lambda lp, host: [])
    assert [d["kind"] for d in json.loads(faults._drain_block_objects(_lab(), "gpu1"))["items"]] == [
        "Pod",
        "PodDisruptionBudget",
    ]


class ControlPlane:
    """What the control plane answers, one list per poll (the last one repeats); counts the polls."""

    def __init__(self) -> None:
        self.answers: list[list[dict[str, Any]] | None] = []
        self.polls = 0

    def __call__(self, st: LabState, host: str) -> list[dict[str, Any]] | None:
        self.polls += 1
        return self.answers[min(self.polls, len(self.answers)) - 1]


@pytest.fixture
def cp(monkeypatch: pytest.MonkeyPatch) -> ControlPlane:
    fake = ControlPlane()
    monkeypatch.setattr(faults, "_blocking_pods", fake)
    monkeypatch.setattr(faults.time, "sleep", lambda _: None)
    return fake


def test_waits_until_the_protected_pod_is_ready(cp: ControlPlane) -> None:
    cp.answers += [[], [_pod("False")], [_pod("True")]]
    faults.wait_drain_block(_lab(), "gpu1", blocked=True, timeout=60)
    assert cp.polls == 3


def test_clear_waits_until_the_pod_is_gone(cp: ControlPlane) -> None:
    cp.answers += [[_pod("True")], [_pod("True")], []]
    faults.wait_drain_block(_lab(), "gpu1", blocked=False, timeout=60)
    assert cp.polls == 3


def test_no_cluster_means_nothing_to_wait_for(cp: ControlPlane) -> None:
    cp.answers += [None]
    faults.wait_drain_block(_lab(), "gpu1", blocked=True, timeout=60)
    assert cp.polls == 1


def test_a_fault_that_never_takes_effect_is_an_error_naming_the_host(cp: ControlPlane) -> None:
    cp.answers += [[_pod("False")]]
    with pytest.raises(LabError, match=r"gpu1: drain-block not in force after 0s"):
        faults.wait_drain_block(_lab(), "gpu1", blocked=True, timeout=0)


def test_lab_fault_makes_each_gpu_fault_a_new_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpuprov lab fault` keeps its interface: the entry it writes gains an id, a new one each time."""
    monkeypatch.setenv("GPUPROV_LAB_STATE_ROOT", str(tmp_path))
    lab = _lab()
    monkeypatch.setattr(faults.state, "require", lambda name: lab)
    first = faults.inject("t", "gpu1", "xid", xid=48)
    assert [faults.describe(f) for f in first] == ["xid(gpu=0,xid=48)"]
    again = faults.inject("t", "gpu1", "xid", xid=48)
    assert [faults.describe(f) for f in again] == ["xid(gpu=0,xid=48)"] and again[0]["id"] != first[0]["id"]
    assert faults.read_faults(lab.paths, "gpu1") == again
    assert faults.inject("t", "gpu1", "mig-fail") == [*again, {"kind": "mig-fail"}]
    assert faults.inject("t", "gpu1", "mig-fail") == [*again, {"kind": "mig-fail"}]
    assert faults.inject("t", "gpu1", "clear") == [] == faults.read_faults(lab.paths, "gpu1")


def test_host_faults_stay_conditions() -> None:
    assert faults.with_fault([{"kind": "mig-fail"}], {"kind": "mig-fail"}) == [{"kind": "mig-fail"}]
    both = faults.with_fault(
        [{"kind": "xid", "gpu": 0, "xid": 79, "id": "x"}], {"kind": "xid", "gpu": 0, "xid": 48}
    )
    assert [(f["xid"], "id" in f) for f in both] == [(79, True), (48, True)]
