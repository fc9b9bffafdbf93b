"""Part of the gpuprov lab simulation: per-host hardware profiles.

A profile is the GPU side of a lab host's "hardware": which GPUs sit at which PCI addresses, what they
are (device id, name, architecture, memory, VBIOS, power and link limits) and which NVSwitch devices
share the bus. The ``h200`` model is taken from the real H200 capture in
shared/fixtures/hosts/h200-ubuntu2404/; the others carry the real PCI ids, names and limits of
those boards. :func:`profile_document` is what the lab writes as /etc/gpuprov-lab/profile.json, and
everything inside the host (sysfs, nvidia-smi, dmesg, DCGM, fabric manager) answers from it.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT = 1


@dataclass(frozen=True)
class GpuModel:
    """One board type, as nvidia-smi and the PCI bus describe it."""

    name: str  # product_name
    device_id: int  # PCI device id (vendor 0x10de)
    subsystem_id: int  # PCI subsystem device id (subsystem vendor 0x10de)
    architecture: str  # product_architecture
    compute_cap: str
    memory_mib: int  # fb_memory_usage/total
    reserved_mib: int
    bar1_mib: int
    vbios: str
    board_part_number: str
    gpu_part_number: str
    inforom_image: str
    inforom_ecc: str
    power_limit_w: float
    power_min_w: float
    idle_power_w: float
    link_gen_max: int
    link_width_max: int
    max_graphics_mhz: int
    max_mem_mhz: int
    max_video_mhz: int
    idle_graphics_mhz: int
    idle_video_mhz: int
    temp_c: int
    mem_temp_c: int | None
    pci_class: int = 0x030200  # 3D controller
    revision: int = 0xA1
    ecc: bool = True
    multigpu_board: bool = False


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: GpuModel | None
    gpu_addresses: tuple[str, ...] = ()
    gpu_numa: tuple[int, ...] = ()
    nvswitch_addresses: tuple[str, ...] = ()
    nvswitch_device_id: int = 0x22A3
    nvswitch_subsystem_id: int = 0x1796
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_addresses)

    @property
    def nvswitch_count(self) -> int:
        return len(self.nvswitch_addresses)

    @property
    def needs_fabric_manager(self) -> bool:
        return self.nvswitch_count > 0


H200 = GpuModel(
    name="NVIDIA H200",
    device_id=0x2335,
    subsystem_id=0x18BF,
    architecture="Hopper",
    compute_cap="9.0",
    memory_mib=143771,
    reserved_mib=616,
    bar1_mib=262144,
    vbios="96.00.A5.00.1A",
    board_part_number="692-2G520-0282-001",
    gpu_part_number="2335-895-A1",
    inforom_image="G520.0282.02.02",
    inforom_ecc="7.16",
    power_limit_w=700.0,
    power_min_w=200.0,
    idle_power_w=77.72,
    link_gen_max=5,
    link_width_max=16,
    max_graphics_mhz=1980,
    max_mem_mhz=3201,
    max_video_mhz=1545,
    idle_graphics_mhz=345,
    idle_video_mhz=765,
    temp_c=36,
    mem_temp_c=38,
)

H100_SXM = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    device_id=0x2330,
    subsystem_id=0x16C1,
    architecture="Hopper",
    compute_cap="9.0",
    memory_mib=81559,
    reserved_mib=551,
    bar1_mib=131072,
    vbios="96.00.99.00.01",
    board_part_number="692-2G520-0200-000",
    gpu_part_number="2330-885-A1",
    inforom_image="G520.0200.00.05",
    inforom_ecc="7.16",
    power_limit_w=700.0,
    power_min_w=200.0,
    idle_power_w=71.4,
    link_gen_max=5,
    link_width_max=16,
    max_graphics_mhz=1980,
    max_mem_mhz=2619,
    max_video_mhz=1755,
    idle_graphics_mhz=345,
    idle_video_mhz=765,
    temp_c=31,
    mem_temp_c=40,
)

A100_SXM4 = GpuModel(
    name="NVIDIA A100-SXM4-80GB",
    device_id=0x20B2,
    subsystem_id=0x1463,
    architecture="Ampere",
    compute_cap="8.0",
    memory_mib=81920,
    reserved_mib=475,
    bar1_mib=131072,
    vbios="92.00.45.00.03",
    board_part_number="692-2G506-0210-002",
    gpu_part_number="20B2-895-A1",
    inforom_image="G506.0210.00.04",
    inforom_ecc="6.16",
    power_limit_w=400.0,
    power_min_w=100.0,
    idle_power_w=61.2,
    link_gen_max=4,
    link_width_max=16,
    max_graphics_mhz=1410,
    max_mem_mhz=1593,
    max_video_mhz=1290,
    idle_graphics_mhz=210,
    idle_video_mhz=795,
    temp_c=29,
    mem_temp_c=33,
)

L40S = GpuModel(
    name="NVIDIA L40S",
    device_id=0x26B9,
    subsystem_id=0x1851,
    architecture="Ada Lovelace",
    compute_cap="8.9",
    memory_mib=46068,
    reserved_mib=573,
    bar1_mib=65536,
    vbios="95.02.66.00.02",
    board_part_number="900-2G133-0080-000",
    gpu_part_number="26B9-896-A1",
    inforom_image="G133.0242.00.03",
    inforom_ecc="6.16",
    power_limit_w=350.0,
    power_min_w=100.0,
    idle_power_w=33.6,
    link_gen_max=4,
    link_width_max=16,
    max_graphics_mhz=2520,
    max_mem_mhz=9001,
    max_video_mhz=1965,
    idle_graphics_mhz=210,
    idle_video_mhz=1185,
    temp_c=27,
    mem_temp_c=None,
)

PROFILES: dict[str, Profile] = {
    "h200": Profile(
        "h200",
        "1x NVIDIA H200 (the real capture: a VM with the GPU passed through at 0000:00:06.0)",
        H200,
        gpu_addresses=("0000:00:06.0",),
        gpu_numa=(0,),
    ),
    "h100-sxm-8": Profile(
        "h100-sxm-8",
        "HGX H100 8-GPU: 8x H100 SXM5 80GB and 4 NVSwitch (fabric manager required)",
        H100_SXM,
        gpu_addresses=(
            "0000:18:00.0",
            "0000:2a:00.0",
            "0000:3a:00.0",
            "0000:5d:00.0",
            "0000:9a:00.0",
            "0000:ab:00.0",
            "0000:ba:00.0",
            "0000:db:00.0",
        ),
        gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
        nvswitch_addresses=("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"),
    ),
    "a100-4": Profile(
        "a100-4",
        "HGX A100 4-GPU: 4x A100 SXM4 80GB, NVLink without NVSwitch (row remapping)",
        A100_SXM4,
        gpu_addresses=("0000:01:00.0", "0000:41:00.0", "0000:81:00.0", "0000:c1:00.0"),
        gpu_numa=(0, 0, 1, 1),
    ),
    "l40s": Profile(
        "l40s",
        "1x NVIDIA L40S PCIe (Ada Lovelace), no NVSwitch",
        L40S,
        gpu_addresses=("0000:4b:00.0",),
        gpu_numa=(0,),
    ),
    "cpu": Profile("cpu", "no GPU (Kubernetes control plane)", None),
}

# Devices every lab host has besides its GPUs, so the bus is never empty (lspci -Dnn shape).
BASE_DEVICES: list[dict[str, Any]] = [
    {
        "address": "0000:00:00.0",
        "vendor_id": "0x8086",
        "device_id": "0x1237",
        "subsystem_vendor_id": "0x1af4",
        "subsystem_device_id": "0x1100",
        "class": "0x060000",
        "revision": "0x02",
    },
    {
        "address": "0000:00:01.0",
        "vendor_id": "0x8086",
        "device_id": "0x7000",
        "subsystem_vendor_id": "0x1af4",
        "subsystem_device_id": "0x1100",
        "class": "0x060100",
        "revision": "0x00",
    },
]


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


def link_speed(gen: int) -> str:
    """sysfs current_link_speed/max_link_speed text for a PCIe generation."""
    return {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe"}.get(
        gen, "32.0 GT/s PCIe" if gen == 5 else "64.0 GT/s PCIe"
    )


def profile_document(name: str, hostname: str) -> dict[str, Any]:
    """/etc/gpuprov-lab/profile.json for a host (JSON types only, so it compares equal after a round trip)."""
    if name not in PROFILES:
        raise KeyError(f"unknown lab hardware profile {name!r} (known: {', '.join(sorted(PROFILES))})")
    p = PROFILES[name]
    gpus: list[dict[str, Any]] = []
    if p.model is not None:
        m = p.model
        for index, address in enumerate(p.gpu_addresses):
            bus = int(address.split(":")[1], 16)
            dev = int(address.split(":")[2].split(".")[0], 16)
            skip = ("device_id", "subsystem_id", "pci_class", "revision")
            model = {k: v for k, v in asdict(m).items() if k not in skip}
            gpus.append(
                {
                    "index": index,
                    "minor_number": index,
                    "pci_address": address,
                    "bus_id": _bus_id(address),
                    "vendor_id": "0x10de",
                    "device_id": f"0x{m.device_id:04x}",
                    "subsystem_vendor_id": "0x10de",
                    "subsystem_device_id": f"0x{m.subsystem_id:04x}",
                    "class": f"0x{m.pci_class:06x}",
                    "revision": f"0x{m.revision:02x}",
                    "numa_node": p.gpu_numa[index] if index < len(p.gpu_numa) else 0,
                    "uuid": gpu_uuid(hostname, index),
                    "serial": _serial(hostname, index),
                    "board_id": f"0x{(bus << 8 | dev << 3) if bus else dev:x}",
                    "module_id": index + 1,
                    **model,
                }
            )
    switches = [
        {
            "index": i,
            "pci_address": address,
            "vendor_id": "0x10de",
            "device_id": f"0x{p.nvswitch_device_id:04x}",
            "subsystem_vendor_id": "0x10de",
            "subsystem_device_id": f"0x{p.nvswitch_subsystem_id:04x}",
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
        "other_devices": [dict(d) for d in BASE_DEVICES],
    }
