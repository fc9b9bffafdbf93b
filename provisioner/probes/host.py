"""host-facts.json, the preflight role's own host probe: the PCI functions (the GPUs and NVSwitches on the
bus), the loaded kernel modules, the loaded NVIDIA driver and Secure Boot; and the five files that held
these facts in snapshots made before it, which replaying such a snapshot still reads."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from provisioner.hosttext import first_line
from provisioner.probes.base import SKIP, HostFacts, ParseError, Probe, Unavailable, parse_json_object

# PCI functions, loaded kernel modules, the loaded driver and Secure Boot come from the preflight role's
# own host probe (roles/preflight/files/gpu_host_facts.py, standard library only, Python 3.8+), so the
# role and verification read these facts one way. The probe scripts' functions are indented, which a
# heredoc would carry into Python: the file travels base64-encoded on one line instead.
HOST_FACTS = "host-facts.json"
HOST_FACTS_SECTIONS = "pci,modules,driver,secure_boot"


def _host_facts_body() -> str:
    import base64

    from provisioner.content import ROLES_DIR

    source = (ROLES_DIR / "preflight" / "files" / "gpu_host_facts.py").read_bytes()
    encoded = base64.b64encode(source).decode()
    return (
        'command -v python3 >/dev/null 2>&1 || { echo "python3 not found" >&2; return 127; }\n'
        f"printf '%s' '{encoded}' | base64 -d | t 20 python3 - --sections {HOST_FACTS_SECTIONS} --all-pci"
    )


PCI_DEVICES = "pci-devices.txt"
PROC_DRIVER_VERSION = "proc-driver-nvidia-version"
SYS_MODULE_VERSION = "sys-module-nvidia-version"
MODULES = "modules.txt"
SECUREBOOT = "secureboot.txt"

_PCI_FROM_SYSFS = r"""
    if command -v lspci >/dev/null 2>&1; then lspci -Dnn; return; fi
    for d in /sys/bus/pci/devices/*; do
      [ -r "$d/class" ] || continue
      read c <"$d/class"; read v <"$d/vendor"; read i <"$d/device"; r=
      [ -r "$d/revision" ] && read r <"$d/revision"
      c=${c#0x}; c=${c%??}; v=${v#0x}; i=${i#0x}; r=${r#0x}
      case $c in
        0300) n="VGA compatible controller";; 0302) n="3D controller";; 0380) n="Display controller";;
        0680) n="Bridge";; 0604) n="PCI bridge";; 0600) n="Host bridge";; 0601) n="ISA bridge";;
        0200) n="Ethernet controller";; 0207) n="Infiniband controller";;
        0108) n="Non-Volatile memory controller";;
        0106) n="SATA controller";; 0100) n="SCSI storage controller";; 0c03) n="USB controller";;
        *) n="Class $c";;
      esac
      case $v in 10de) vn="NVIDIA Corporation";; 8086) vn="Intel Corporation";;
        15b3) vn="Mellanox Technologies";;
        1af4) vn="Red Hat, Inc.";; 1022) vn="Advanced Micro Devices, Inc. [AMD]";; *) vn="Device";; esac
      if [ -n "$r" ]; then
        printf '%s %s [%s]: %s Device [%s:%s] (rev %s)\n' "${d##*/}" "$n" "$c" "$vn" "$v" "$i" "$r"
      else
        printf '%s %s [%s]: %s Device [%s:%s]\n' "${d##*/}" "$n" "$c" "$vn" "$v" "$i"
      fi
    done
"""

_SECUREBOOT = r"""
    if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state; return; fi
    if [ ! -d /sys/firmware/efi ]; then
      echo "SecureBoot not applicable (legacy BIOS boot: no /sys/firmware/efi)"; return 0
    fi
    f=/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c
    if [ ! -r "$f" ]; then echo "SecureBoot unknown (no SecureBoot EFI variable)"; return 0; fi
    v=$(od -An -t u1 -j 4 -N 1 "$f" | tr -d ' ')
    if [ "$v" = 1 ]; then echo "SecureBoot enabled"; else echo "SecureBoot disabled"; fi
