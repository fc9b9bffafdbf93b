"""Replays the snapshot `gpuprov snapshot --local` wrote on the real H200 host (docs/real-h200.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import verify_fixtures as vf

from provisioner.policy import Policy
from provisioner.verification import verify_snapshot

SNAPSHOT = Path(__file__).resolve().parent.parent / "fixtures" / "snapshots" / "h200-device"

# What the live `gpuprov verify --local` printed on that host (docs/real-h200.md), check by check, and
# the checks added since (Kubernetes', the DCGM exporter's) skipped there as they would have been: the
# statuses of a healthy host without a policy.
EXPECTED = vf.HEALTHY_WITHOUT_POLICY


def test_replay_matches_the_live_run() -> None:
    report = verify_snapshot(SNAPSHOT)
    (host,) = report.hosts
    assert host.host == "vm"
    assert {cid: host.status_of(cid) for cid in EXPECTED} == EXPECTED
    assert report.exit_code() == 0


@pytest.mark.parametrize(
    ("expected", "status"),
    [("580", "pass"), ("580.159.04", "pass"), ("570", "fail"), ("580.95.05", "fail")],
)
def test_driver_version_policy_on_the_real_capture(expected: str, status: str) -> None:
    policy = Policy(path=None, base={"driver.version": expected, "cuda.version": "13.0"})
    (host,) = verify_snapshot(SNAPSHOT, policy).hosts
    assert host.status_of("driver.version") == status
    assert host.status_of("cuda.version") == "pass"


def test_holds_policy_on_the_real_capture() -> None:
    policy = Policy(path=None, base={"packages.held": ["libnccl2", "cuda-nvcc-13-0"]})
    (host,) = verify_snapshot(SNAPSHOT, policy).hosts
    # libnccl2 is held there, cuda-nvcc-13-0 is installed but not held
    assert host.status_of("packages.held") == "fail"
    detail = " ".join(f.detail for f in host.findings if f.id == "packages.held")
    assert "cuda-nvcc-13-0" in detail


H100_SNAPSHOT = SNAPSHOT.parent / "h100-device"


def test_the_real_h100_replays_as_it_verified_live() -> None:
    """The same read-only run on a real H100 80GB HBM3 host (docs/real-h200.md): the live
    `verify --local` gave these results, and its snapshot replays to the same."""
    (host,) = verify_snapshot(H100_SNAPSHOT).hosts
    assert host.host == "vm"
    assert {cid: host.status_of(cid) for cid in EXPECTED} == EXPECTED
    present = next(f for f in host.findings if f.id == "gpu.present")
    assert "10de:2330" in present.detail
