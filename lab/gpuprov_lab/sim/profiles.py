"""Part of the gpuprov lab simulation: per-host hardware profiles (the data: profiles.yaml).

A profile is the GPU side of a lab host's "hardware": which GPUs sit at which PCI addresses, what they
are (device id, name, architecture, memory, VBIOS, power and link limits) and which NVSwitch devices
share the bus. :func:`profile_document` is what the lab writes as /etc/gpuprov-lab/profile.json, and
everything inside the host (sysfs, nvidia-smi, dmesg, DCGM, fabric manager) answers from it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FORMAT = 1
NVSWITCH_DEVICE_ID, NVSWITCH_SUBSYSTEM_ID = 0x22A3, 0x1796
_DATA = yaml.safe_load((Path(__file__).parent / "profiles.yaml").read_text())


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: dict[str, Any] | None
    gpu_addresses: tuple[str, ...] = ()
    gpu_numa: tuple[int, ...] = ()
    nvswitch_addresses: tuple[str, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_addresses)

    @property
    def needs_fabric_manager(self) -> bool:
        return bool(self.nvswitch_addresses)


PROFILES: dict[str, Profile] = {
    name: Profile(
        name,
        p["description"],
        _DATA["models"][p["model"]] if "model" in p else None,
        tuple(p.get("gpu_addresses", ())),
        tuple(p.get("gpu_numa", ())),
        tuple(p.get("nvswitch_addresses", ())),
    )
    for name, p in _DATA["profiles"].items()
}


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\0".join(parts).encode()).digest()


def gpu_uuid(hostname: str, index: int) -> str:
    """GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, stable for a host and GPU index."""
    h = _digest("uuid", hostname, str(index)).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _serial(hostname: str, index: int) -> str:
    return str(1650000000000 + int.from_bytes(_digest("serial", hostname, str(index))[:4], "big") % 10**9)


def _bus_id(address: str) -> str:
    """0000:18:00.0 → 00000000:18:00.0 (nvidia-smi's form)."""
    domain, rest = address.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def _gpu(m: dict[str, Any], p: Profile, index: int, address: str, hostname: str) -> dict[str, Any]:
    bus = int(address.split(":")[1], 16)
    dev = int(address.split(":")[2].split(".")[0], 16)
    model = {k: v for k, v in m.items() if k not in ("device_id", "subsystem_id", "pci_class", "revision")}
    return {
        "index": index,
        "minor_number": index,
        "pci_address": address,
        "bus_id": _bus_id(address),
        "vendor_id": "0x10de",
        "device_id": f"0x{m['device_id']:04x}",
        "subsystem_vendor_id": "0x10de",
        "subsystem_device_id": f"0x{m['subsystem_id']:04x}",
        "class": f"0x{m.get('pci_class', 0x030200):06x}",
        "revision": f"0x{m.get('revision', 0xA1):02x}",
        "numa_node": p.gpu_numa[index] if index < len(p.gpu_numa) else 0,
        "uuid": gpu_uuid(hostname, index),
        "serial": _serial(hostname, index),
        "board_id": f"0x{(bus << 8 | dev << 3) if bus else dev:x}",
        "module_id": index + 1,
        "ecc": True,
        "mem_temp_c": None,
        **model,
    }


def profile_document(name: str, hostname: str) -> dict[str, Any]:
    """/etc/gpuprov-lab/profile.json for a host (JSON types only, so it compares equal after a round trip)."""
    if name not in PROFILES:
        raise KeyError(f"unknown lab hardware profile {name!r} (known: {', '.join(sorted(PROFILES))})")
    p = PROFILES[name]
    gpus = [_gpu(p.model, p, i, a, hostname) for i, a in enumerate(p.gpu_addresses)] if p.model else []
    switches = [
        {
            "index": i,
            "pci_address": address,
            "vendor_id": "0x10de",
            "device_id": f"0x{NVSWITCH_DEVICE_ID:04x}",
            "subsystem_vendor_id": "0x10de",
            "subsystem_device_id": f"0x{NVSWITCH_SUBSYSTEM_ID:04x}",
            "class": "0x068000",
            "revision": "0xa1",
            "numa_node": 0,
        }
        for i, address in enumerate(p.nvswitch_addresses)
    ]
    return {
        "format": FORMAT,
        "simulated": "gpuprov lab hardware profile (SIMULATED)",
        "hostname": hostname,
        "profile": name,
        "description": p.description,
        "gpu_count": p.gpu_count,
        "gpus": gpus,
        "nvswitches": switches,
        "fabric_manager_required": p.needs_fabric_manager,
        "other_devices": [dict(d) for d in _DATA["other_devices"]],
    }
