"""A GPU reset (``nvidia-smi -r``) and a reboot clear, on the lab's simulated GPUs, what they clear on real
hardware (gpu/recovery.py): read back through the product's own probes and its remediation decision, so a
cordon → drain → reset or reboot → re-certify loop can repair what it can repair, and no more."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from gpuprov_lab import faults
from gpuprov_lab.gpu import core, recovery
from sim_host import SimHost

from provisioner.checks import HostFacts
from provisioner.health import decide
from provisioner.probes.kernel_log import parse_kernel_log
from provisioner.probes.smi import parse_nvidia_smi_xml

# h100-sxm-8: GPU index → bus id (nvidia-smi's) and the kernel log's PCI device.
BUS = {1: "00000000:2A:00.0", 2: "00000000:3A:00.0", 3: "00000000:5D:00.0"}
PCI = {1: "0000:2a:00", 2: "0000:3a:00", 3: "0000:5d:00"}
LOST = (
    "Unable to determine the device handle for GPU {bus}: "
    "GPU is lost.  Reboot the system to recover this GPU\n"
)


@pytest.fixture
def h100(tmp_path: Path) -> SimHost:
    host = SimHost(tmp_path, "h100-sxm-8", "gpu2")
    host.driver()
    return host


def xids(host: SimHost) -> list[tuple[int, str]]:
    """(Xid, PCI device) of this boot, as the product reads the kernel log."""
    return [(x.xid, x.pci) for x in parse_kernel_log(host.dmesg())]


def actions(host: SimHost, reset_at: dict[str, float] | None = None) -> dict[int | None, str]:
    """The product's remediation decision per GPU (only those that need something); `reset_at` as the
    product keeps it: the GPUs it reset in this boot, by PCI device, with the uptime before the reset."""
    plan = decide.plan_host(HostFacts("gpu2", host.probe_results()), reset_at=reset_at)
    assert plan.error is None, plan.error
    return {g.index: g.action for g in plan.gpus if g.action != decide.NONE}


def in_force(host: SimHost) -> list[tuple[int, int]]:
    """(Xid, GPU index) of the injected Xid faults not cleared by a reset or a reboot."""
    return [(int(f["xid"]), int(f["gpu"])) for f in host.host.faults() if f["kind"] == "xid"]


def uptime(host: SimHost) -> float:
    return host.host.uptime(host.host.state())


def reset(host: SimHost, *ids: int) -> tuple[int, str]:
    return host.smi("-r", *(("-i", ",".join(map(str, ids))) if ids else ()))


def gpu_xml(host: SimHost, index: int) -> ET.Element:
    rc, out = host.smi("-q", "-x")
    assert rc == 0, out
    return ET.fromstring(out.split("\n", 2)[2]).findall("gpu")[index]


def hold_gpu(host: SimHost) -> None:
    with host.host.locked() as st:
        st["users"]["nvidia-persistenced"] = os.getpid()


# --------------------------------------------------------------------------------------- GPU reset


def test_xid_79_survives_a_reset_and_fails_it_but_not_a_reboot(h100: SimHost) -> None:
    h100.set_faults([{"kind": "xid", "gpu": 2, "xid": 79, "id": "a1"}])
    assert xids(h100) == [(79, PCI[2])]
    assert actions(h100) == {2: decide.REBOOT}
    # The real nvidia-smi cannot reach a GPU that fell off the bus, however it is asked to reset it.
    assert reset(h100, 2) == (recovery.RC_GPU_IS_LOST, LOST.format(bus=BUS[2]))
    assert reset(h100)[0] == recovery.RC_GPU_IS_LOST
    assert xids(h100) == [(79, PCI[2])]
    assert actions(h100) == {2: decide.REBOOT}
    h100.boot()
    assert xids(h100) == []
    assert actions(h100) == {}
    assert reset(h100, 2) == (0, f"GPU {BUS[2]} was successfully reset.\nAll done.\n")


def test_a_reset_clears_the_reset_bucket_xids_of_that_gpu_only(h100: SimHost) -> None:
    h100.set_faults(
        [
            {"kind": "xid", "gpu": 1, "xid": 48, "id": "a1"},  # WORKFLOW_XID_48: reset-gpu
            {"kind": "xid", "gpu": 1, "xid": 94, "id": "a2"},  # RESTART_APP
            {"kind": "xid", "gpu": 1, "xid": 151, "id": "a3"},  # RESTART_VM: a reboot's
            {"kind": "xid", "gpu": 3, "xid": 31, "id": "a4"},  # RESTART_APP
            {"kind": "xid", "gpu": 3, "xid": 95, "id": "a5"},  # RESET_GPU
        ]
    )
    assert sorted(xids(h100)) == sorted(
        [(48, PCI[1]), (94, PCI[1]), (151, PCI[1]), (31, PCI[3]), (95, PCI[3])]
    )
    assert actions(h100) == {1: decide.REBOOT, 3: decide.RESET_GPU}
    logged = sorted(xids(h100))
    before = uptime(h100)
    assert reset(h100, 1) == (0, f"GPU {BUS[1]} was successfully reset.\nAll done.\n")
    # The kernel keeps the boot's log as it was; the reset shows in what a probe of the GPU reads.
    assert sorted(xids(h100)) == logged
    assert h100.host.faults() == [f for f in h100.host.injected() if f["gpu"] == 3 or f["xid"] == 151]
    # For the product, GPU 1's Xids 48 and 94 logged before the reset are answered by it; 151 is not.
    assert actions(h100, {PCI[1]: before}) == {1: decide.REBOOT, 3: decide.RESET_GPU}
    assert reset(h100, 3)[0] == 0
    assert actions(h100, {PCI[1]: before, PCI[3]: uptime(h100)}) == {1: decide.REBOOT}
    h100.boot()
    assert xids(h100) == []
    assert actions(h100) == {}


def test_a_reset_activates_a_pending_remap_and_clears_the_volatile_ecc_count(h100: SimHost) -> None:
    h100.set_faults([{"kind": "remap-pending", "gpu": 2, "id": "a1"}, {"kind": "ecc", "gpu": 3, "id": "a2"}])
    log = parse_nvidia_smi_xml(h100.smi("-q", "-x")[1])
    assert (log.gpus[2].remap_pending, log.gpus[2].remap_uncorrectable) == (True, 1)
    assert log.gpus[3].ecc_volatile_uncorrectable == 2
    assert actions(h100) == {2: decide.RESET_GPU, 3: decide.RESET_GPU}
    assert reset(h100, 2, 3)[0] == 0
    log = parse_nvidia_smi_xml(h100.smi("-q", "-x")[1])
    assert (log.gpus[2].remap_pending, log.gpus[2].remap_failure, log.gpus[2].remap_uncorrectable) == (
        False,
        False,
        1,  # the row is remapped now
    )
    assert log.gpus[3].ecc_volatile_uncorrectable == 0
    assert gpu_xml(h100, 3).findtext("ecc_errors/aggregate/dram_uncorrectable") == "2"  # the lifetime count
    assert actions(h100) == {}
    h100.boot()  # cleared stays cleared; what the reset left stays too
    log = parse_nvidia_smi_xml(h100.smi("-q", "-x")[1])
    assert (log.gpus[2].remap_pending, log.gpus[2].remap_uncorrectable) == (False, 1)
    assert log.gpus[3].ecc_volatile_uncorrectable == 0
    assert actions(h100) == {}


def test_a_reset_is_refused_while_a_process_holds_the_gpu_and_then_clears_nothing(h100: SimHost) -> None:
    h100.set_faults([{"kind": "xid", "gpu": 2, "xid": 48, "id": "a1"}, {"kind": "remap-pending", "gpu": 2}])
    hold_gpu(h100)
    rc, out = reset(h100, 2)
    assert (rc, out.splitlines()[:2]) == (255, ["The following GPUs could not be reset:",
                                                f"  GPU {BUS[2]}: In use by another client"])  # fmt: skip
    assert xids(h100) == [(48, PCI[2])]
    assert parse_nvidia_smi_xml(h100.smi("-q", "-x")[1]).gpus[2].remap_pending is True
    with h100.host.locked() as st:
        st["users"].clear()
    assert in_force(h100) == [(48, 2)]
    assert reset(h100, 2)[0] == 0
    assert in_force(h100) == [] and xids(h100) == [(48, PCI[2])]  # the boot's log keeps its line
    assert parse_nvidia_smi_xml(h100.smi("-q", "-x")[1]).gpus[2].remap_pending is False


def test_a_running_fabric_manager_does_not_refuse_a_reset(h100: SimHost) -> None:
    """The fabric manager stays up through a single GPU reset on an NVSwitch system (mig.reset says why);
    the host engine, which keeps the device open, refuses it."""
    h100.set_faults([{"kind": "xid", "gpu": 2, "xid": 48, "id": "a1"}])
    with h100.host.locked() as st:
        st["users"]["nv-fabricmanager"] = os.getpid()
    assert reset(h100, 2)[0] == 0 and in_force(h100) == []
    h100.set_faults([{"kind": "xid", "gpu": 2, "xid": 48, "id": "a2"}])
    with h100.host.locked() as st:
        st["users"]["nv-hostengine"] = os.getpid()
    rc, out = reset(h100, 2)
    assert rc == 255 and "In use by another client" in out and in_force(h100) == [(48, 2)]


# -------------------------------------------------------------------------------------------- reboot


def test_a_reboot_clears_every_xid_and_activates_remaps_but_the_hardware_faults_stay(h100: SimHost) -> None:
    h100.set_faults(
        [
            {"kind": "xid", "gpu": 1, "xid": 79, "id": "a1"},
            {"kind": "xid", "gpu": 1, "xid": 119, "id": "a2"},
            {"kind": "remap-pending", "gpu": 2, "id": "a3"},
            {"kind": "remap-failure", "gpu": 3, "id": "a4"},
            {"kind": "pcie", "gpu": 3, "id": "a5"},
        ]
    )
    assert actions(h100) == {1: decide.REBOOT, 2: decide.RESET_GPU, 3: decide.SERVICE}
    h100.boot()
    assert xids(h100) == []
    log = parse_nvidia_smi_xml(h100.smi("-q", "-x")[1])
    assert (log.gpus[2].remap_pending, log.gpus[2].remap_uncorrectable) == (False, 1)
    assert (log.gpus[3].remap_failure, log.gpus[3].link_width_current) == (True, 8)
    assert actions(h100) == {3: decide.SERVICE}
    # A reset does not repair hardware either.
    assert reset(h100, 3)[0] == 0
    h100.boot()
    assert actions(h100) == {3: decide.SERVICE}
    assert parse_nvidia_smi_xml(h100.smi("-q", "-x")[1]).gpus[3].link_width_current == 8


def test_a_missing_gpu_stays_missing_across_a_reboot(h100: SimHost) -> None:
    h100.set_faults([{"kind": "gpu-missing", "gpu": 3, "id": "a1"}])
    assert actions(h100) == {None: decide.REBOOT}
    assert reset(h100)[0] == 0  # the GPUs NVML sees
    h100.boot()
    assert parse_nvidia_smi_xml(h100.smi("-q", "-x")[1]).attached_gpus == 7
    assert actions(h100) == {None: decide.REBOOT}


def test_a_fault_that_no_boot_showed_yet_shows_on_the_next(h100: SimHost) -> None:
    """An event belongs to the boot that first showed it: injected while the host was going down (no tool
    ran), it shows after the reboot, and the one after that clears it."""
    h100.set_faults([{"kind": "xid", "gpu": 2, "xid": 79, "id": "a1"}])
    h100.boot()
    assert xids(h100) == [(79, PCI[2])]
    h100.boot()
    assert xids(h100) == []


# ------------------------------------------------------------------------------ events, injection


def test_the_same_fault_injected_again_after_a_clear_shows_again(h100: SimHost) -> None:
    xid48 = {"kind": "xid", "gpu": 2, "xid": 48}
    current = faults.with_fault([], xid48)
    h100.set_faults(current)
    assert in_force(h100) == [(48, 2)]
    assert reset(h100, 2)[0] == 0
    assert in_force(h100) == []
    h100.set_faults(current)  # rewritten unchanged: the same event, still cleared
    assert in_force(h100) == []
    again = faults.with_fault(current, xid48)
    assert len(again) == 1 and again[0]["id"] != current[0]["id"]
    h100.set_faults(again)
    assert in_force(h100) == [(48, 2)]
    # The new event's line (the entry it replaced goes with its line, as `lab fault ... clear` does).
    assert xids(h100) == [(48, PCI[2])]
    h100.boot()
    assert xids(h100) == [] and in_force(h100) == []
    h100.set_faults(faults.with_fault(again, xid48))
    assert xids(h100) == [(48, PCI[2])]


def test_faults_without_an_id_still_apply_and_clear(h100: SimHost) -> None:
    h100.set_faults([{"kind": "xid", "gpu": 2, "xid": 48}, {"kind": "remap-pending", "gpu": 2}])
    assert xids(h100) == [(48, PCI[2])]
    before = uptime(h100)
    assert reset(h100, 2)[0] == 0
    assert in_force(h100) == [] and actions(h100, {PCI[2]: before}) == {}


def test_the_cleared_state_lives_outside_run_and_forgets_what_the_controller_removed(h100: SimHost) -> None:
    h100.set_faults([{"kind": "xid", "gpu": 2, "xid": 48, "id": "a1"}])
    assert reset(h100, 2)[0] == 0
    store = h100.root / core.FAULT_EVENTS.lstrip("/")
    assert [e["cleared"] for e in h100.host.fault_events().values()] == [recovery.RESET]
    h100.set_faults([])  # `gpuprov lab fault HOST clear`
    assert xids(h100) == [] and store.exists() and h100.host.fault_events() == {}


def test_the_xids_a_reset_clears_are_the_catalogs_per_the_products_table() -> None:
    """The lab cannot read the product's Xid table inside a host: its copy must say the same."""
    table = yaml.safe_load(decide.XID_TABLE.read_text())
    rules = decide.table_from(table).rules
    assert {
        x for x, r in rules.items() if r.action in (decide.NONE, decide.RESET_GPU)
    } == recovery.RESET_CLEARS_XIDS
    assert rules[recovery.FALLEN_OFF_THE_BUS].bucket == "RESTART_BM"