"""

PROBES: tuple[Probe, ...] = (
    Probe(HOST_FACTS, _host_facts_body(), 25, "PCI functions, kernel modules, loaded driver, Secure Boot"),
)
# Snapshots made before host-facts.json held these files instead; replaying one reads them (and only
# then: live hosts are never asked for them).
LEGACY_PROBES: tuple[Probe, ...] = (
    Probe(PCI_DEVICES, _PCI_FROM_SYSFS, 20, "PCI devices, lspci -Dnn format"),
    Probe(PROC_DRIVER_VERSION, "rd /proc/driver/nvidia/version", 5, "kernel module version"),
    Probe(SYS_MODULE_VERSION, "rd /sys/module/nvidia/version", 5, "loaded module version"),
    Probe(MODULES, "cat /proc/modules", 5, "loaded kernel modules"),
    Probe(SECUREBOOT, _SECUREBOOT, 10, "Secure Boot state"),
)


@dataclass(frozen=True)
class PciDevice:
    address: str  # 0000:00:06.0 (lowercase)
    class_code: str  # 4 hex digits, e.g. 0302
    vendor: str  # 10de
    device: str  # 2335
    description: str

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == "10de" and self.class_code in ("0300", "0302")

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == "10de" and self.class_code == "0680"


_PCI_LINE = re.compile(
    r"^(?P<addr>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<cname>.*?)\s*"
    r"\[(?P<cls>[0-9a-fA-F]{4})\]:\s*(?P<rest>.*)$"
)
_PCI_IDS = re.compile(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")


def parse_pci_devices(text: str) -> list[PciDevice]:
    devices: list[PciDevice] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _PCI_LINE.match(line.strip())
        ids = _PCI_IDS.findall(m.group("rest")) if m else []
        if not m or not ids:
            raise ParseError(f"pci-devices.txt line {n}: not in lspci -Dnn format: {line.strip()[:80]!r}")
        vendor, device = ids[-1]
        devices.append(
            PciDevice(
                address=normalize_bus_id(m.group("addr")),
                class_code=m.group("cls").lower(),
                vendor=vendor.lower(),
                device=device.lower(),
                description=line.strip(),
            )
        )
    return devices


@dataclass(frozen=True)
class HostFactsDoc:
    """host-facts.json: what the preflight role's host probe read (see HOST_FACTS)."""

    pci: list[PciDevice]
    modules: dict[str, dict[str, Any]]  # loaded module → {"refcount", "used_by"}
    driver: KernelDriver | None  # None: no NVIDIA kernel module loaded
    module_version: str  # /sys/module/nvidia/version, "" when not loaded
    secure_boot: str  # enabled | disabled | not-applicable | unknown


_SYSFS_ID = re.compile(r"0x[0-9a-f]{4}")
_SYSFS_CLASS = re.compile(r"0x[0-9a-f]{6}")


def parse_host_facts(text: str) -> HostFactsDoc:
    """The host probe's JSON, checked field by field (a host's output is data, not trusted)."""
    doc = parse_json_object(text, HOST_FACTS)
    pci: list[PciDevice] = []
    for n, dev in enumerate(doc.get("pci") or []):
        if not isinstance(dev, dict):
            raise ParseError(f"{HOST_FACTS}: pci[{n}] is not an object")
        addr, vendor, device, cls = (
            str(dev.get(k, "")).lower() for k in ("address", "vendor", "device", "class")
        )
        if not (_SYSFS_ID.fullmatch(vendor) and _SYSFS_ID.fullmatch(device) and _SYSFS_CLASS.fullmatch(cls)):
            raise ParseError(f"{HOST_FACTS}: pci[{n}]: not sysfs ids: {str(dev)[:80]!r}")
        if not re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", addr):
            raise ParseError(f"{HOST_FACTS}: pci[{n}]: not a PCI address: {addr[:40]!r}")
        pci.append(
            PciDevice(
                address=normalize_bus_id(addr),
                class_code=cls[2:6],
                vendor=vendor[2:],
                device=device[2:],
                description=f"{addr} [{cls[2:6]}]: [{vendor[2:]}:{device[2:]}]",
            )
        )
    modules = doc.get("modules") or {}
    if not isinstance(modules, dict):
        raise ParseError(f"{HOST_FACTS}: modules is not an object")
    drv = doc.get("driver") or {}
    if not isinstance(drv, dict):
        raise ParseError(f"{HOST_FACTS}: driver is not an object")
    driver = parse_driver_proc(str(drv["proc_version"])) if drv.get("proc_version") else None
    module_version = str(drv.get("version") or "")
    if module_version and not _VERSION.match(module_version):
        raise ParseError(f"{HOST_FACTS}: driver.version: not a version: {module_version[:40]!r}")
    sb = doc.get("secure_boot") or {}
    state = str(sb.get("state", "unknown")) if isinstance(sb, dict) else "unknown"
    return HostFactsDoc(
        pci=pci,
        modules={str(k): v for k, v in modules.items() if isinstance(v, dict)},
        driver=driver,
        module_version=module_version,
        secure_boot=state.replace("_", "-")
        if state in ("enabled", "disabled", "not_applicable")
        else "unknown",
    )


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:00:06.0' (nvidia-smi) and '0000:00:06.0' (lspci) name the same device."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if not rest:
        return bus_id
    return f"{int(domain, 16):04x}:{rest}" if re.fullmatch(r"[0-9a-f]+", domain) else bus_id


