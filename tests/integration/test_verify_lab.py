"""`gpuprov verify` against a bootstrapped lab: all clear, then each injected fault is reported by its
check, on that host (and GPU) only, and an unreachable host is an error without hiding the others.

Uses the session lab of tests/conftest.py (cp1, gpu1 = h200, gpu2 = h100-sxm-8), bootstrapped once for
the session by tests/integration/conftest.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from labkit import Lab, gpuprov

pytestmark = pytest.mark.lab
LAB_PHASE = "bootstrapped"  # see tests/conftest.py


@pytest.fixture(scope="module")
def ready(bootstrapped) -> Lab:
    """The session lab after the shared bootstrap (tests/integration/conftest.py)."""
    return bootstrapped.lab


def verify(lab: Lab, *extra: str) -> tuple[int, dict[str, dict[str, Any]]]:
    res = gpuprov("verify", "-i", str(lab.inventory), "--format", "json", *extra, timeout=600)
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    return res.returncode, {h["host"]: h for h in doc["hosts"]}


def not_clean(hosts: dict[str, dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: [(c["id"], c["status"], c.get("gpu"), c["detail"]) for c in h["checks"]
               if c["status"] not in ("pass", "skip")] + ([("host", h["error"])] if h.get("error") else [])
        for name, h in hosts.items()
        if h.get("error") or any(c["status"] not in ("pass", "skip") for c in h["checks"])
    }  # fmt: skip


def wait_clean(lab: Lab, timeout: float = 90) -> None:
    """The baseline before a fault: every host verifies clean. A cleared fault is undone by the lab hosts
    on their own schedule (the kubelet's next node status, for one), so give them a little time."""
    deadline = time.monotonic() + timeout
    while True:
        rc, hosts = verify(lab)
        if rc == 0:
            return
        assert time.monotonic() < deadline, f"the lab does not verify clean: {not_clean(hosts)}"
        time.sleep(3)


def findings(host: dict[str, Any], check_id: str) -> list[tuple[str, int | None]]:
    return [(c["status"], c.get("gpu")) for c in host["checks"] if c["id"] == check_id]


def test_bootstrapped_lab_verifies_clean(ready: Lab) -> None:
    rc, hosts = verify(ready)
    assert rc == 0, not_clean(hosts)
    assert set(hosts) == set(ready.hosts)
    for name, spec in ready.hosts.items():
        if spec.gpu_count:
            assert findings(hosts[name], "gpu.count") == [("pass", None)], name
            assert findings(hosts[name], "driver.loaded") == [("pass", None)], name
        else:
            assert findings(hosts[name], "gpu.present") == [("skip", None)], name


FAULTS = [
    # kind, lab fault options, check, expected status
    ("ecc", ("--gpu", "3"), "gpu.ecc", "fail"),
    ("xid", ("--gpu", "3", "--xid", "79"), "gpu.xid", "fail"),
    ("xid", ("--gpu", "3", "--xid", "13"), "gpu.xid", "warn"),
    ("pcie", ("--gpu", "3"), "gpu.pcie_link", "warn"),
    ("gpu-missing", ("--gpu", "3"), "gpu.count", "fail"),
    ("remap-pending", ("--gpu", "3"), "gpu.memory_remap", "warn"),
    ("remap-failure", ("--gpu", "3"), "gpu.memory_remap", "fail"),
]


@pytest.mark.parametrize(
    ("kind", "options", "check_id", "status"),
    FAULTS,
    ids=[f"{k}{'-' + o[-1] if k == 'xid' else ''}" for k, o, _, _ in FAULTS],
)
def test_fault_reported_by_its_check_on_that_host_only(
    ready: Lab, kind: str, options: tuple[str, ...], check_id: str, status: str
) -> None:
    target = next(n for n, h in ready.hosts.items() if h.gpu_count >= 4)
    wait_clean(ready)
    inject = ready.cli("lab", "fault", target, kind, *options)
    assert inject.returncode == 0, inject.stderr
    try:
        rc, hosts = verify(ready)
    finally:
        ready.cli("lab", "fault", target, "clear")
    assert rc == 1
    assert (status, 3) in findings(hosts[target], check_id), hosts[target]["checks"]
    for name, host in hosts.items():
        if name != target:
            assert all(s in ("pass", "skip") for s, _ in findings(host, check_id)), (name, host["checks"])
    # Only the faulty GPU is named.
    assert {g for s, g in findings(hosts[target], check_id) if s == status} == {3}


def test_unreachable_host_is_an_error_and_the_others_are_unaffected(ready: Lab) -> None:
    target = next(n for n, h in ready.hosts.items() if h.gpu_count)
    wait_clean(ready)
    assert ready.cli("lab", "fault", target, "unreachable").returncode == 0
    try:
        rc, hosts = verify(ready, "--timeout", "30")
    finally:
        ready.cli("lab", "fault", target, "clear")
    assert rc == 1
    assert hosts[target]["error"]
    assert {c["status"] for c in hosts[target]["checks"]} == {"error"}
    for name, host in hosts.items():
        if name != target:
            assert not not_clean({name: host}), not_clean({name: host})


def test_top_sees_every_gpu_and_an_injected_xid_on_its_gpu(ready: Lab) -> None:
    """`gpuprov top --once` over the lab: each GPU host's GPUs, cp1 (outside gpu_nodes) shown as no GPU
    node and not asked, and an Xid injected into one GPU's kernel log shown on that GPU only."""
    target = next(n for n, h in ready.hosts.items() if h.gpu_count >= 4)
    wait_clean(ready)
    inject = ready.cli("lab", "fault", target, "xid", "--gpu", "2", "--xid", "48")
    assert inject.returncode == 0, inject.stderr
    try:
        res = gpuprov("top", "-i", str(ready.inventory), "--once", "--format", "json", timeout=300)
    finally:
        ready.cli("lab", "fault", target, "clear")
    assert res.returncode == 0, res.stderr  # cp1 is no GPU node: shown as such, not an error
    hosts = {h["host"]: h for h in json.loads(res.stdout)["hosts"]}
    assert set(hosts) == set(ready.hosts)
    for name, spec in ready.hosts.items():
        if not spec.gpu_count:
            assert hosts[name] == {"host": name, "gpu_node": False, "gpus": []}, hosts[name]
            continue
        gpus = hosts[name]["gpus"]
        assert [g["index"] for g in gpus] == list(range(spec.gpu_count)), name
        assert all(g["memory_total_mib"] and g["temperature_c"] is not None for g in gpus), gpus
        expected = {2: [48]} if name == target else {}
        assert {g["index"]: g["xids"] for g in gpus if g["xids"]} == expected, (name, gpus)
    prom = gpuprov("top", "-i", str(ready.inventory), "--once", "--format", "prometheus", timeout=300)
    assert f'gpuprov_gpu_temperature_celsius{{host="{target}",gpu="0"' in prom.stdout
