"""MIG layouts: nvidia-mig-parted's configuration format, checked against each GPU's real profile table.

A MIG layout is a named configuration in nvidia-mig-parted's ``version: v1`` format (NVIDIA's own
defaults ship with it as config-default.yaml: ``all-1g.18gb``, ``all-balanced``, ...). mig-parted's parser
checks the file's structure but not whether a GPU has the profiles it names (a made-up ``9g.99gb``
passes), so the driver refuses the layout only once gpuprov is already rolling it out. This module
checks, before anything is touched: the structure (the fields mig-parted knows), that every profile
exists on the GPU, that no profile is asked for more often than the GPU offers it, that the instances fit
the GPU's 7 compute and 8 memory slices, and the driver branch that supports MIG on the GPU. A layout no
GPU with a table here could hold is refused even before any host is known (offline_problems).

The profile tables are NVIDIA's ("Supported MIG Profiles", NVIDIA Multi-Instance GPU User Guide), keyed
by PCI device id as mig-parted's ``device-filter`` writes it (``0x233510DE``: device 0x2335, vendor
0x10DE). Placement rules finer than the slice counts are the driver's; a layout that passes here can
still be refused there, never the other way round.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.yamlfile import described, load_strict

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
# The GPU Operator MIG manager's node labels (NVIDIA mig-parted k8s-mig-manager): the layout wanted, and
# how applying it went (pending, rebooting, success, failed).
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
MIG_OFF = "all-disabled"


@dataclass(frozen=True)
class Profile:
    name: str
    max_count: int  # instances of this profile one GPU can hold
    compute: int  # compute slices (the "Ng" of the name)
    memory: int  # memory slices out of MEMORY_SLICES


@dataclass(frozen=True)
class MigGpu:
    name: str
    min_branch: int  # the first driver branch with MIG on this GPU
    profiles: Mapping[str, Profile]


def _table(name: str, min_branch: int, rows: list[tuple[str, int, int]]) -> MigGpu:
    """rows: (profile, max count, memory slices); compute slices come from the profile's name."""
    profiles = {p: Profile(p, count, int(p.split("g.", 1)[0]), mem) for p, count, mem in rows}
    return MigGpu(name, min_branch, profiles)


def _a100_like(name: str, min_branch: int, unit: int) -> MigGpu:
    """A100 and H100 80GB share one layout; sizes scale with the memory per slice (`unit` GB)."""
    half, full, whole = unit * 2, unit * 4, unit * 8
    return _table(
        name,
        min_branch,
        [
            (f"1g.{unit}gb", 7, 1),
            (f"1g.{unit}gb+me", 1, 1),
            (f"1g.{half}gb", 4, 2),
            (f"2g.{half}gb", 3, 2),
            (f"3g.{full}gb", 2, 4),
            (f"4g.{full}gb", 1, 4),
            (f"7g.{whole}gb", 1, 8),
        ],
    )


_H200 = _table(
    "NVIDIA H200 141GB",
    550,
    [
        ("1g.18gb", 7, 1),
        ("1g.18gb+me", 1, 1),
        ("1g.35gb", 4, 2),
        ("2g.35gb", 3, 2),
        ("3g.71gb", 2, 4),
        ("4g.71gb", 1, 4),
        ("7g.141gb", 1, 8),
    ],
)

# PCI device id → the GPU's MIG profiles.
GPUS: dict[int, MigGpu] = {
    0x20B0: _a100_like("NVIDIA A100-SXM4-40GB", 450, 5),
    0x20B2: _a100_like("NVIDIA A100-SXM4-80GB", 450, 10),
    0x2330: _a100_like("NVIDIA H100 80GB HBM3", 525, 10),
    0x2335: _H200,
}

# `nvidia-smi mig -lgip` (the GPU instance profiles) and `-lgipp` (their placements), as the driver prints
# them; both answer with MIG mode off. Read from a real H200 (driver 580.159.04).
# Numbers are ASCII digits of the length the driver prints (`\d` would take other scripts' digits, and
# thousands of digits are no count): a row with anything else is not read as a profile.
_LGIP_ROW = re.compile(
    r"^\|\s*(?P<gpu>[0-9]{1,4})\s+MIG\s+(?P<name>[0-9]{1,2}g\.[0-9]{1,4}gb(?:\+me)?)\s+(?P<id>[0-9]{1,4})\s+"
    r"(?P<free>[0-9]{1,3})/(?P<total>[0-9]{1,3})\s+(?P<mem>[0-9]{1,6}(?:\.[0-9]{1,3})?)\s+(?:Yes|No)\s+"
    r"(?P<sm>[0-9]{1,5})\s"
)
_LGIPP_ROW = re.compile(
    r"^GPU\s+(?P<gpu>[0-9]{1,4})\s+Profile ID\s+(?P<id>[0-9]{1,4})\s+Placements?\s*:\s*"
    r"(?P<starts>\{(?:[0-9]{1,2}(?:,[0-9]{1,2})*)?\}):(?P<size>[0-9]{1,2})\s*$"
)
# How a row of each starts, whatever its numbers: such a row that does not read is an error, not skipped.
_LGIP_ROW_START = re.compile(r"^\|\s*\S+\s+MIG\s")
_LGIPP_ROW_START = re.compile(r"^GPU\s+\S+\s+Profile ID\s")