def nvidia_gpus(devices: Iterable[PciDevice]) -> list[PciDevice]:
    """NVIDIA GPUs on the PCI bus, in bus order (the order nvidia-smi numbers them)."""
    return sorted((d for d in devices if d.is_nvidia_gpu), key=lambda d: d.address)


@dataclass(frozen=True)
class KernelDriver:
    version: str
    open_modules: bool | None  # True: "Open Kernel Module"; False: proprietary
    line: str


_NVRM_VERSION = re.compile(
    r"NVRM version:.*?(?P<open>Open )?Kernel Module\b.*?\s(?P<ver>\d+\.\d+(?:\.\d+)?)\s"
)


def parse_driver_proc(text: str) -> KernelDriver:
    line = first_line(text, 400)
    m = _NVRM_VERSION.search(line + " ")
    if not m:
        raise ParseError(f"/proc/driver/nvidia/version: no 'NVRM version' line: {line[:80]!r}")
    return KernelDriver(m.group("ver"), m.group("open") is not None, line)


_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")


def parse_module_version(text: str) -> str:
    value = text.strip()
    if not _VERSION.match(value):
        raise ParseError(f"/sys/module/nvidia/version: not a version: {value[:40]!r}")
    return value


def parse_modules(text: str) -> dict[str, str]:
    """/proc/modules: name → state (Live/Loading/Unloading)."""
    mods: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 5:
            raise ParseError(f"modules.txt line {n}: not /proc/modules format: {line[:80]!r}")
        mods[parts[0]] = parts[4]
    return mods


def parse_secureboot(text: str) -> str:
    """enabled | disabled | not-applicable | unknown."""
    t = text.lower()
    if "not applicable" in t or "efi variables are not supported" in t or "doesn't support secure boot" in t:
        return "not-applicable"
    if "secureboot enabled" in t:
        return "enabled"
    if "secureboot disabled" in t:
        return "disabled"
    return "unknown"


def legacy(facts: HostFacts) -> bool:
    """A snapshot made before host-facts.json: its PCI, module, driver and Secure Boot facts are in
    the older files (LEGACY_PROBES)."""
    return HOST_FACTS not in facts.results and PCI_DEVICES in facts.results


def host_facts(facts: HostFacts) -> HostFactsDoc:
    return facts.parsed("hostfacts", lambda: parse_host_facts(facts.ok_text(HOST_FACTS)))


def pci(facts: HostFacts) -> list[PciDevice]:
    if legacy(facts):
        return facts.parsed("pci", lambda: parse_pci_devices(facts.ok_text(PCI_DEVICES)))
    return host_facts(facts).pci


def nouveau_loaded(facts: HostFacts) -> bool | None:
    """Whether nouveau is loaded; None when the module list cannot be read."""
    if legacy(facts):
        mods = facts.results.get(MODULES)
        if mods is None or not mods.ok:
            return None
        return any(line.startswith("nouveau ") for line in mods.stdout.splitlines())
    try:
        return "nouveau" in host_facts(facts).modules
    except Unavailable:
        return None


def pci_gpus(facts: HostFacts) -> list[PciDevice]:
    return nvidia_gpus(pci(facts))


def nvswitches(facts: HostFacts) -> list[PciDevice]:
    return [d for d in pci(facts) if d.is_nvswitch]


def require_gpu(facts: HostFacts) -> list[PciDevice]:
    """The PCI GPUs, or skip when there are none (GPU checks do not apply)."""
    gpus = pci_gpus(facts)
    if not gpus:
        raise Unavailable(SKIP, "no NVIDIA GPU on the PCI bus")
    return gpus


def kernel_driver(facts: HostFacts) -> KernelDriver:
    def load() -> KernelDriver:
        if legacy(facts):
            res = facts.result(PROC_DRIVER_VERSION)
            if not res.ok:
                raise Unavailable(SKIP, "no /proc/driver/nvidia/version: NVIDIA kernel module not loaded")
            return parse_driver_proc(res.stdout)
        driver = host_facts(facts).driver
        if driver is None:
            raise Unavailable(SKIP, "no /proc/driver/nvidia/version: NVIDIA kernel module not loaded")
        return driver

    return facts.parsed("kdriver", load)


def module_version(facts: HostFacts) -> str:
    def load() -> str:
        if legacy(facts):
            return parse_module_version(facts.ok_text(SYS_MODULE_VERSION))
        version = host_facts(facts).module_version
        if not version:
            raise Unavailable(SKIP, "no /sys/module/nvidia/version: NVIDIA kernel module not loaded")
        return version

    return facts.parsed("modver", load)
