"""The lab's simulated NVIDIA daemons and DCGM: persistenced, fabric manager and nv-hostengine start only
where the real ones do, hold the driver while they run, and dcgmi's level-1 diagnostic reads through
provisioner/probes/ the way the real JSON does, failing on the GPU a fault names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sim_host
from gpuprov_lab.gpu import core, kmod
from sim_host import SimHost, daemons, dcgm, watch

from provisioner.probes.dcgm import DiagResult, parse_dcgm_diag
from provisioner.probes.smi import parse_nvidia_smi_xml


@pytest.fixture
def h100(tmp_path: Path) -> SimHost:
    host = SimHost(tmp_path, "h100-sxm-8", "gpu2")
    host.driver()
    host.install("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda13", version="1:4.4.1-1")
    return host


def hold(host: SimHost, prog: str) -> None:
    """A daemon's run(): registered as a user of /dev/nvidia* (this test process stands in for it)."""
    with host.host.locked() as st:
        st["users"][prog] = os.getpid()


def diag(host: SimHost) -> tuple[int, list[DiagResult]]:
    rc, out, _ = host.run(dcgm.main, "dcgmi", ["diag", "-r", "1", "-j"], dcgm="4.4.1")
    return rc, parse_dcgm_diag(out)


def test_persistenced_needs_a_driver_of_its_own_version(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.install("libnvidia-ml1", "nvidia-smi")
    host.boot()
    assert "Failed to query NVIDIA devices" in (daemons.persistenced_check(host.host, sim_host.DRIVER) or "")
    host.driver()
    assert daemons.persistenced_check(host.host, sim_host.DRIVER) is None
    assert "version mismatch" in (daemons.persistenced_check(host.host, "580.95.05") or "")
    daemons.set_all_persistence(host.host, True)
    assert parse_nvidia_smi_xml(host.smi("-q", "-x")[1]).gpus[0].persistence == "Enabled"


def test_fabric_manager_starts_only_with_nvswitches_and_the_same_driver(
    h100: SimHost, tmp_path: Path
) -> None:
    assert daemons.fabricmanager_check(h100.host, sim_host.DRIVER) is None
    mismatch = daemons.fabricmanager_check(h100.host, "580.95.05")
    assert mismatch == (
        "fabric manager NVIDIA GPU driver interface version 580.95.05 don't match with driver version "
        "580.159.04. Please update with matching NVIDIA driver package."
    )
    single = SimHost(tmp_path / "l40s", "l40s")
    single.driver()
    assert "NV_WARN_NOTHING_TO_DO" in (daemons.fabricmanager_check(single.host, sim_host.DRIVER) or "")


def test_dcgmi_needs_the_host_engine(h100: SimHost) -> None:
    for command in (["diag", "-r", "1", "-j"], ["discovery", "-l"]):
        rc, out, _ = h100.run(dcgm.main, "dcgmi", command, dcgm="4.4.1")
        assert rc == 255 and out.startswith("Error: unable to establish a connection to the specified host")
    hold(h100, "nv-hostengine")
    rc, out, _ = h100.run(dcgm.main, "dcgmi", ["diag", "-r", "1", "-j"], dcgm="4.4.1")
    assert rc == dcgm.RC_DIAG_FAILED  # persistence is off: nvidia-persistenced does not run
    assert {r.gpu for r in parse_dcgm_diag(out)} == set(range(8))
    rc, out, _ = h100.run(dcgm.main, "dcgmi", ["discovery", "-l"], dcgm="4.4.1")
    assert rc == 0 and out.startswith("8 GPUs found.\n") and out.count("Device UUID: GPU-") == 8
    rc, out, _ = h100.run(dcgm.main, "dcgmi", ["stats", "-e"], dcgm="4.4.1")
    assert rc == 2 and "not provided by the gpuprov lab" in out


def test_diag_fails_on_the_faulty_gpu_and_without_fabric_manager(h100: SimHost) -> None:
    hold(h100, "nv-hostengine")
    daemons.set_all_persistence(h100.host, True)
    rc, results = diag(h100)
    assert rc == dcgm.RC_DIAG_FAILED
    assert {r.gpu for r in results if r.test == "fabric_manager" and r.status == "fail"} == set(range(8))
    hold(h100, "nv-fabricmanager")
    with h100.host.locked() as st:
        st["fabric"] = "configured"
    rc, results = diag(h100)
    assert rc == 0 and {r.status for r in results} == {"pass"}
    assert parse_nvidia_smi_xml(h100.smi("-q", "-x")[1]) is not None
    for kind in ("remap-pending", "remap-failure", "ecc"):
        h100.set_faults([{"kind": kind, "gpu": 3}])
        rc, results = diag(h100)
        assert rc == dcgm.RC_DIAG_FAILED
        assert [(r.test, r.gpu) for r in results if r.status == "fail"] == [("page_retirement", 3)], kind
    h100.set_faults([])
    daemons.set_all_persistence(h100.host, False)
    rc, results = diag(h100)
    assert rc == 0 and {r.gpu for r in results if r.status == "warn"} == set(range(8))


def test_diag_needs_the_cuda_plugin_of_the_driver(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.driver()
    host.install("datacenter-gpu-manager-4-core", version="1:4.4.1-1")
    hold(host, "nv-hostengine")
    rc, out, _ = host.run(dcgm.main, "dcgmi", ["diag", "-r", "1", "-j"], dcgm="4.4.1")
    assert rc == dcgm.RC_DIAG_FAILED and "datacenter-gpu-manager-4-cuda13" in out


def test_a_daemon_holding_the_driver_blocks_unloading_until_it_exits(h100: SimHost) -> None:
    assert h100.kmod("rmmod", "nvidia_uvm")[0] == 0
    hold(h100, "nvidia-persistenced")
    assert (h100.root / "sys/module/nvidia/refcnt").read_text() == "0\n"  # not rendered yet
    watch.sync(h100.host)
    assert (h100.root / "sys/module/nvidia/refcnt").read_text() == "1\n"
    assert h100.kmod("rmmod", "nvidia") == (1, "", "rmmod: ERROR: Module nvidia is in use\n")
    with h100.host.locked() as st:
        st["users"]["nvidia-persistenced"] = 2**22 + 12345  # the daemon was killed: a PID not running
    assert watch._holder_died(h100.host)
    watch.sync(h100.host)
    assert not watch._holder_died(h100.host)
    assert (h100.root / "sys/module/nvidia/refcnt").read_text() == "0\n"
    assert h100.kmod("rmmod", "nvidia")[0] == 0


def test_a_daemon_holds_the_driver_from_its_start_to_its_stop(h100: SimHost) -> None:
    """What the daemons and nv-hostengine do once running and when stopped: the module's reference count
    follows at once, and /dev/nvidia* users are listed by their program."""
    assert h100.kmod("rmmod", "nvidia_uvm")[0] == 0
    sim_host.kmod.add_user(h100.host, "nv-hostengine", os.getpid())
    assert (h100.root / "sys/module/nvidia/refcnt").read_text() == "1\n"
    assert dcgm.hostengine_running(h100.host)
    assert h100.kmod("rmmod", "nvidia") == (1, "", "rmmod: ERROR: Module nvidia is in use\n")
    sim_host.kmod.remove_user(h100.host, "nv-hostengine")
    assert (h100.root / "sys/module/nvidia/refcnt").read_text() == "0\n"
    assert not dcgm.hostengine_running(h100.host)
    assert h100.kmod("rmmod", "nvidia")[0] == 0


def test_a_process_in_another_pid_namespace_does_not_prune_the_hosts_daemons(
    h100: SimHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's nvidia-smi (the operator's validator) sees none of the host's PIDs: the daemons registered
    from the host stay registered; the host itself still forgets one that died."""
    kmod.add_user(h100.host, "nv-hostengine", os.getpid())
    monkeypatch.setattr(core, "pid_namespace", lambda: "pid:[1]")  # a container's own PIDs
    monkeypatch.setattr(core, "pid_alive", lambda pid: False)  # ...where the host's daemon is not seen
    assert kmod.users(h100.host.state()) == {"nv-hostengine": os.getpid()}
    with h100.host.locked() as st:
        kmod.users(st)
    assert "nv-hostengine" in h100.host.state()["users"]
    monkeypatch.undo()
    monkeypatch.setattr(core, "pid_alive", lambda pid: False)  # the host's view: the daemon died
    with h100.host.locked() as st:
        assert kmod.users(st) == {}
