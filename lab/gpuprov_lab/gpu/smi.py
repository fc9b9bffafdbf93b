"""Part of the gpuprov lab simulation: ``nvidia-smi`` for the host's simulated GPUs.

NVIDIA's real nvidia-smi (Debian's non-free build) answers over NVIDIA's mock NVML (:func:`run_real`):
the GPU list (-L), the summary table, --query-gpu of fields the mock knows (`gpuprov top`'s), and anything
else. This front end is SIMULATED only where the real binary cannot answer:

- the driver states that belong to the (simulated) kernel module: no module loaded, library/module
  version mismatch;
- ``-q -x``: the real binary crashes on the mock. Generated from a real H200's capture
  (h200-nvidia-smi-q-x.xml): per GPU of the profile the template GPU is copied and its values replaced
  (name, PCI ids and bus id, UUID, memory, VBIOS, power, clocks, link), then the faults in force applied
  (volatile uncorrectable ECC errors, pending/failed row remaps, a degraded PCIe link, a GPU that is on
  the bus but not seen by the driver). Element names and value formats are the real ones. (``-q`` as
  text is not simulated: nothing reads it.)
- ``--version``: the binary's own branch is not the simulated driver's;
- ``--query-gpu`` with a field of SIM_FIELDS (MIG mode, persistence, ECC, PCIe link): the simulated
  states and faults are not in the mock;
- MIG (mig.py): ``-mig 0|1``, ``-r``, the ``nvidia-smi mig`` subcommand. The mock NVML has no MIG
  devices, so once GPU instances with compute instances exist this front end adds their lines
  ("  MIG 1g.18gb     Device  0: (UUID: MIG-...)") to the real binary's ``-L`` under their GPU.

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


# NVIDIA's real nvidia-smi, installed by the lab's nvidia-smi package where Debian installs it. It answers
# from NVIDIA's mock NVML once this front end has found a loaded driver that agrees with the library and
# GPUs to list (the kernel module is simulated, so those answers are this module's).
REAL_SMI = "/usr/lib/nvidia/current/nvidia-smi"
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
    # A reset or a reboot clears the volatile count, not the aggregate one, and activates a pending
    # remap: the row stays remapped (recovery.py).
    lifetime_unc = ECC_FAULT_COUNT if unc or host.had_fault("ecc", idx) else 0
    pending = host.has_fault("remap-pending", idx)
    failure = host.has_fault("remap-failure", idx)
    remapped = pending or failure or host.had_fault("remap-pending", idx)
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
        "ecc_errors/aggregate/dram_uncorrectable": str(lifetime_unc),
        "remapped_rows/remapped_row_unc": str(int(remapped)),
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


# ------------------------------------------------------------------------------------------- query

# --query-gpu fields whose answer the simulation decides (MIG mode, persistence, ECC errors, the PCIe
# link: the simulated states and faults are not in the mock NVML). A query of none of these is the real
# binary's (such as `gpuprov top`'s and NVIDIA's MIG service's compute_cap); one with any of them is
# answered here, from these and the identity fields next to them.
IDENTITY_FIELDS = (
    "index", "uuid", "name", "serial", "pci.bus_id", "pci.device_id", "driver_version", "compute_cap",
)  # fmt: skip
SIM_FIELDS = (
    "mig.mode.current", "mig.mode.pending", "persistence_mode", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
)  # fmt: skip


def query_values(i: int, g: dict[str, Any], v: dict[str, str], driver: str) -> dict[str, str]:
    """The --query-gpu fields this front end answers for one GPU, as nvidia-smi prints them."""
    link = "pci/pci_gpu_link_info/"

    def na(value: str) -> str:  # -q's N/A is --query-gpu's [N/A]
        return "[N/A]" if value == "N/A" else value

    return {
        "index": str(i),
        "uuid": g["uuid"],
        "name": g["name"],
        "serial": g["serial"],
        "pci.bus_id": g["bus_id"],
        "pci.device_id": "0x" + v["pci/pci_device_id"],
        "driver_version": driver,
        "compute_cap": g["compute_cap"],
        "mig.mode.current": na(v["mig_mode/current_mig"]),
        "mig.mode.pending": na(v["mig_mode/pending_mig"]),
        "persistence_mode": v["persistence_mode"],
        "ecc.mode.current": v["ecc_mode/current_ecc"],
        "ecc.errors.uncorrected.volatile.total": v["ecc_errors/volatile/dram_uncorrectable"],
        "ecc.errors.uncorrected.aggregate.total": v["ecc_errors/aggregate/dram_uncorrectable"],
        "pcie.link.gen.current": v[link + "pcie_gen/current_link_gen"],
        "pcie.link.gen.max": v[link + "pcie_gen/max_link_gen"],
        "pcie.link.width.current": v[link + "link_widths/current_link_width"].rstrip("x"),
        "pcie.link.width.max": v[link + "link_widths/max_link_width"].rstrip("x"),
    }


def query(host: core.Host, st: dict[str, Any], gpus: list[dict[str, Any]], driver: str, fields: list[str],
          header: bool) -> str:  # fmt: skip
    rows = [", ".join(fields)] if header else []
    for i, g in enumerate(gpus):
        values = query_values(i, g, gpu_values(host, st, g, driver), driver)
        rows.append(", ".join(values[f] for f in fields))
    return "\n".join(rows) + "\n"


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


def nvlink_status(gpus: list[dict[str, Any]], peers: int) -> str:
    """`nvidia-smi nvlink -s`: each GPU's line, then its links where the board has NVLink and the host
    more than one GPU (a host given one GPU of a board, like the real H200 VM, shows no link). NVIDIA's
    mock NVML has no NVLink, so the lab answers from the profile."""
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n")
        if peers > 1:
            out += [f"\t Link {k}: {g['nvlink_gbs']} GB/s\n" for k in range(int(g.get("nvlink_links", 0)))]
    return "".join(out)


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
    header = True
    fields: list[str] = []
    mode = "real"
    mig_on: bool | None = None
    mig_cmd: mig.MigCommand | None = None
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
                mode = "q" if mode != "xml" else mode
            elif a in ("-x", "--xml-format"):
                mode = "xml"
            elif a.startswith("--query-gpu="):
                fields = [f.strip() for f in a.split("=", 1)[1].split(",") if f.strip()]
                mode = "query" if set(fields) & set(SIM_FIELDS) else mode
            elif a.startswith("--format="):
                header = "noheader" not in a
            elif a == "--version":
                mode = "version"
            elif a in ("-mig", "--multi-instance-gpu") or a.startswith("--multi-instance-gpu="):
                value = a.split("=", 1)[1] if "=" in a else (args.pop(0) if args else "")
                if value.upper() not in MIG_MODES:
                    sys.stdout.write(mig.INVALID)
                    return RC_ARGS
                mig_on, mode = MIG_MODES[value.upper()], "mig-mode"
            elif a in ("-r", "--gpu-reset"):
                mode = "reset"
            elif a == "nvlink" and ({"-s", "--status"} & set(args)):
                mode, args = "nvlink", []
            elif a == "mig":
                mig_cmd, mode = mig.parse_args(args), "mig"
                ids = mig_cmd.ids if mig_cmd.ids is not None else ids
                args = []
        if mode == "q":
            sys.stdout.write(f"gpuprov lab: nvidia-smi -q is not simulated; -q -x is ({core.SIMULATED})\n")
            return RC_ARGS
        unknown = sorted(set(fields) - {*IDENTITY_FIELDS, *SIM_FIELDS}) if mode == "query" else []
        if unknown:
            sys.stdout.write(f'Field "{unknown[0]}" is not a valid field to query next to a simulated one '
                             "in the gpuprov lab\n\n")  # fmt: skip
            return RC_ARGS
        if mode == "real" and {"-h", "--help"} & set(argv):
            return run_real(host, argv)
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
        if mode == "real":
            return run_real(host, argv)
        if mode == "xml":
            text = xml_text(host, st, chosen, version, cuda)
        elif mode == "query":
            text = query(host, st, chosen, version, fields, header)
        elif mode == "nvlink":
            text = nvlink_status(chosen, peers=len(gpus))
        elif mode == "reset":
            text = mig.reset(host, chosen)
        elif mode == "mig-mode":
            text = mig.set_mode(host, chosen, bool(mig_on))
        else:
            assert mig_cmd is not None
            text = mig.run(host, mig_cmd, [(gpus.index(g), g) for g in chosen])
        sys.stdout.write(text)
        return 0
    except (SmiError, mig.MigError) as exc:
        sys.stdout.write(str(exc))
        return exc.rc
