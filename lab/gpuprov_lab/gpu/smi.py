"""Part of the gpuprov lab simulation: ``nvidia-smi`` for the host's simulated GPUs.

The GPU list (-L) and the summary table come from NVIDIA's real nvidia-smi (Debian's non-free build)
reading NVIDIA's mock NVML (:func:`run_real`). This front end is SIMULATED where the real binary cannot
answer: the driver states that belong to the (simulated) kernel module, ``-q``/``-q -x`` (the real binary
crashes on the mock), ``--version`` (the binary's own branch is not the simulated driver's),
``--query-gpu`` with a field the simulation decides (ECC, remapped rows, PCIe link, MIG mode, persistence:
the simulated faults and states are not in the mock; a query of only REAL_QUERY_FIELDS, such as
`gpuprov top`'s, is the real binary's), ``-pm``, and MIG (mig.py: ``-mig 0|1``,
``-r``, the ``nvidia-smi mig`` subcommand; the MIG Mode of ``-q``/``-q -x`` and ``--query-gpu=mig.mode.*``).
The mock NVML has no MIG devices, so once GPU instances with compute instances exist this front end adds their
lines ("  MIG 1g.18gb     Device  0: (UUID: MIG-...)") to the real binary's ``-L`` under their GPU.

Simulated output is generated from the real H200 capture (templates/h200-nvidia-smi-q-x.xml and
-q.txt): per GPU of the profile the template GPU is copied and its values replaced (name, PCI ids and
bus id, UUID, memory, VBIOS, power, clocks, link), then the faults in force are applied (volatile
uncorrectable ECC errors, pending/failed row remaps, a degraded PCIe link, a GPU that is on the bus but
not seen by the driver). Element names and value formats are the real ones.

The userspace version is that of the installed libnvidia-ml (its file name), the driver version that of
the loaded module: when they differ NVML fails with the real "Driver/library version mismatch".
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import core, kmod, mig, watch

TEMPLATES = Path(__file__).resolve().parent
LIBNVML = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
RC_NO_DRIVER = 9
RC_NO_DEVICES = 6
RC_MISMATCH = 18
RC_ARGS = 2
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
ECC_FAULT_COUNT = 2


# NVIDIA's real nvidia-smi (installed by the lab's nvidia-smi package where Debian installs it) answers
# these from NVIDIA's mock NVML, once this front end has found a loaded driver that agrees with the library
# and GPUs to list (the kernel module is simulated, so those answers are this module's).
REAL_SMI = "/usr/lib/nvidia/current/nvidia-smi"
REAL_MODES = ("list", "table")
# --query-gpu fields NVIDIA's nvidia-smi answers from the mock NVML and that no simulated fault or state
# of this front end changes (checked by running the real binary on the mock: these are `gpuprov top`'s
# fields). A query of only these goes to the real binary; one with any other field (ECC, remapped rows,
# PCIe link, MIG mode, persistence, driver version: what the simulation decides) stays here.
REAL_QUERY_FIELDS = frozenset(
    {
        "index", "uuid", "name", "pci.bus_id", "utilization.gpu", "utilization.memory", "memory.used",
        "memory.total", "temperature.gpu", "power.draw", "power.limit", "clocks_event_reasons.active",
    }
)  # fmt: skip
# -mig / --multi-instance-gpu values ("0/DISABLED, 1/ENABLED" in nvidia-smi -h).
MIG_MODES = {"0": False, "DISABLED": False, "1": True, "ENABLED": True}


def run_real(host: core.Host, argv: list[str], amend: Callable[[str], str] | None = None) -> int:
    """Run NVIDIA's nvidia-smi with the caller's arguments against the host's mock NVML; ``amend`` adds
    to its output what the mock cannot know (MIG devices)."""
    real = host.p(REAL_SMI)
    if not os.access(real, os.X_OK):
        missing = f"gpuprov lab: NVIDIA's nvidia-smi is missing at {REAL_SMI} (reinstall nvidia-smi)\n"
        raise SmiError(missing, 12)
    env = dict(os.environ)
    env["MOCK_NVML_CONFIG"] = str(host.run_dir() / "nvml.yaml")
    env["LD_LIBRARY_PATH"] = str(host.p(os.path.dirname(LIBNVML)))
    res = subprocess.run([str(real), *argv], env=env, capture_output=True, text=True, timeout=60, check=False)
    sys.stdout.write(res.stdout if amend is None or res.returncode != 0 else amend(res.stdout))
    sys.stderr.write(res.stderr)
    return res.returncode


class SmiError(core.SimError):
    """Printed to stdout, as nvidia-smi does for its driver errors."""


# --------------------------------------------------------------------------------------- the state


def nvml_version(host: core.Host, packaged: str) -> str | None:
    """Version of the installed NVML library (libnvidia-ml.so.1 → libnvidia-ml.so.<version>)."""
    lib = host.p(LIBNVML)
    if not lib.exists():
        return None
    try:
        target = os.readlink(lib)
    except OSError:
        return packaged
    m = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", target)
    return m.group(1) if m else packaged


def driver_state(host: core.Host, packaged: str) -> tuple[dict[str, Any], str]:
    """(module state, NVML version) once NVML initialised; SmiError as the real tool fails."""
    watch.sync(host)
    nvml = nvml_version(host, packaged)
    if nvml is None:
        raise SmiError(
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
            "the NVIDIA Display Driver is properly installed and present in your system.\n"
            "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n",
            12,
        )
    kmod.ensure_loaded(host)
    st = host.state()
    module = kmod.loaded(st, "nvidia")
    if module is None:
        raise SmiError(NO_DRIVER, RC_NO_DRIVER)
    if module["version"] != nvml:
        short = ".".join(nvml.split(".")[:2])
        with host.locked() as locked:
            key = f"api-mismatch-{nvml}"
            if not locked.get(key):
                locked[key] = True
                host.log(
                    locked,
                    f"NVRM: API mismatch: the client has the version {nvml}, but",
                    f"NVRM: this kernel module has the version {module['version']}.  Please",
                    "NVRM: make sure that this kernel module and all NVIDIA driver",
                    "NVRM: components have the same version.",
                )
        raise SmiError(
            f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {short}\n",
            RC_MISMATCH,
        )
    return st, nvml


def visible(host: core.Host, st: dict[str, Any]) -> list[dict[str, Any]]:
    """GPUs NVML enumerates: bound at load, still on the bus (gpu-missing hides one), bus order."""
    return kmod.nvml_gpus(host, st)


def persistence(st: dict[str, Any], g: dict[str, Any]) -> bool:
    return bool(st["persistence"].get(g["bus_id"], False))


def fabric_state(host: core.Host, st: dict[str, Any]) -> tuple[str, str]:
    """NVLink fabric registration: only on NVSwitch systems, done once fabric manager configured it."""
    if not host.nvswitches():
        return "N/A", "N/A"
    if st.get("fabric") == "configured" and "nv-fabricmanager" in kmod.users(st):
        return "Completed", "Success"
    return "In Progress", "N/A"


# ------------------------------------------------------------------------------------------ values


def _hexbus(g: dict[str, Any]) -> tuple[str, str, str]:
    domain, bus, rest = g["pci_address"].split(":")
    return domain.upper(), bus.upper(), rest.split(".")[0].upper()


def gpu_values(host: core.Host, st: dict[str, Any], g: dict[str, Any], driver: str) -> dict[str, str]:
    """XML path (relative to <gpu>) → text, for everything that differs from the template GPU."""
    idx = g["index"]
    domain, bus, dev = _hexbus(g)
    gen_max, width_max = int(g["link_gen_max"]), int(g["link_width_max"])
    gen, width = gen_max, width_max
    if host.has_fault("pcie", idx):
        gen, width = max(1, gen_max - 2), max(1, width_max // 2)
    total = int(g["memory_mib"])
    reserved = int(g["reserved_mib"])
    used = 0
    ecc = bool(g.get("ecc", True))
    unc = ECC_FAULT_COUNT if host.has_fault("ecc", idx) else 0
    pending = host.has_fault("remap-pending", idx)
    failure = host.has_fault("remap-failure", idx)
    device_id = f"{int(g['device_id'], 16):04X}{int(g['vendor_id'], 16):04X}"
    subsys = f"{int(g['subsystem_device_id'], 16):04X}{int(g['subsystem_vendor_id'], 16):04X}"
    cls = int(g["class"], 16)
    pdi = "0x" + hashlib.sha256(g["uuid"].encode()).hexdigest()[:15].lstrip("0")
    fstate, fstatus = fabric_state(host, st)
    power = float(g["idle_power_w"])
    limit = float(g["power_limit_w"])
    mig_current, mig_pending = mig.mode_values(st, g)
    values = {
        "product_name": g["name"],
        "product_architecture": g["architecture"],
        "persistence_mode": "Enabled" if persistence(st, g) else "Disabled",
        "mig_mode/current_mig": mig_current,
        "mig_mode/pending_mig": mig_pending,
        "serial": g["serial"],
        "uuid": g["uuid"],
        "pdi": pdi,
        "minor_number": str(g["minor_number"]),
        "vbios_version": g["vbios"],
        "board_id": g["board_id"],
        "board_part_number": g["board_part_number"],
        "gpu_part_number": g["gpu_part_number"],
        "platformInfo/module_id": str(g["module_id"]),
        "inforom_version/img_version": g["inforom_image"],
        "inforom_version/ecc_object": g["inforom_ecc"],
        "gsp_firmware_version": driver,
        "pci/pci_bus": bus,
        "pci/pci_device": dev,
        "pci/pci_domain": domain,
        "pci/pci_base_class": f"{cls >> 16:x}",
        "pci/pci_sub_class": f"{(cls >> 8) & 0xFF:x}",
        "pci/pci_device_id": device_id,
        "pci/pci_bus_id": g["bus_id"],
        "pci/pci_sub_system_id": subsys,
        "pci/pci_gpu_link_info/pcie_gen/max_link_gen": str(gen_max),
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen": str(gen),
        "pci/pci_gpu_link_info/pcie_gen/device_current_link_gen": str(gen),
        "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen": str(gen_max),
        "pci/pci_gpu_link_info/link_widths/max_link_width": f"{width_max}x",
        "pci/pci_gpu_link_info/link_widths/current_link_width": f"{width}x",
        "pci/tx_util": "1000 KB/s",
        "pci/rx_util": "562 KB/s",
        "performance_state": "P0",
        "fb_memory_usage/total": f"{total} MiB",
        "fb_memory_usage/reserved": f"{reserved} MiB",
        "fb_memory_usage/used": f"{used} MiB",
        "fb_memory_usage/free": f"{total - reserved - used} MiB",
        "bar1_memory_usage/total": f"{g['bar1_mib']} MiB",
        "bar1_memory_usage/used": "1 MiB",
        "bar1_memory_usage/free": f"{int(g['bar1_mib']) - 1} MiB",
        "ecc_mode/current_ecc": "Enabled" if ecc else "Disabled",
        "ecc_mode/pending_ecc": "Enabled" if ecc else "Disabled",
        "ecc_errors/volatile/dram_uncorrectable": str(unc),
        "ecc_errors/aggregate/dram_uncorrectable": str(unc),
        "remapped_rows/remapped_row_unc": str(int(pending or failure)),
        "remapped_rows/remapped_row_pending": "Yes" if pending else "No",
        "remapped_rows/remapped_row_failure": "Yes" if failure else "No",
        "temperature/gpu_temp": f"{g['temp_c']} C",
        "temperature/memory_temp": f"{g['mem_temp_c']} C" if g.get("mem_temp_c") is not None else "N/A",
        "gpu_power_readings/average_power_draw": f"{power * 1.3:.2f} W",
        "gpu_power_readings/instant_power_draw": f"{power:.2f} W",
        "gpu_power_readings/current_power_limit": f"{limit:.2f} W",
        "gpu_power_readings/requested_power_limit": f"{limit:.2f} W",
        "gpu_power_readings/default_power_limit": f"{limit:.2f} W",
        "gpu_power_readings/min_power_limit": f"{float(g['power_min_w']):.2f} W",
        "gpu_power_readings/max_power_limit": f"{limit:.2f} W",
        "clocks/graphics_clock": f"{g['idle_graphics_mhz']} MHz",
        "clocks/sm_clock": f"{g['idle_graphics_mhz']} MHz",
        "clocks/mem_clock": f"{g['max_mem_mhz']} MHz",
        "clocks/video_clock": f"{g['idle_video_mhz']} MHz",
        "applications_clocks/graphics_clock": f"{g['max_graphics_mhz']} MHz",
        "applications_clocks/mem_clock": f"{g['max_mem_mhz']} MHz",
        "default_applications_clocks/graphics_clock": f"{g['max_graphics_mhz']} MHz",
        "default_applications_clocks/mem_clock": f"{g['max_mem_mhz']} MHz",
        "max_clocks/graphics_clock": f"{g['max_graphics_mhz']} MHz",
        "max_clocks/sm_clock": f"{g['max_graphics_mhz']} MHz",
        "max_clocks/mem_clock": f"{g['max_mem_mhz']} MHz",
        "max_clocks/video_clock": f"{g['max_video_mhz']} MHz",
        "max_customer_boost_clocks/graphics_clock": f"{g['max_graphics_mhz']} MHz",
        "fabric/state": fstate,
        "fabric/status": fstatus,
    }
    if not ecc:
        for k in list(values):
            if k.startswith("ecc_errors/"):
                values[k] = "N/A"
    return values


# --------------------------------------------------------------------------------------------- XML


def _template() -> tuple[ET.Element, ET.Element]:
    root = ET.parse(TEMPLATES / "h200-nvidia-smi-q-x.xml").getroot()
    gpu = root.find("gpu")
    assert gpu is not None
    root.remove(gpu)
    return root, gpu


def _supported_clocks(el: ET.Element, g: dict[str, Any]) -> None:
    """Supported graphics clocks per memory clock, from the max down in 15 MHz steps (as Hopper lists)."""
    for child in list(el):
        el.remove(child)
    mems = [int(g["max_mem_mhz"])]
    if g["architecture"] in ("Hopper", "Ampere"):
        mems.append(int(g["max_mem_mhz"]) - 1000)
    for mem in mems:
        sm = ET.SubElement(el, "supported_mem_clock")
        ET.SubElement(sm, "value").text = f"{mem} MHz"
        clock = int(g["max_graphics_mhz"])
        while clock >= int(g["idle_graphics_mhz"]):
            ET.SubElement(sm, "supported_graphics_clock").text = f"{clock} MHz"
            clock -= 15


def gpu_element(
    host: core.Host, st: dict[str, Any], g: dict[str, Any], driver: str, tmpl: ET.Element
) -> ET.Element:
    el = copy.deepcopy(tmpl)
    el.set("id", g["bus_id"])
    for path, value in gpu_values(host, st, g, driver).items():
        node = el.find(path)
        if node is None:
            raise RuntimeError(f"template has no <{path}>")
        node.text = value
    sc = el.find("supported_clocks")
    if sc is not None:
        _supported_clocks(sc, g)
    return el


def _serialize(el: ET.Element, depth: int, out: list[str]) -> None:
    ind = "\t" * depth
    attrs = "".join(f' {k}="{v}"' for k, v in el.attrib.items())
    children = list(el)
    text = el.text or ""
    if children or "\n" in text:
        out.append(f"{ind}<{el.tag}{attrs}>\n")
        if text.strip():
            out.append(f"{ind}\t{_esc(text.strip())}\n")
        for child in children:
            _serialize(child, depth + 1, out)
        out.append(f"{ind}</{el.tag}>\n")
    else:
        out.append(f"{ind}<{el.tag}{attrs}>{_esc(text)}</{el.tag}>\n")


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def xml_text(host: core.Host, st: dict[str, Any], gpus: list[dict[str, Any]], driver: str, cuda: str) -> str:
    root, tmpl = _template()
    root.find("timestamp").text = time.ctime()  # type: ignore[union-attr]
    root.find("driver_version").text = driver  # type: ignore[union-attr]
    root.find("cuda_version").text = cuda  # type: ignore[union-attr]
    root.find("attached_gpus").text = str(len(gpus))  # type: ignore[union-attr]
    out = [
        '<?xml version="1.0" ?>\n',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n',
        "<nvidia_smi_log>\n",
    ]
    for child in root:
        _serialize(child, 1, out)
    for g in gpus:
        _serialize(gpu_element(host, st, g, driver, tmpl), 1, out)
        out.append("\n")
    out.append("</nvidia_smi_log>\n")
    return "".join(out)


# ------------------------------------------------------------------------------------------- -q text

# Label path in `nvidia-smi -q` → XML path whose value it shows, and how it is shown.
TEXT_MAP: dict[tuple[str, ...], tuple[str, str]] = {
    ("Product Name",): ("product_name", ""),
    ("Product Architecture",): ("product_architecture", ""),
    ("Persistence Mode",): ("persistence_mode", ""),
    ("MIG Mode", "Current"): ("mig_mode/current_mig", ""),
    ("MIG Mode", "Pending"): ("mig_mode/pending_mig", ""),
    ("Serial Number",): ("serial", ""),
    ("GPU UUID",): ("uuid", ""),
    ("GPU PDI",): ("pdi", ""),
    ("Minor Number",): ("minor_number", ""),
    ("VBIOS Version",): ("vbios_version", ""),
    ("Board ID",): ("board_id", ""),
    ("Board Part Number",): ("board_part_number", ""),
    ("GPU Part Number",): ("gpu_part_number", ""),
    ("Platform Info", "Module Id"): ("platformInfo/module_id", ""),
    ("Inforom Version", "Image Version"): ("inforom_version/img_version", ""),
    ("Inforom Version", "ECC Object"): ("inforom_version/ecc_object", ""),
    ("GSP Firmware Version",): ("gsp_firmware_version", ""),
    ("PCI", "Bus"): ("pci/pci_bus", "0x"),
    ("PCI", "Device"): ("pci/pci_device", "0x"),
    ("PCI", "Domain"): ("pci/pci_domain", "0x"),
    ("PCI", "Base Classcode"): ("pci/pci_base_class", "0x"),
    ("PCI", "Sub Classcode"): ("pci/pci_sub_class", "0x"),
    ("PCI", "Device Id"): ("pci/pci_device_id", "0x"),
    ("PCI", "Bus Id"): ("pci/pci_bus_id", ""),
    ("PCI", "Sub System Id"): ("pci/pci_sub_system_id", "0x"),
    ("PCI", "GPU Link Info", "PCIe Generation", "Max"): ("pci/pci_gpu_link_info/pcie_gen/max_link_gen", ""),
    ("PCI", "GPU Link Info", "PCIe Generation", "Current"): (
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
        "",
    ),
    ("PCI", "GPU Link Info", "PCIe Generation", "Device Current"): (
        "pci/pci_gpu_link_info/pcie_gen/device_current_link_gen",
        "",
    ),
    ("PCI", "GPU Link Info", "PCIe Generation", "Device Max"): (
        "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen",
        "",
    ),
    ("PCI", "GPU Link Info", "Link Width", "Max"): ("pci/pci_gpu_link_info/link_widths/max_link_width", ""),
    ("PCI", "GPU Link Info", "Link Width", "Current"): (
        "pci/pci_gpu_link_info/link_widths/current_link_width",
        "",
    ),
    ("FB Memory Usage", "Total"): ("fb_memory_usage/total", ""),
    ("FB Memory Usage", "Reserved"): ("fb_memory_usage/reserved", ""),
    ("FB Memory Usage", "Used"): ("fb_memory_usage/used", ""),
    ("FB Memory Usage", "Free"): ("fb_memory_usage/free", ""),
    ("BAR1 Memory Usage", "Total"): ("bar1_memory_usage/total", ""),
    ("BAR1 Memory Usage", "Used"): ("bar1_memory_usage/used", ""),
    ("BAR1 Memory Usage", "Free"): ("bar1_memory_usage/free", ""),
    ("ECC Mode", "Current"): ("ecc_mode/current_ecc", ""),
    ("ECC Mode", "Pending"): ("ecc_mode/pending_ecc", ""),
    ("ECC Errors", "Volatile", "DRAM Uncorrectable"): ("ecc_errors/volatile/dram_uncorrectable", ""),
    ("ECC Errors", "Aggregate", "DRAM Uncorrectable"): ("ecc_errors/aggregate/dram_uncorrectable", ""),
    ("Remapped Rows", "Uncorrectable Error"): ("remapped_rows/remapped_row_unc", ""),
    ("Remapped Rows", "Pending"): ("remapped_rows/remapped_row_pending", ""),
    ("Remapped Rows", "Remapping Failure Occurred"): ("remapped_rows/remapped_row_failure", ""),
    ("Temperature", "GPU Current Temp"): ("temperature/gpu_temp", ""),
    ("Temperature", "Memory Current Temp"): ("temperature/memory_temp", ""),
    ("GPU Power Readings", "Average Power Draw"): ("gpu_power_readings/average_power_draw", ""),
    ("GPU Power Readings", "Instantaneous Power Draw"): ("gpu_power_readings/instant_power_draw", ""),
    ("GPU Power Readings", "Current Power Limit"): ("gpu_power_readings/current_power_limit", ""),
    ("GPU Power Readings", "Requested Power Limit"): ("gpu_power_readings/requested_power_limit", ""),
    ("GPU Power Readings", "Default Power Limit"): ("gpu_power_readings/default_power_limit", ""),
    ("GPU Power Readings", "Min Power Limit"): ("gpu_power_readings/min_power_limit", ""),
    ("GPU Power Readings", "Max Power Limit"): ("gpu_power_readings/max_power_limit", ""),
    ("Clocks", "Graphics"): ("clocks/graphics_clock", ""),
    ("Clocks", "SM"): ("clocks/sm_clock", ""),
    ("Clocks", "Memory"): ("clocks/mem_clock", ""),
    ("Clocks", "Video"): ("clocks/video_clock", ""),
    ("Applications Clocks", "Graphics"): ("applications_clocks/graphics_clock", ""),
    ("Applications Clocks", "Memory"): ("applications_clocks/mem_clock", ""),
    ("Default Applications Clocks", "Graphics"): ("default_applications_clocks/graphics_clock", ""),
    ("Default Applications Clocks", "Memory"): ("default_applications_clocks/mem_clock", ""),
    ("Max Clocks", "Graphics"): ("max_clocks/graphics_clock", ""),
    ("Max Clocks", "SM"): ("max_clocks/sm_clock", ""),
    ("Max Clocks", "Memory"): ("max_clocks/mem_clock", ""),
    ("Max Clocks", "Video"): ("max_clocks/video_clock", ""),
    ("Max Customer Boost Clocks", "Graphics"): ("max_customer_boost_clocks/graphics_clock", ""),
    ("Fabric", "State"): ("fabric/state", ""),
    ("Fabric", "Status"): ("fabric/status", ""),
}


def _q_template() -> tuple[list[str], list[str]]:
    lines = (TEMPLATES / "h200-nvidia-smi-q.txt").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("GPU "))
    body = lines[start + 1 :]
    while body and not body[-1].strip():
        body.pop()
    return lines[:start], body


def q_text(host: core.Host, st: dict[str, Any], gpus: list[dict[str, Any]], driver: str, cuda: str) -> str:
    head, body = _q_template()
    out = []
    for line in head:
        label = line.split(":", 1)[0].strip()
        value = {
            "Timestamp": time.ctime(),
            "Driver Version": driver,
            "CUDA Version": cuda,
            "Attached GPUs": str(len(gpus)),
        }.get(label)
        out.append(line if value is None or ":" not in line else f"{line.split(':', 1)[0]}: {value}")
    for g in gpus:
        values = gpu_values(host, st, g, driver)
        out.append(f"GPU {g['bus_id']}")
        stack: list[str] = []
        for line in body:
            indent = (len(line) - len(line.lstrip(" "))) // 4
            label, sep, _ = line.strip().partition(":")
            label = label.strip()
            stack = [*stack[: indent - 1], label]
            key = TEXT_MAP.get(tuple(stack))
            if sep and key:
                path, prefix = key
                out.append(f"{line[: line.index(':')]}: {prefix}{values[path]}")
            else:
                out.append(line)
        out.append("")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- table


def table(host: core.Host, st: dict[str, Any], gpus: list[dict[str, Any]], driver: str, cuda: str) -> str:
    sep = "+-----------------------------------------+------------------------+----------------------+"
    lines = [
        f"{time.ctime()}       ",
        "+-----------------------------------------------------------------------------------------+",
        f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|",
        sep,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    for i, g in enumerate(gpus):
        v = gpu_values(host, st, g, driver)
        pm = "On" if v["persistence_mode"] == "Enabled" else "Off"
        name = g["name"] if len(g["name"]) <= 25 else g["name"][:22] + "..."
        left = f"{i:>4}  {name}"
        seg1 = left + " " * (41 - len(left) - len(pm) - 2) + pm + "  "
        ecc = v["ecc_errors/volatile/dram_uncorrectable"] if v["ecc_mode/current_ecc"] == "Enabled" else "N/A"
        lines.append(f"|{seg1}|{g['bus_id']:>19} Off |{ecc:>21} |")
        temp = v["temperature/gpu_temp"].split()[0]
        usage = f"{round(float(v['gpu_power_readings/instant_power_draw'].split()[0]))}W"
        cap = f"{round(float(v['gpu_power_readings/current_power_limit'].split()[0]))}W"
        used = v["fb_memory_usage/used"].split()[0] + "MiB"
        total = v["fb_memory_usage/total"].split()[0] + "MiB"
        seg1 = f" N/A{temp:>5}C{'P0':>6}{usage:>16} / {cap:>5} "
        lines.append(f"|{seg1}|{used:>11} / {total:>9} |{'0%':>8}{'Default':>13} |")
        lines.append(f"|{'':41}|{'':24}|{'Disabled':>21} |")
        lines.append(sep)
    lines += [
        "",
        "+-----------------------------------------------------------------------------------------+",
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
        "|  No running processes found                                                             |",
        "+-----------------------------------------------------------------------------------------+",
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- query

UNITS = {"memory": "MiB", "power": "W", "clocks": "MHz", "utilization": "%", "enforced": "W"}


def _na(value: str) -> str:
    """-q's N/A is --query-gpu's [N/A]."""
    return "[N/A]" if value == "N/A" else value


def _num(value: str) -> str:
    return value.split()[0] if value and value[0].isdigit() else value


def query_value(field: str, i: int, g: dict[str, Any], v: dict[str, str], driver: str, count: int) -> str:
    """One --query-gpu field of one GPU, as nvidia-smi prints it (with units; callers strip them)."""
    gen = "pci/pci_gpu_link_info/pcie_gen/"
    width = "pci/pci_gpu_link_info/link_widths/"
    table_: dict[str, str] = {
        "index": str(i),
        "count": str(count),
        "uuid": g["uuid"],
        "gpu_uuid": g["uuid"],
        "name": g["name"],
        "gpu_name": g["name"],
        "serial": g["serial"],
        "pci.bus_id": g["bus_id"],
        "gpu_bus_id": g["bus_id"],
        "pci.domain": "0x" + v["pci/pci_domain"],
        "pci.bus": "0x" + v["pci/pci_bus"],
        "pci.device": "0x" + v["pci/pci_device"],
        "pci.device_id": "0x" + v["pci/pci_device_id"],
        "pci.sub_device_id": "0x" + v["pci/pci_sub_system_id"],
        "driver_version": driver,
        "vbios_version": g["vbios"],
        "compute_cap": g["compute_cap"],
        "pstate": "P0",
        "fan.speed": "[N/A]",
        "persistence_mode": v["persistence_mode"],
        "ecc.mode.current": v["ecc_mode/current_ecc"],
        "ecc.mode.pending": v["ecc_mode/pending_ecc"],
        "ecc.errors.uncorrected.volatile.total": v["ecc_errors/volatile/dram_uncorrectable"],
        "ecc.errors.uncorrected.volatile.dram": v["ecc_errors/volatile/dram_uncorrectable"],
        "ecc.errors.uncorrected.aggregate.total": v["ecc_errors/aggregate/dram_uncorrectable"],
        "ecc.errors.corrected.volatile.total": "0",
        "ecc.errors.corrected.aggregate.total": "0",
        "retired_pages.pending": "[N/A]",
        "retired_pages.single_bit_ecc.count": "[N/A]",
        "retired_pages.double_bit.count": "[N/A]",
        "mig.mode.current": _na(v["mig_mode/current_mig"]),
        "mig.mode.pending": _na(v["mig_mode/pending_mig"]),
        "pcie.link.gen.current": v[gen + "current_link_gen"],
        "pcie.link.gen.gpucurrent": v[gen + "device_current_link_gen"],
        "pcie.link.gen.max": v[gen + "max_link_gen"],
        "pcie.link.gen.gpumax": v[gen + "max_device_link_gen"],
        "pcie.link.gen.hostmax": "[N/A]",
        "pcie.link.width.current": v[width + "current_link_width"].rstrip("x"),
        "pcie.link.width.max": v[width + "max_link_width"].rstrip("x"),
        "temperature.gpu": v["temperature/gpu_temp"].split()[0],
        "temperature.memory": _num(v["temperature/memory_temp"])
        if v["temperature/memory_temp"] != "N/A"
        else "[N/A]",
        "power.draw": v["gpu_power_readings/instant_power_draw"],
        "power.draw.instant": v["gpu_power_readings/instant_power_draw"],
        "power.draw.average": v["gpu_power_readings/average_power_draw"],
        "power.limit": v["gpu_power_readings/current_power_limit"],
        "enforced.power.limit": v["gpu_power_readings/current_power_limit"],
        "power.default_limit": v["gpu_power_readings/default_power_limit"],
        "power.min_limit": v["gpu_power_readings/min_power_limit"],
        "power.max_limit": v["gpu_power_readings/max_power_limit"],
        "memory.total": v["fb_memory_usage/total"],
        "memory.reserved": v["fb_memory_usage/reserved"],
        "memory.used": v["fb_memory_usage/used"],
        "memory.free": v["fb_memory_usage/free"],
        "utilization.gpu": "0 %",
        "utilization.memory": "0 %",
        "clocks.gr": v["clocks/graphics_clock"],
        "clocks.sm": v["clocks/sm_clock"],
        "clocks.mem": v["clocks/mem_clock"],
        "clocks.video": v["clocks/video_clock"],
        "clocks.max.gr": v["max_clocks/graphics_clock"],
        "clocks.max.sm": v["max_clocks/sm_clock"],
        "clocks.max.mem": v["max_clocks/mem_clock"],
        "clocks_event_reasons.active": "0x0000000000000001",
        "clocks_throttle_reasons.active": "0x0000000000000001",
        "clocks_event_reasons.hw_slowdown": "Not Active",
        "clocks_throttle_reasons.hw_slowdown": "Not Active",
        "remapped_rows.correctable": "0",
        "remapped_rows.uncorrectable": v["remapped_rows/remapped_row_unc"],
        "remapped_rows.pending": v["remapped_rows/remapped_row_pending"],
        "remapped_rows.failure": v["remapped_rows/remapped_row_failure"],
    }
    aliases = {
        "gpu_serial": "serial",
        "clocks.current.graphics": "clocks.gr",
        "clocks.current.sm": "clocks.sm",
        "clocks.current.memory": "clocks.mem",
        "clocks.current.video": "clocks.video",
        "clocks.max.graphics": "clocks.max.gr",
        "clocks.max.memory": "clocks.max.mem",
        "temperature.gpu.tlimit": "temperature.gpu",
    }
    return table_[aliases.get(field, field)]


def query(
    host: core.Host,
    st: dict[str, Any],
    gpus: list[dict[str, Any]],
    driver: str,
    fields: list[str],
    fmt: set[str],
) -> str:
    rows = []
    for i, g in enumerate(gpus):
        v = gpu_values(host, st, g, driver)
        row = []
        for f in fields:
            value = query_value(f, i, g, v, driver, len(gpus))
            if "nounits" in fmt:
                value = re.sub(r" (MiB|W|MHz|%|KB/s)$", "", value)
            row.append(value)
        rows.append(", ".join(row))
    if "noheader" not in fmt:
        header = []
        for f in fields:
            unit = next((u for p, u in UNITS.items() if f.startswith(p + ".") or f == p), None)
            if f.startswith(("clocks_event", "clocks_throttle")):
                unit = None
            header.append(f"{f} [{unit}]" if unit and "nounits" not in fmt else f)
        rows.insert(0, ", ".join(header))
    return "\n".join(rows) + "\n"


def check_fields(fields: list[str]) -> str | None:
    dummy_v = {k: "0" for k in _all_value_keys()}
    g = {"uuid": "", "name": "", "serial": "", "bus_id": "", "vbios": "", "compute_cap": ""}
    for f in fields:
        try:
            query_value(f, 0, g, dummy_v, "", 0)
        except KeyError:
            return f
    return None


def _all_value_keys() -> list[str]:
    return [p for p, _ in TEXT_MAP.values()] + [
        "pci/pci_domain",
        "pci/pci_bus",
        "pci/pci_device",
        "persistence_mode",
        "temperature/memory_temp",
    ]


# -------------------------------------------------------------------------------------------- main


def select(gpus: list[dict[str, Any]], ids: str | None) -> list[dict[str, Any]]:
    if ids is None:
        return gpus
    chosen = []
    for item in ids.split(","):
        item = item.strip()
        for i, g in enumerate(gpus):
            if item in (str(i), g["uuid"], g["serial"]) or item.lower() in (
                g["bus_id"].lower(),
                g["pci_address"],
            ):
                chosen.append(g)
                break
        else:
            raise SmiError(f"No devices were found matching the identifier '{item}'\n", RC_NO_DEVICES)
    return chosen


def set_persistence(host: core.Host, gpus: list[dict[str, Any]], on: bool) -> str:
    if host.on_host and os.geteuid() != 0:
        lines = [f"Unable to set persistence mode for GPU {gpus[0]['bus_id']}: Insufficient Permissions"]
        raise SmiError("\n".join(lines) + "\nTerminating early due to previous errors.\n", 4)
    word = "Enabled" if on else "Disabled"
    out = []
    with host.locked() as st:
        for g in gpus:
            if bool(st["persistence"].get(g["bus_id"], False)) == on:
                out.append(f"Persistence mode is already {word} for GPU {g['bus_id']}.")
            else:
                st["persistence"][g["bus_id"]] = on
                out.append(f"{word} persistence mode for GPU {g['bus_id']}.")
        if on:
            host.log(
                st,
                "NVRM: Persistence mode is deprecated and will be removed in a future release. "
                "Please use nvidia-persistenced instead.",
            )
    return "\n".join(out) + "\nAll done.\n"


def version_text(driver: str, cuda: str) -> str:
    nvml = ".".join(driver.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {driver}\nNVML version        : {nvml}\n"
        f"DRIVER version      : {driver}\nCUDA Version        : {cuda}\n"
    )


def main(prog: str, argv: list[str], driver: str = "", cuda: str = "") -> int:
    host = core.Host()
    args = list(argv)
    ids = None
    fmt: set[str] = set()
    fields: list[str] = []
    mode = "table"
    pm: bool | None = None
    mig_on: bool | None = None
    mig_cmd: mig.MigCommand | None = None
    xml = False
    try:
        while args:
            a = args.pop(0)
            if a in ("-i", "--id"):
                ids = args.pop(0) if args else ""
            elif a.startswith("--id="):
                ids = a.split("=", 1)[1]
            elif a in ("-L", "--list-gpus"):
                mode = "list"
            elif a in ("-q", "--query"):
                mode = "q"
            elif a in ("-x", "--xml-format"):
                xml = True
            elif a.startswith("--query-gpu=") or a.startswith("--query-remapped-rows="):
                mode, fields = "query", [f.strip() for f in a.split("=", 1)[1].split(",") if f.strip()]
            elif a.startswith("--format="):
                fmt = {f.strip() for f in a.split("=", 1)[1].split(",")}
            elif a in ("-pm", "--persistence-mode"):
                value = args.pop(0) if args else ""
                pm = value in ("1", "ENABLED", "Enabled", "enabled")
                mode = "pm"
            elif a.startswith("--persistence-mode="):
                pm, mode = a.split("=", 1)[1] in ("1", "ENABLED", "Enabled", "enabled"), "pm"
            elif a in ("--version",):
                mode = "version"
            elif a in ("-h", "--help"):
                sys.stdout.write(f"NVIDIA System Management Interface -- v{driver} ({core.SIMULATED})\n")
                return 0
            elif a in ("-mig", "--multi-instance-gpu") or a.startswith("--multi-instance-gpu="):
                value = a.split("=", 1)[1] if "=" in a else (args.pop(0) if args else "")
                if value.upper() not in MIG_MODES:
                    sys.stdout.write(mig.INVALID)
                    return RC_ARGS
                mig_on, mode = MIG_MODES[value.upper()], "mig-mode"
            elif a in ("-r", "--gpu-reset"):
                mode = "reset"
            elif a == "mig":
                mig_cmd, mode = mig.parse_args(args), "mig"
                ids = mig_cmd.ids if mig_cmd.ids is not None else ids
                args = []
            else:
                sys.stdout.write(
                    "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
                )
                return RC_ARGS
        if mode == "query" and "csv" not in fmt:
            sys.stdout.write("'--format' must be specified when querying GPU attributes.\n")
            return RC_ARGS
        if mode == "query":
            bad = check_fields(fields)
            if bad:
                sys.stdout.write(f'Field "{bad}" is not a valid field to query.\n\n')
                return RC_ARGS
        st, _nvml = driver_state(host, driver)
        version = kmod.driver_version(st) or driver
        gpus = visible(host, st)
        if mode == "version":
            sys.stdout.write(version_text(version, cuda))
            return 0
        if not gpus:
            sys.stdout.write("No devices were found\n")
            return RC_NO_DEVICES
        chosen = select(gpus, ids)
        if mode == "list":
            return run_real(host, argv, lambda text: mig.list_with_mig_devices(text, host.state(), gpus))
        if mode in REAL_MODES or (mode == "query" and fields and set(fields) <= REAL_QUERY_FIELDS):
            return run_real(host, argv)
        if mode == "q":
            text = (xml_text if xml else q_text)(host, st, chosen, version, cuda)
        elif mode == "query":
            text = query(host, st, chosen, version, fields, fmt)
        elif mode == "pm":
            text = set_persistence(host, chosen, bool(pm))
        elif mode == "reset":
            text = mig.reset(host, chosen)
        elif mode == "mig-mode":
            text = mig.set_mode(host, chosen, bool(mig_on))
        elif mode == "mig" and mig_cmd is not None:
            text = mig.run(host, mig_cmd, [(gpus.index(g), g) for g in chosen])
        else:
            text = table(host, st, chosen, version, cuda)
        sys.stdout.write(text)
        return 0
    except (SmiError, mig.MigError) as exc:
        sys.stdout.write(str(exc))
        return exc.rc