@dataclass(frozen=True)
class ReadProfile:
    """One GPU instance profile as the driver reports it."""

    name: str
    profile_id: int
    instances: int  # Free/Total's total
    memory_gib: float
    sms: int
    memory_slices: int  # the placement size from -lgipp
    placements: tuple[int, ...]  # the memory slice each instance may start at


def parse_profiles(lgip: str, lgipp: str, gpu: int = 0) -> dict[str, ReadProfile]:
    """GPU `gpu`'s MIG profiles from `nvidia-smi mig -lgip` and `-lgipp`; ValueError on other text."""
    rows = []
    for line in lgip.splitlines():
        m = _LGIP_ROW.match(line)
        if not m and _LGIP_ROW_START.match(line):
            raise ValueError(f"nvidia-smi mig -lgip: a profile row that is not one: {line[:60]!r}")
        if m and int(m["gpu"]) == gpu:
            rows.append(m)
    if not rows:
        raise ValueError(f"nvidia-smi mig -lgip: no GPU instance profile listed for GPU {gpu}")
    placements: dict[int, tuple[tuple[int, ...], int]] = {}
    for line in lgipp.splitlines():
        m = _LGIPP_ROW.match(line.strip())
        if not m and _LGIPP_ROW_START.match(line.strip()):
            raise ValueError(f"nvidia-smi mig -lgipp: a placement row that is not one: {line[:60]!r}")
        if m and int(m["gpu"]) == gpu:
            starts = tuple(int(x) for x in m["starts"].strip("{}").split(",") if x)
            placements[int(m["id"])] = (starts, int(m["size"]))
    out: dict[str, ReadProfile] = {}
    for m in rows:
        pid = int(m["id"])
        if pid not in placements:
            raise ValueError(f"nvidia-smi mig -lgipp: no placement for profile {pid} ({m['name']})")
        starts, size = placements[pid]
        out[m["name"]] = ReadProfile(
            m["name"], pid, int(m["total"]), float(m["mem"]), int(m["sm"]), size, starts
        )
    return out


def table_from_profiles(name: str, min_branch: int, read: Mapping[str, ReadProfile]) -> MigGpu:
    """A profile table (as GPUS holds them) built from what a GPU reported."""
    return _table(name, min_branch, [(p.name, p.instances, p.memory_slices) for p in read.values()])


_CONFIG_KEYS = {"devices", "mig-enabled", "mig-devices", "device-filter"}
# A GPU index nvidia-smi could print (provisioner.hostnumbers.is_index's bound).
MAX_GPU_INDEX = 4095
# A count of instances is bounded before any arithmetic; how many of a profile a GPU holds (7 at most)
# is its profile table's to say (check_layout, offline_problems), with a message naming the GPU.
MAX_COUNT = 4095
# A MIG profile's name as mig-parted takes it: an optional compute-instance part (1c.), the GPU instance's
# compute slices and memory, an optional extension (1g.18gb+me).
_PROFILE_NAME = re.compile(r"([0-9]{1,2}c\.)?[0-9]{1,2}g\.[0-9]{1,4}gb([+-][a-z.]{1,12})?")
_FILTER = re.compile(r"0x([0-9A-Fa-f]{4})([0-9A-Fa-f]{4})")


@dataclass(frozen=True)
class MigEntry:
    devices: str | tuple[int, ...]  # "all" or GPU indices
    enabled: bool
    mig_devices: Mapping[str, int]
    device_ids: tuple[int, ...]  # empty: every GPU

    def applies_to(self, device_id: int) -> bool:
        return not self.device_ids or device_id in self.device_ids


def parse_config(text: str, path: Path | str) -> dict[str, list[MigEntry]]:
    """A mig-parted `version: v1` file: config name → entries; InputError naming the file and field."""
    doc = load_strict(text, path)
    if not isinstance(doc, dict) or doc.get("version") != "v1":
        raise InputError(f"{path}: a MIG configuration file starts with `version: v1`")
    extra = set(doc) - {"version", "mig-configs"}
    if extra:
        raise InputError(f"{path}: unexpected field: {sorted(extra)[0]}")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise InputError(f"{path}: mig-configs: expected a mapping of configuration name → entries")
    out: dict[str, list[MigEntry]] = {}
    for name, entries in configs.items():
        where = f"{path}: mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise InputError(f"{where}: expected a list of entries")
        out[str(name)] = [_entry(e, f"{where}[{i}]") for i, e in enumerate(entries)]
    return out


