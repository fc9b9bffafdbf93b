"""Part of the gpuprov lab simulation: what a GPU reset (``nvidia-smi -r``) and a reboot clear of the
injected faults, so that a health-remediation loop (cordon, drain, reset or reboot, re-certify) can repair
what it can repair on real hardware, and cannot repair the rest.

An injected fault is an event on a GPU. :func:`note_boot` (run by watch.sync) records the boot that first
showed it, in core.FAULT_EVENTS under /var/lib (a reboot keeps it); a reset or a reboot marks the faults it
clears there, and a cleared fault stays cleared for as long as it stays in faults.json. ``gpuprov lab
fault`` gives every GPU fault an id of its own, so the same fault injected again is a new event and shows
again.

=================================================  ==============================  ====================
fault                                              GPU reset (of that GPU only)    reboot
=================================================  ==============================  ====================
xid whose catalog action is at most a GPU reset    cleared                         cleared
xid 79 (fallen off the bus)                        the reset fails                 cleared
xid 151, and Xids whose action is service          stays                           cleared
ecc (volatile uncorrectable count)                 cleared; the aggregate stays    as a reset
remap-pending                                      activated: a remapped row       as a reset
remap-failure, pcie, gpu-missing                   stays (hardware)                stays
=================================================  ==============================  ====================

Grounded (NVIDIA):

- Xids: "Analyzing Xid Errors with the Xid Catalog", column "Resolution Bucket (Immediate Action)"
  (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), as the product's
  provisioner/health/xids.yaml records it: RESTART_APP and IGNORE need no node action and RESET_GPU a
  GPU reset; for 48 and 74 the catalog says "a GPU reset or node reboot is needed to clear this error";
  79 is RESTART_BM, 151 RESTART_VM, and unknown codes CONTACT_SUPPORT. A lab test checks
  RESET_CLEARS_XIDS against that file (this module runs inside lab hosts, where it cannot be read).
- Row remapping: "This flag indicates that row-remapping will happen at the next GPU reset" (GPU Memory
  Error Management, "Error Recovery and Response Flags"); the failure flag "will be set if a row
  remapping ever failed in the past" (NVML, nvmlDeviceGetRemappedRows): it stays.
- ECC counts: "Volatile counts are reset each time the driver loads", "Aggregate counts persist across
  reboots" (NVML, nvmlEccCounterType_t).
- Xid 79, reset: nvidia-smi cannot get a handle for a GPU that fell off the bus and prints "Unable to
  determine the device handle for GPU <bus id>: GPU is lost.  Reboot the system to recover this GPU"
  (the text users report, e.g. NVIDIA/open-gpu-kernel-modules#387 and AlexeyAB/darknet#86); 15 is NVML's
  NVML_ERROR_GPU_IS_LOST, and nvidia-smi exits with the NVML return code of its failure (mig.py).

Assumed (not found in NVIDIA's documents): that a GPU reset clears the volatile ECC counts (the driver
reinitialises the GPU as at a load); that nvidia-smi resolves every GPU it is asked to reset before it
resets any, so one lost GPU fails the whole command; that a reset neither clears nor fails on Xid 151 and
Xids whose action is service. A lost GPU is otherwise still answered by the lab's nvidia-smi (-q -x,
-L): only the reset sees it lost.

A GPU reset removes nothing from the kernel's log: the Xid lines of the boot stay until a reboot, in the
lab as on real hardware (watch.sync keeps them), stamped with the time they first showed.
"""

from __future__ import annotations

from typing import Any

from . import core

RESET = "reset"
REBOOT = "reboot"
# Xids whose catalog immediate action is RESTART_APP, IGNORE or RESET_GPU, or whose workflow the catalog
# ends with a GPU reset (45: follow the other Xid; 48, 74: "a GPU reset or node reboot ... clear[s] this
# error"): every Xid of provisioner/health/xids.yaml whose action is none or reset-gpu.
RESET_CLEARS_XIDS = frozenset(
    {8, 11, 13, 25, 31, 32, 43, 45, 46, 48, 62, 63, 64, 74, 92, 94, 95, 109, 110, 119, 120, 136, 140, 143,
     154, 155, 156, 157, 158}
)  # fmt: skip
# Faults of the memory's state that a reset (or the reset a reboot includes) clears or activates.
RESET_CLEARS_KINDS = ("ecc", "remap-pending")
FALLEN_OFF_THE_BUS = 79
RC_GPU_IS_LOST = 15


def _gpu(f: dict[str, Any]) -> int:
    return int(f.get("gpu", 0))


def _xid(f: dict[str, Any]) -> int:
    return int(f.get("xid", FALLEN_OFF_THE_BUS))  # as dmesg prints an xid fault without a number


def cleared_by(f: dict[str, Any], action: str) -> bool:
    """Whether ``action`` (RESET of the fault's GPU, or REBOOT) clears the fault."""
    kind = f.get("kind")
    if kind in RESET_CLEARS_KINDS:
        return True
    if kind != "xid":
        return False  # remap-failure, pcie, gpu-missing: the hardware's
    return action == REBOOT or _xid(f) in RESET_CLEARS_XIDS


def lost(host: core.Host, index: int) -> bool:
    """The GPU fell off the bus on this boot (an Xid 79 in force): only a reboot brings it back."""
    return any(
        f.get("kind") == "xid" and _gpu(f) == index and _xid(f) == FALLEN_OFF_THE_BUS for f in host.faults()
    )


def reset(host: core.Host, gpus: list[dict[str, Any]]) -> None:
    """A GPU reset of ``gpus`` (the caller holds the host's lock and has checked that nothing holds them
    and none is lost): clear what a reset clears, on those GPUs only."""
    indexes = {int(g["index"]) for g in gpus}
    cleared = [f for f in host.faults() if _gpu(f) in indexes and cleared_by(f, RESET)]
    events = host.fault_events()
    for f in cleared:
        events.setdefault(core.fault_key(f), {})["cleared"] = RESET
    if cleared:
        host.save_fault_events(events)


def cleared_in_boot(host: core.Host, key: str) -> bool:
    """The injected Xid fault ``key`` was cleared by a GPU reset (its lines stay in this boot's log)."""
    event = host.fault_events().get(key) or {}
    return event.get("cleared") == RESET and '"kind": "xid"' in key


def lost_message(gpus: list[dict[str, Any]]) -> str:
    """What nvidia-smi prints when it cannot reach a GPU that fell off the bus."""
    return "".join(
        f"Unable to determine the device handle for GPU {g['bus_id']}: GPU is lost.  Reboot the system to "
        "recover this GPU\n"
        for g in gpus
    )


def note_boot(host: core.Host, st: dict[str, Any]) -> None:
    """Record the boot each injected fault first showed on, and clear what a reboot clears of faults that
    showed on an earlier boot; forget faults the controller removed (the caller holds ``st``)."""
    injected = {core.fault_key(f): f for f in host.injected()}
    events = host.fault_events()
    before = dict(events)
    events = {k: dict(v) for k, v in events.items() if k in injected}
    for key, f in injected.items():
        event = events.setdefault(key, {"boot": st["boot_id"]})
        event.setdefault("boot", st["boot_id"])
        if event["boot"] != st["boot_id"] and not event.get("cleared") and cleared_by(f, REBOOT):
            event["cleared"] = REBOOT
    if events != before:
        host.save_fault_events(events)
