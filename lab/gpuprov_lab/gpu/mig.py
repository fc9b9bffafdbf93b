"""Part of the gpuprov lab simulation: MIG (Multi-Instance GPU) on the host's simulated GPUs.

SIMULATED (gpuprov lab). NVIDIA's mock NVML knows MIG mode only, so MIG is answered here, in nvidia-smi's
real syntax and text, as far as gpuprov and nvidia-mig-parted (the lab's front end, migparted.py, calls
these functions) use it: ``nvidia-smi -mig``, ``-r``, ``nvidia-smi mig -cgi LIST [-C]``, ``-dci``,
``-dgi``. The state is kept per GPU in the host's run-state (``st["mig"]``, keyed by bus id): MIG mode
current/pending, the GPU instances (profile id, placement start/size) and their compute instances. The
listings (``-lgip``, ``-lgipp``, ``-lgi``, ``-lci``) and ``-cci`` are not simulated: nothing in the lab
runs them.
``nvidia-smi -L`` is still NVIDIA's own binary over the mock NVML; when GPU instances with compute
instances exist, the front end inserts the MIG device lines the mock cannot produce under their GPU's
line (:func:`list_with_mig_devices`).

Where each behaviour comes from:

- Profile tables: the H200's are the real ``nvidia-smi mig -lgip``/``-lgipp`` of an H200 (driver
  580.159.04; a test reads the capture with gpuprov's own parser and compares); the H100 80GB and A100
  80GB tables are NVIDIA's ("Supported MIG Profiles", NVIDIA Multi-Instance GPU User Guide). This module
  runs inside lab hosts, where gpuprov's tables cannot be imported.
- Placement: the driver picks where a GPU instance goes. The published examples (MIG User Guide,
  "Creating GPU Instances", ``-cgi 19,14,5``, ``9,19,14,19``, ``14,19,19,19,19,19``, ``19,19,14,9``) are
  all reproduced by: take the allowed start that leaves the most placements of every profile free,
  lowest start on a tie. GPU instance ids are the driver's placement slots (the 7g at 0:8 is id 0, the
  halves 1-2, the quarters 3-6, the eighths 7-14), as those examples show.
- Mode: Hopper and later need no GPU reset to change MIG mode and do not keep it across a driver reload
  (User Guide, "GPU Reset on Hopper+ GPUs"); Ampere resets the GPU, so a process holding the device
  leaves the change pending with "In use by another client" (User Guide, "Driver Clients";
  NVIDIA/gpu-operator#1845: A100 stuck pending, H100/H200 fine with the same setup). The holders are the
  processes that hold /dev/nvidia* in this simulation (nvidia-persistenced, nv-fabricmanager,
  nv-hostengine register themselves, see kmod.users), which is what the driver itself sees.
- Exit status: nvidia-smi exits with the NVML return code of the failure (as it does with 18 for a
  driver/library mismatch): 4 Insufficient Permissions, 6 Not Found, 19 In use by another client, 23
  Insufficient Resources; 255 ("other error", nvidia-smi(1) RETURN VALUE) otherwise.
- Only full-size compute instances (the ``-C`` default) are simulated.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import core, kmod, recovery

RC_NO_PERMISSION = 4
RC_NOT_FOUND = 6
RC_IN_USE = 19
RC_INSUFFICIENT = 23
RC_ARGS = 2
RC_UNKNOWN = 255
# `gpuprov lab fault HOST mig-fail`: enabling MIG mode, and creating GPU instances, fail on every GPU (a
# layout change then fails whether or not it needs a mode change).
HOST_FAULT = "mig-fail"
MEMORY_SLOTS = 8
PERSISTENCE_WARNING = (
    "Warning: persistence mode is disabled on device {bus}. See the Known Issues section of the "
    "nvidia-smi(1) man page for more information. Run with [--help | -h] switch to get more information "
    "on how to enable persistence mode."
)


class MigError(core.SimError):
    """A MIG command failed; the message is what nvidia-smi prints (to stdout)."""


@dataclass(frozen=True)
class GiProfile:
    """One GPU instance profile: its name, id, how many instances a GPU holds, where one may start and how
    many of the 8 memory slots it takes (what ``nvidia-smi mig -lgip``/``-lgipp`` print for it)."""

    name: str  # "1g.18gb"
    profile_id: int
    total: int
    starts: tuple[int, ...]
    size: int

    @property
    def compute(self) -> int:
        return int(self.name.split("g.", 1)[0])


# The profile ids, counts and placements, which the H200, H100 80GB and A100 80GB share, in the driver's
# order (-lgip lists profiles in it; instances are sorted by it).
_LAYOUT = (
    (19, 7, (0, 1, 2, 3, 4, 5, 6), 1),
    (20, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    (15, 4, (0, 2, 4, 6), 2),
    (14, 3, (0, 2, 4), 2),
    (9, 2, (0, 4), 4),
    (5, 1, (0,), 4),
    (0, 1, (0,), 8),
)


def _table(*names: str) -> tuple[GiProfile, ...]:
    return tuple(GiProfile(name, *row) for name, row in zip(names, _LAYOUT, strict=True))


# NVIDIA H200 (0x2335): the real capture (tests/fixtures/hosts/h200-ubuntu2404/nvidia-smi-mig-lgip*.txt).
H200 = _table("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
# NVIDIA H100 80GB HBM3 (0x2330) and A100-SXM4-80GB (0x20B2): the User Guide's 80GB profiles.
H100_80GB = A100_80GB = _table("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
# PCI device id → the GPU's profiles; GPUs not listed have no MIG.
TABLES: dict[int, tuple[GiProfile, ...]] = {0x2335: H200, 0x2330: H100_80GB, 0x20B2: A100_80GB}
# Compute instance profile id of a full-size compute instance, by compute slices (NVML's
# NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE).
CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def profiles(g: dict[str, Any]) -> tuple[GiProfile, ...] | None:
    return TABLES.get(int(g["device_id"], 16))


def _profile(table: tuple[GiProfile, ...], token: str) -> GiProfile | None:
    """A profile by id ("9"), short name ("3g.71gb") or full name ("MIG 3g.71gb"), as -cgi takes them."""
    token = token.strip()
    for p in table:
        if token in (str(p.profile_id), p.name, f"MIG {p.name}"):
            return p
    return None


# ------------------------------------------------------------------------------------------ state


def _module_stamp(st: dict[str, Any]) -> float | None:
    m = kmod.loaded(st, "nvidia")
    return m.get("at") if m else None


def gpu_state(st: dict[str, Any], g: dict[str, Any]) -> dict[str, Any]:
    """The GPU's MIG state as the loaded driver has it. Instances never outlive the driver; the mode does
    on Ampere (the InfoROM keeps it, and the reset that comes with the reload applies a pending change)
    but not on Hopper and later."""
    mig = st.setdefault("mig", {})
    cur = mig.get(g["bus_id"])
    stamp = _module_stamp(st)
    if cur is None or cur.get("driver") != stamp:
        keep = cur is not None and g["architecture"] == "Ampere"
        pending = bool(cur["pending"]) if keep else False
        cur = {"driver": stamp, "current": pending, "pending": pending, "gis": []}
        mig[g["bus_id"]] = cur
    return cur


def mode_values(st: dict[str, Any], g: dict[str, Any]) -> tuple[str, str]:
    """(current, pending) as -q prints them: Enabled/Disabled, N/A on a GPU without MIG."""
    if profiles(g) is None:
        return "N/A", "N/A"
    cur = gpu_state(st, g)
    return ("Enabled" if cur["current"] else "Disabled", "Enabled" if cur["pending"] else "Disabled")


def _unprivileged(host: core.Host) -> bool:
    """Changing MIG needs root (or the mig/config capability, which the lab's users do not get)."""
    return host.on_host and os.geteuid() != 0


def _terminated(out: list[str], error: str, rc: int) -> MigError:
    """nvidia-smi stops at the first GPU it cannot change: what it printed so far, the error, the end."""
    return MigError("\n".join([*out, error]) + "\nTerminating early due to previous errors.\n", rc)


# ------------------------------------------------------------------------------------------- mode


def set_mode(host: core.Host, gpus: list[dict[str, Any]], enable: bool) -> str:
    """``nvidia-smi [-i IDS] -mig 0|1``: the text, or MigError."""
    word = "enable" if enable else "disable"
    out: list[str] = []
    with host.locked() as st:
        holders = sorted(kmod.users(st))
        for g in gpus:
            bus = g["bus_id"]
            if profiles(g) is None:
                out += [
                    f"Unable to {word} MIG Mode for GPU {bus}: Not Supported",
                    "Treating as warning and moving on.",
                ]
                continue
            if _unprivileged(host):
                raise _terminated(
                    out,
                    f"Unable to {word} MIG Mode for GPU {bus}: Insufficient Permissions",
                    RC_NO_PERMISSION,
                )
            cur = gpu_state(st, g)
            if enable and host.has_fault(HOST_FAULT):
                raise _terminated(out, f"Unable to enable MIG Mode for GPU {bus}: Unknown Error", RC_UNKNOWN)
            if not enable and cur["gis"]:
                # The driver cannot leave MIG mode while GPU instances exist (they are clients of it).
                raise _terminated(
                    out, f"Unable to disable MIG Mode for GPU {bus}: In use by another client", RC_IN_USE
                )
            cur["pending"] = enable
            if g["architecture"] == "Ampere" and holders and cur["current"] != enable:
                state = "enable" if enable else "disable"
                out += [
                    f"Warning: MIG mode is in pending {state} state for GPU {bus}:In use by another client",
                    f"{bus} is currently being used by one or more other processes (e.g. CUDA application or "
                    "a monitoring application such as another instance of nvidia-smi). Please first kill all "
                    "processes using the device and retry the command or reboot the system to make MIG mode "
                    "effective.",
                ]
                continue
            cur["current"] = enable
            out.append(f"{'Enabled' if enable else 'Disabled'} MIG Mode for GPU {bus}")
            if not st["persistence"].get(bus, False):
                out += ["", PERSISTENCE_WARNING.format(bus=bus)]
    return "\n".join([*out, "All done."]) + "\n"


def reset(host: core.Host, gpus: list[dict[str, Any]]) -> str:
    """``nvidia-smi -r [-i IDS]``: a GPU reset, what applies a pending MIG change on Ampere (and clears the
    instances; on Hopper and later it clears MIG mode too) and clears the faults a reset clears on those
    GPUs (recovery.py). Refused while any process holds the GPU, with the real text (exit status 255, as
    captured); fails for a GPU that fell off the bus (Xid 79), before anything is reset.

    The fabric manager is not such a process: NVIDIA's Fabric Manager User Guide ("GPU VM System Reset
    Capabilities and Limitations") has a single GPU reset while it runs (on A100 NVSwitch systems only
    with it running, it resets the GPU's NVSwitch links itself), nvidia-smi(1) says from Hopper on a reset
    no longer depends on it, and NVIDIA's NVSentinel (gpu-reset/gpu_reset.sh) resets GPUs with it left
    running. nvidia-persistenced and nv-hostengine keep the device open and refuse it."""
    with host.locked() as st:
        lost = [g for g in gpus if recovery.lost(host, g["index"])]
        if lost:
            raise MigError(recovery.lost_message(lost), recovery.RC_GPU_IS_LOST)
        holders = {prog: pid for prog, pid in kmod.users(st).items() if prog != "nv-fabricmanager"}
        if holders or _unprivileged(host):
            reason = "In use by another client" if holders else "Insufficient Permissions"
            lines = [
                "The following GPUs could not be reset:",
                *(f"  GPU {g['bus_id']}: {reason}" for g in gpus),
            ]
            if holders:
                n = len(gpus)
                which = "this device" if n == 1 else "these devices"
                lines += [
                    "",
                    f"{n} device{' is' if n == 1 else 's are'} currently being used by one or more other "
                    "processes (e.g., Fabric Manager, CUDA application, graphics application such as an X "
                    "server, or a monitoring application such as another instance of nvidia-smi). Please "
                    f"first kill all processes using {which} and all compute applications running in the "
                    "system.",
                ]
            raise MigError("\n".join(lines) + "\n", RC_UNKNOWN if holders else RC_NO_PERMISSION)
        out = []
        for g in gpus:
            if profiles(g) is not None:
                cur = gpu_state(st, g)
                ampere = g["architecture"] == "Ampere"
                cur["gis"] = []
                cur["current"] = cur["pending"] = bool(cur["pending"]) if ampere else False
            out.append(f"GPU {g['bus_id']} was successfully reset.")
        recovery.reset(host, gpus)
    return "\n".join([*out, "All done."]) + "\n"


# ------------------------------------------------------------------------------------- placement


def _used(cur: dict[str, Any]) -> set[int]:
    return {slot for gi in cur["gis"] for slot in range(gi["start"], gi["start"] + gi["size"])}


def _fits(p: GiProfile, start: int, used: set[int]) -> bool:
    return not used.intersection(range(start, start + p.size))


def _free_placements(table: tuple[GiProfile, ...], used: set[int]) -> int:
    return sum(1 for p in table for s in p.starts if _fits(p, s, used))


def _choose(table: tuple[GiProfile, ...], cur: dict[str, Any], p: GiProfile) -> int | None:
    """Where the driver puts a new instance of p (see the module docstring), or None: it does not fit.
    The placements alone keep the 7 compute slices (no two placements that fit together exceed them)."""
    if sum(1 for gi in cur["gis"] if gi["profile"] == p.profile_id) >= p.total:
        return None
    used = _used(cur)
    best: tuple[int, int] | None = None
    for start in p.starts:
        if _fits(p, start, used):
            score = _free_placements(table, used | set(range(start, start + p.size)))
            if best is None or score > best[0]:
                best = (score, start)
    return None if best is None else best[1]


def _by_id(table: tuple[GiProfile, ...], profile_id: int) -> GiProfile:
    return next(p for p in table if p.profile_id == profile_id)


def gi_id(start: int, size: int) -> int:
    """The driver's GPU instance id for a placement: its slot in the binary split of the 8 memory slots."""
    return MEMORY_SLOTS // size - 1 + start // size


def _sorted_gis(table: tuple[GiProfile, ...], cur: dict[str, Any]) -> list[dict[str, Any]]:
    """GPU instances in the driver's order: by profile (the table's order), then by id."""
    order = {p.profile_id: i for i, p in enumerate(table)}
    return sorted(cur["gis"], key=lambda gi: (order[gi["profile"]], gi["id"]))


Indexed = list[tuple[int, dict[str, Any]]]  # (nvidia-smi's GPU index, the GPU)


def _enabled(st: dict[str, Any], gpus: Indexed) -> Indexed:
    chosen = [(i, g) for i, g in gpus if profiles(g) is not None and gpu_state(st, g)["current"]]
    if not chosen:
        raise MigError("No MIG-enabled devices found.\n", RC_NOT_FOUND)
    return chosen


# ------------------------------------------------------------------------------- create / destroy


def _full_ci(p: GiProfile) -> dict[str, Any]:
    return {"id": 0, "profile": CI_PROFILE[p.compute]}


def _ci_line(i: int, gi: dict[str, Any], name: str) -> str:
    ci = gi["cis"][-1]
    return (
        f"Successfully created compute instance ID {ci['id']:>2} on GPU {i:>2} GPU instance ID {gi['id']:>2} "
        f"using profile MIG {name} (ID {ci['profile']:>2})"
    )


def create_gpu_instances(host: core.Host, gpus: Indexed, tokens: list[str], with_ci: bool) -> str:
    """``nvidia-smi mig [-i IDS] -cgi LIST [-C]``: one instance per list item, in order, on each GPU."""
    out: list[str] = []
    with host.locked() as st:
        for i, g in _enabled(st, gpus):
            table = profiles(g) or ()
            cur = gpu_state(st, g)
            for token in tokens:
                if host.has_fault(HOST_FAULT):
                    out += [
                        f"Unable to create a GPU instance on GPU {i:>2} using profile {token}: Unknown Error",
                        "Failed to create GPU instances: Unknown Error",
                    ]
                    raise MigError("\n".join(out) + "\n", RC_UNKNOWN)
                p = _profile(table, token)
                start = None if p is None else _choose(table, cur, p)
                if p is None or start is None:
                    reason, rc = (
                        ("Not Found", RC_NOT_FOUND)
                        if p is None
                        else ("Insufficient Resources", RC_INSUFFICIENT)
                    )
                    shown = token if p is None else str(p.profile_id)
                    out += [
                        f"Unable to create a GPU instance on GPU {i:>2} using profile {shown}: {reason}",
                        f"Failed to create GPU instances: {reason}",
                    ]
                    raise MigError("\n".join(out) + "\n", rc)
                gi = {
                    "id": gi_id(start, p.size),
                    "profile": p.profile_id,
                    "start": start,
                    "size": p.size,
                    "cis": [],
                }
                cur["gis"].append(gi)
                out.append(
                    f"Successfully created GPU instance ID {gi['id']:>2} on GPU {i:>2} using profile "
                    f"MIG {p.name} (ID {p.profile_id:>2})"
                )
                if with_ci:
                    gi["cis"].append(_full_ci(p))
                    out.append(_ci_line(i, gi, p.name))
    return "\n".join(out) + "\n"


def _selected_gis(
    st: dict[str, Any], gpus: Indexed, gi_ids: set[int] | None
) -> list[tuple[int, GiProfile, dict[str, Any], dict[str, Any]]]:
    """(GPU index, profile, GPU instance, the GPU's state) for the instances -gi names (all without it)."""
    chosen = []
    for i, g in _enabled(st, gpus):
        table = profiles(g) or ()
        cur = gpu_state(st, g)
        for gi in _sorted_gis(table, cur):
            if gi_ids is None or gi["id"] in gi_ids:
                chosen.append((i, _by_id(table, gi["profile"]), gi, cur))
    return chosen


def destroy_compute_instances(
    host: core.Host, gpus: Indexed, gi_ids: set[int] | None, ci_ids: set[int] | None
) -> str:
    """``nvidia-smi mig [-i IDS] [-gi IDS] [-ci IDS] -dci``."""
    out: list[str] = []
    with host.locked() as st:
        for i, _p, gi, _cur in _selected_gis(st, gpus, gi_ids):
            for ci in list(gi["cis"]):
                if ci_ids is None or ci["id"] in ci_ids:
                    gi["cis"].remove(ci)
                    out.append(
                        f"Successfully destroyed compute instance ID {ci['id']:>2} from GPU {i:>2} "
                        f"GPU instance ID {gi['id']:>2}"
                    )
    if not out:
        raise MigError("No compute instances found: Not Found\n", RC_NOT_FOUND)
    return "\n".join(out) + "\n"


def destroy_gpu_instances(host: core.Host, gpus: Indexed, gi_ids: set[int] | None) -> str:
    """``nvidia-smi mig [-i IDS] [-gi IDS] -dgi``: refused for an instance that still has compute
    instances ("In use by another client", as the real tool answers)."""
    out: list[str] = []
    with host.locked() as st:
        chosen = _selected_gis(st, gpus, gi_ids)
        if not chosen:
            raise MigError("No GPU instances found: Not Found\n", RC_NOT_FOUND)
        for i, _p, gi, cur in chosen:
            if gi["cis"]:
                out += [
                    f"Unable to destroy GPU instance ID {gi['id']:>2} from GPU {i:>2}: "
                    "In use by another client",
                    "Failed to destroy GPU instances: In use by another client",
                ]
                raise MigError("\n".join(out) + "\n", RC_IN_USE)
            cur["gis"].remove(gi)
            out.append(f"Successfully destroyed GPU instance ID {gi['id']:>2} from GPU {i:>2}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------- MIG devices


def mig_devices(st: dict[str, Any], g: dict[str, Any]) -> list[tuple[str, str]]:
    """(profile name, MIG UUID) of the GPU's MIG devices (compute instances), in device index order."""
    table = profiles(g)
    if table is None:
        return []
    cur = gpu_state(st, g)
    if not cur["current"]:
        return []
    devices = []
    for gi in sorted(cur["gis"], key=lambda gi: gi["id"]):
        for ci in gi["cis"]:
            # A stable UUID per GPU and instance (real ones are the driver's; the format is the same).
            name = uuid.uuid5(uuid.NAMESPACE_OID, f"{g['uuid']}/{gi['id']}/{ci['id']}")
            devices.append((_by_id(table, gi["profile"]).name, f"MIG-{name}"))
    return devices


def list_with_mig_devices(listing: str, st: dict[str, Any], gpus: Iterable[dict[str, Any]]) -> str:
    """``nvidia-smi -L`` from the real binary, with each GPU's MIG devices under its line
    ("  MIG 1g.18gb     Device  0: (UUID: MIG-...)", as the real tool lists them)."""
    by_uuid = {g["uuid"]: g for g in gpus}
    out = []
    for line in listing.splitlines(keepends=True):
        out.append(line)
        start = line.find("(UUID: GPU-")
        g = by_uuid.get(line[start + 7 : line.rfind(")")]) if line.startswith("GPU ") and start > 0 else None
        if g is not None:
            for n, (name, mig_uuid) in enumerate(mig_devices(st, g)):
                out.append(f"  MIG {name:<11} Device {n:>2}: (UUID: {mig_uuid})\n")
    return "".join(out)


# -------------------------------------------------------------------------------- the subcommand


@dataclass
class MigCommand:
    action: str  # cgi, dci, dgi
    ids: str | None = None  # -i
    gi_ids: set[int] | None = None
    ci_ids: set[int] | None = None
    profiles: tuple[str, ...] = ()
    default_ci: bool = False  # -C with -cgi


ACTIONS = {
    "-cgi": "cgi", "--create-gpu-instance": "cgi",
    "-dci": "dci", "--destroy-compute-instance": "dci",
    "-dgi": "dgi", "--destroy-gpu-instance": "dgi",
}  # fmt: skip
# What a change is called in nvidia-smi's "Failed to ...: <reason>" lines.
CHANGES = {"cgi": "create GPU instances", "dci": "destroy compute instances", "dgi": "destroy GPU instances"}
INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
NOT_SIMULATED = (
    "-lgip", "--list-gpu-instance-profiles", "-lgipp", "--list-gpu-instance-possible-placements", "-lgi",
    "--list-gpu-instances", "-lci", "--list-compute-instances", "-cci", "--create-compute-instance",
)  # fmt: skip


def _ids(value: str) -> set[int]:
    try:
        return {int(v) for v in value.split(",") if v.strip()}
    except ValueError:
        raise MigError(INVALID, RC_ARGS) from None


def parse_args(argv: list[str]) -> MigCommand:
    """The arguments after ``nvidia-smi mig`` (``-i`` may also come before ``mig``; the caller merges)."""
    args = list(argv)
    cmd = MigCommand("")
    while args:
        a = args.pop(0)
        name, eq, inline = a.partition("=")
        value = inline if eq else None
        if name in NOT_SIMULATED:
            raise MigError(f"gpuprov lab: nvidia-smi mig {name} is not simulated\n", RC_ARGS)
        if name in ACTIONS:
            if cmd.action:
                raise MigError(INVALID, RC_ARGS)
            cmd.action = ACTIONS[name]
            if cmd.action == "cgi":
                value = value if value is not None else (args.pop(0) if args else "")
                cmd.profiles = tuple(v for v in value.split(",") if v.strip())
                if not cmd.profiles:
                    raise MigError(INVALID, RC_ARGS)
            continue
        if name in ("-i", "--id", "-gi", "--gpu-instance-id", "-ci", "--compute-instance-id"):
            value = value if value is not None else (args.pop(0) if args else "")
            if not value:
                raise MigError(INVALID, RC_ARGS)
            if name in ("-i", "--id"):
                cmd.ids = value
            elif name in ("-gi", "--gpu-instance-id"):
                cmd.gi_ids = _ids(value)
            else:
                cmd.ci_ids = _ids(value)
        elif name in ("-C", "--default-compute-instance"):
            cmd.default_ci = True
        else:
            raise MigError(INVALID, RC_ARGS)
    if not cmd.action or (cmd.default_ci and cmd.action != "cgi"):
        raise MigError(INVALID, RC_ARGS)
    return cmd


def run(host: core.Host, cmd: MigCommand, gpus: Indexed) -> str:
    """Carry out a parsed ``nvidia-smi mig`` command on the selected GPUs; the text, or MigError."""
    if _unprivileged(host):
        raise MigError(f"Failed to {CHANGES[cmd.action]}: Insufficient Permissions\n", RC_NO_PERMISSION)
    if cmd.action == "cgi":
        return create_gpu_instances(host, gpus, list(cmd.profiles), cmd.default_ci)
    if cmd.action == "dci":
        return destroy_compute_instances(host, gpus, cmd.gi_ids, cmd.ci_ids)
    return destroy_gpu_instances(host, gpus, cmd.gi_ids)