def _entry(raw: Any, where: str) -> MigEntry:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a mapping")
    extra = set(raw) - _CONFIG_KEYS
    if extra:
        raise InputError(f"{where}: unexpected field: {sorted(extra)[0]}")
    devices = raw.get("devices")
    if devices == "all":
        picked: str | tuple[int, ...] = "all"
    elif isinstance(devices, list) and devices and all(_is_gpu_index(d) for d in devices):
        picked = tuple(devices)
    else:
        raise InputError(
            f"{where}.devices: expected `all` or a list of GPU indices (0-{MAX_GPU_INDEX}), "
            f"got {described(devices)}"
        )
    enabled = raw.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise InputError(f"{where}.mig-enabled: expected true or false, got {described(enabled)}")
    mig_devices = raw.get("mig-devices")
    mig_devices = {} if mig_devices is None else mig_devices
    if not isinstance(mig_devices, dict):
        raise InputError(f"{where}.mig-devices: expected profile name → count, got {described(mig_devices)}")
    for profile, count in mig_devices.items():
        if not isinstance(profile, str) or not _PROFILE_NAME.fullmatch(profile):
            raise InputError(f"{where}.mig-devices: {described(profile)} is no MIG profile such as 1g.18gb")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            why = f"expected a count from 0 to {MAX_COUNT}, got {described(count)}"
            raise InputError(f"{where}.mig-devices.{profile}: {why}")
    if mig_devices and not enabled:
        raise InputError(f"{where}: mig-devices given with mig-enabled: false")
    filters = raw.get("device-filter") or []
    filters = [filters] if isinstance(filters, str) else filters
    ids = []
    for f in filters:
        m = _FILTER.fullmatch(str(f))
        if not m:
            raise InputError(f"{where}.device-filter: {str(f)[:40]!r} is not a PCI id like 0x233510DE")
        ids.append(int(m.group(1), 16))
    return MigEntry(picked, enabled, dict(mig_devices), tuple(ids))


def _is_gpu_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GPU_INDEX


def check_layout(
    configs: Mapping[str, list[MigEntry]],
    name: str,
    *,
    device_id: int,
    gpu_count: int,
    driver_branch: int | None = None,
) -> list[str]:
    """Why layout `name` cannot be applied to a host with `gpu_count` GPUs of `device_id` (empty: it can)."""
    if name not in configs:
        return [f"no MIG configuration named {name!r} (known: {', '.join(sorted(configs)[:20])})"]
    entries = [e for e in configs[name] if e.applies_to(device_id)]
    if not entries:
        return [f"{name}: no entry for this GPU (device 0x{device_id:04X}; the entries filter other devices)"]
    gpu = GPUS.get(device_id)
    problems: list[str] = []
    if any(e.enabled for e in entries):
        if gpu is None:
            return [f"{name}: enables MIG on device 0x{device_id:04X}, which has no MIG profile table here"]
        if driver_branch is not None and driver_branch < gpu.min_branch:
            problems.append(
                f"{name}: {gpu.name} has MIG from driver branch {gpu.min_branch}, not {driver_branch}"
            )
    for entry in entries:
        if entry.devices != "all":
            beyond = [d for d in entry.devices if d >= gpu_count]
            if beyond:
                problems.append(f"{name}: GPU index {beyond[0]} does not exist (the host has {gpu_count})")
        if not entry.enabled or gpu is None:
            continue
        problems.extend(f"{name}: {why}" for why in _fit_problems(entry, gpu))
    return problems


def _fit_problems(entry: MigEntry, gpu: MigGpu) -> list[str]:
    """Why one GPU of `gpu`'s kind cannot hold the instances the entry asks for (empty: it can)."""
    problems: list[str] = []
    compute = memory = 0
    for profile, count in entry.mig_devices.items():
        p = gpu.profiles.get(profile)
        if p is None:
            known = ", ".join(gpu.profiles)
            problems.append(f"{gpu.name} has no MIG profile {profile!r} (it has {known})")
            continue
        if count > p.max_count:
            problems.append(f"{gpu.name} holds at most {p.max_count} × {profile}, not {count}")
        compute += p.compute * count
        memory += p.memory * count
    if compute > COMPUTE_SLICES or memory > MEMORY_SLICES:
        problems.append(
            f"the instances need {compute} compute and {memory} memory slices; "
            f"a {gpu.name} has {COMPUTE_SLICES} and {MEMORY_SLICES}"
        )
    return problems


def offline_problems(configs: Mapping[str, list[MigEntry]]) -> list[str]:
    """Why a layout's entry could be held by no GPU whose profile table gpuprov has, judged without any
    host: an entry for some devices (device-filter) against those devices' tables, an entry for every
    GPU against each table. An entry only for GPUs gpuprov has no table for is left to the driver, and
    each host's own GPUs are judged again (check_layout) before its layout is applied."""
    problems: list[str] = []
    for name, entries in configs.items():
        for i, entry in enumerate(entries):
            if not entry.enabled or not entry.mig_devices:
                continue
            ids = entry.device_ids or tuple(GPUS)
            gpus = [GPUS[d] for d in ids if d in GPUS]
            if not gpus:
                continue
            verdicts = [_fit_problems(entry, gpu) for gpu in gpus]
            if all(verdicts):
                problems.append(f"mig-configs.{name}[{i}]: {_closest(entry, gpus, verdicts)}")
    return problems


def _closest(entry: MigEntry, gpus: list[MigGpu], verdicts: list[list[str]]) -> str:
    """What to say of an entry no GPU holds: a profile none of them has, else the problems of a GPU
    that has every profile asked for, else that no one GPU has them all."""
    known = {p for gpu in gpus for p in gpu.profiles}
    unknown = [p for p in entry.mig_devices if p not in known]
    if unknown:
        names = ", ".join(gpu.name for gpu in gpus)
        return f"no GPU gpuprov knows ({names}) has MIG profile {unknown[0]!r}"
    for gpu, why in zip(gpus, verdicts, strict=True):
        if all(p in gpu.profiles for p in entry.mig_devices):
            return "; ".join(why)
    return f"no GPU has every profile of {', '.join(entry.mig_devices)}: " + "; ".join(verdicts[0])


def wanted_devices(entries: list[MigEntry], gpus: Mapping[int, int]) -> dict[int, dict[str, int] | None]:
    """What a layout's entries ask of each GPU (index → device id): profile → count, or None for MIG off.

    Entries apply in order and a later one that selects the same GPU wins, as mig-parted applies them one
    after the other. A GPU no entry selects keeps MIG off (absent from the answer)."""
    out: dict[int, dict[str, int] | None] = {}
    for entry in entries:
        for index, device_id in gpus.items():
            if entry.devices != "all" and index not in entry.devices:
                continue
            if not entry.applies_to(device_id):
                continue
            out[index] = dict(entry.mig_devices) if entry.enabled else None
    return out


def single_strategy_problem(wanted: Mapping[int, dict[str, int] | None]) -> str | None:
    """Why the layout cannot be advertised under the single strategy (None: it can). The device plugin's
    single strategy exposes MIG devices as nvidia.com/gpu and requires every GPU of the node to be MIG
    enabled with one and the same profile (NVIDIA k8s-device-plugin, docs on MIG strategies)."""
    profiles = {p for counts in wanted.values() if counts for p, n in counts.items() if n}
    disabled = [i for i, counts in wanted.items() if counts is None]
    if not profiles:
        return None
    if len(profiles) > 1:
        return f"mixes profiles {', '.join(sorted(profiles))} on one node: needs mig strategy mixed"
    if disabled:
        return f"leaves GPU {disabled[0]} without MIG next to MIG devices: needs mig strategy mixed"
    return None


# `nvidia-smi -L`: a GPU line, then its MIG devices indented under it.
_L_GPU = re.compile(r"^GPU (?P<index>[0-9]{1,4}): ")
_L_MIG = re.compile(
    r"^\s+MIG (?P<profile>[0-9]{1,2}g\.[0-9]{1,4}gb(?:\+me)?)\s+Device\s+(?P<dev>[0-9]{1,4}): "
)


def parse_mig_devices(listing: str) -> dict[int, dict[str, int]]:
    """GPU index → MIG profile → devices, from `nvidia-smi -L` (GPUs without MIG devices map to {}).
    ValueError on a GPU line whose index is not a GPU index: the MIG lines under it belong to no GPU
    this listing names, and counting them on the GPU above would be wrong."""
    out: dict[int, dict[str, int]] = {}
    current: int | None = None
    for line in listing.splitlines():
        m = _L_GPU.match(line)
        if m:
            current = int(m["index"])
            out[current] = {}
            continue
        if line.startswith("GPU "):
            raise ValueError(f"nvidia-smi -L: not a GPU index: {line[:40]!r}")
        m = _L_MIG.match(line)
        if m and current is not None:
            counts = out[current]
            counts[m["profile"]] = counts.get(m["profile"], 0) + 1
    return out
