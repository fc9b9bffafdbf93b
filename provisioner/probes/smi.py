"""What the NVIDIA driver says through nvidia-smi: `nvidia-smi -q -x` (each GPU as the driver sees it:
persistence, ECC mode and counters, retired and remapped memory, PCIe link, clocks event reasons, MIG
mode, memory size, power limits, temperature thresholds), `nvidia-smi --version` (the userspace and NVML
versions) and `nvidia-smi nvlink -s` (each GPU's NVLink links and the speed each runs at)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import defusedxml
import defusedxml.ElementTree as defused_et

from provisioner.hostnumbers import HostNumberError, parse_decimal, parse_int
from provisioner.hosttext import first_line
from provisioner.probes.base import ERROR, SKIP, HostFacts, ParseError, Probe, ProbeResult, Unavailable
from provisioner.probes.host import normalize_bus_id, require_gpu

SMI_XML = "nvidia-smi-q.xml"
SMI_VERSION = "nvidia-smi-version.txt"
SMI_NVLINK = "nvidia-smi-nvlink.txt"

# The start of every nvidia-smi probe: a host without the driver's userspace says so as "not found".
HAVE_SMI = (
    'command -v nvidia-smi >/dev/null 2>&1 || { echo "nvidia-smi: command not found" >&2; return 127; }'
)

PROBES: tuple[Probe, ...] = (
    Probe(SMI_XML, f"{HAVE_SMI}\nt 60 nvidia-smi -q -x", 70, "nvidia-smi -q -x"),
    Probe(SMI_VERSION, f"{HAVE_SMI}\nt 20 nvidia-smi --version", 25, "nvidia-smi --version"),
    Probe(SMI_NVLINK, f"{HAVE_SMI}\nt 30 nvidia-smi nvlink -s", 35, "nvidia-smi nvlink -s (link speeds)"),
)


@dataclass
class SmiGpu:
    index: int
    bus_id: str
    name: str = ""
    uuid: str = ""
    persistence: str | None = None  # Enabled / Disabled
    ecc_current: str | None = None  # Enabled / Disabled / N/A
    ecc_pending: str | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_volatile_correctable: int | None = None
    # Each volatile uncorrectable counter as printed ("0", "N/A", ...), for the check to judge.
    ecc_volatile_uncorrectable_texts: list[tuple[str, str]] = field(default_factory=list)
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_uncorrectable: int | None = None
    unrepairable_memory: bool | None = None
    repair_pending: list[str] = field(default_factory=list)
    link_gen_current: int | None = None
    link_gen_max: int | None = None
    link_width_current: int | None = None
    link_width_max: int | None = None
    performance_state: str | None = None
    event_reasons: dict[str, bool] = field(default_factory=dict)
    mig_mode: str | None = None
    # The driver's own verdict on what this GPU needs (<gpu_recovery_action>: None, Reset, Reboot,
    # Drain P2P, Drain and Reset), as printed; None where this driver prints no such element.
    recovery_action: str | None = None
    # What the board is: PCI device id (4 lower-case hex digits, "2335"), memory, the GPU's own PCIe
    # generation (without the host's limit) and the host's, power limits in watts.
    device_id: str = ""
    memory_total_mib: int | None = None
    link_gen_device_max: int | None = None
    link_gen_host_max: int | None = None
    power_limit_w: float | None = None  # the limit enforced now
    power_default_w: float | None = None
    power_max_w: float | None = None
    # Temperatures in C: the reading and, on drivers that print them, absolute thresholds (shutdown,
    # slowdown, max operating); newer drivers print the margin to the GPU's T.Limit instead and the
    # thresholds as margins (0 or below: the GPU is at or past that point).
    temp_c: int | None = None
    temp_shutdown_c: int | None = None
    temp_slowdown_c: int | None = None
    temp_max_operating_c: int | None = None
    tlimit_margin_c: int | None = None
    tlimit_shutdown_c: int | None = None
    tlimit_slowdown_c: int | None = None
    tlimit_max_operating_c: int | None = None


@dataclass
class SmiLog:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: list[SmiGpu]


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return value or None


_COUNT = re.compile(r"(?P<digits>[0-9]+)(?: ?[A-Za-z]+)?")


def _int(value: str | None, what: str = "count") -> int | None:
    """A count as nvidia-smi -q -x prints it ("0", "16x", "262144 MiB"); None where it prints none ("N/A",
    "[Unknown Error]"). ParseError for digits of another script, more digits than a counter holds or a
    number run into other text: no driver prints those, and reading a prefix would misread them."""
    if value is None:
        return None
    v = value.strip()
    if not v[:1].isdigit():
        return None
    m = _COUNT.fullmatch(v)
    if not m:
        raise ParseError(f"nvidia-smi -q -x: {what}: not a number: {v[:24]!r}")
    try:
        return parse_int(m["digits"], what=f"nvidia-smi -q -x: {what}")
    except HostNumberError as exc:
        raise ParseError(str(exc)) from None


_DEGREES = re.compile(r"(?P<digits>-?[0-9]+) ?C")
_WATTS = re.compile(r"(?P<digits>[0-9]+(?:\.[0-9]+)?) ?W")


def _celsius(value: str | None, what: str) -> int | None:
    """A temperature as nvidia-smi prints it ("36 C", "-8 C"); None where it prints none ("N/A")."""
    if value is None or not (value[:1].isdigit() or value[:1] == "-"):
        return None
    m = _DEGREES.fullmatch(value.strip())
    if not m:
        raise ParseError(f"nvidia-smi -q -x: {what}: not a temperature: {value[:24]!r}")
    try:
        return parse_int(m["digits"], lo=-300, hi=300, what=f"nvidia-smi -q -x: {what}")
    except HostNumberError as exc:
        raise ParseError(str(exc)) from None


def _watts(value: str | None, what: str) -> float | None:
    """A power as nvidia-smi prints it ("700.00 W"); None where it prints none ("N/A")."""
    if value is None or not value[:1].isdigit():
        return None
    m = _WATTS.fullmatch(value.strip())
    if not m:
        raise ParseError(f"nvidia-smi -q -x: {what}: not a power: {value[:24]!r}")
    try:
        return parse_decimal(m["digits"], lo=0, hi=100_000, what=f"nvidia-smi -q -x: {what}")
    except HostNumberError as exc:
        raise ParseError(str(exc)) from None


def _device_id(value: str | None) -> str:
    """<pci_device_id>233510DE</pci_device_id>: the device id (2335) before NVIDIA's vendor id (10DE)."""
    v = (value or "").strip().lower().removeprefix("0x")
    return v[:4] if re.fullmatch(r"[0-9a-f]{4}10de", v) else ""


def _yes(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "true", "active", "enabled"):
        return True
    if v in ("no", "false", "not active", "disabled", "none"):
        return False
    return None


def _counter(value: str | None, what: str) -> int | None:
    """An ECC counter's count, None where it does not read as one: gpu.ecc judges each counter's text as
    printed (ecc_volatile_uncorrectable_texts), so a bad counter is that GPU's error, not the host's."""
    try:
        return _int(value, what)
    except ParseError:
        return None


def _volatile_uncorrectable(volatile: ET.Element | None) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) volatile ECC counts across driver generations' layouts."""
    if volatile is None:
        return None, None
    double = volatile.find("double_bit")
    if double is not None:  # older drivers: single_bit/double_bit with a total each
        return (
            _counter(_text(double, "total"), "double_bit total"),
            _counter(_text(volatile.find("single_bit"), "total"), "single_bit total"),
        )
    unc: int | None = None
    cor: int | None = None
    for child in volatile:
        value = _counter(child.text, child.tag)
        if value is None:
            continue
        if "uncorrectable" in child.tag:
            unc = (unc or 0) + value
        elif "correctable" in child.tag:
            cor = (cor or 0) + value
    return unc, cor


def _volatile_uncorrectable_texts(volatile: ET.Element | None) -> list[tuple[str, str]]:
    """(counter, text as printed) of each volatile uncorrectable ECC counter, in either layout."""
    if volatile is None:
        return []
    double = volatile.find("double_bit")
    if double is not None:
        found = double.find("total")
        return [] if found is None else [("double_bit/total", (found.text or "").strip())]
    return [(c.tag, (c.text or "").strip()) for c in volatile if "uncorrectable" in c.tag]


def parse_nvidia_smi_xml(text: str) -> SmiLog:
    if not text.strip():
        raise ParseError("nvidia-smi -q -x printed nothing")
    try:
        # Host output is untrusted: real nvidia-smi writes a DOCTYPE naming its DTD (kept allowed), but
        # entity declarations (entity expansion bombs) and external references are refused outright
        # instead of resting on the linked expat's limits.
        root = defused_et.fromstring(text, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as exc:
        raise ParseError("nvidia-smi -q -x output declares XML entities (nvidia-smi never does)") from exc
    except ET.ParseError as exc:
        raise ParseError(f"nvidia-smi -q -x output is not well-formed XML (truncated?): {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"nvidia-smi -q -x: unexpected root element <{root.tag}>")
    gpus: list[SmiGpu] = []
    for index, g in enumerate(root.findall("gpu")):
        bus = g.get("id") or _text(g, "pci/pci_bus_id")
        if not bus:
            raise ParseError(f"nvidia-smi -q -x: GPU {index} has no PCI bus id")
        gpu = SmiGpu(index=index, bus_id=normalize_bus_id(bus))
        gpu.name = _text(g, "product_name") or ""
        gpu.uuid = _text(g, "uuid") or ""
        gpu.persistence = _text(g, "persistence_mode")
        gpu.ecc_current = _text(g, "ecc_mode/current_ecc")
        gpu.ecc_pending = _text(g, "ecc_mode/pending_ecc")
        gpu.ecc_volatile_uncorrectable, gpu.ecc_volatile_correctable = _volatile_uncorrectable(
            g.find("ecc_errors/volatile")
        )
        gpu.ecc_volatile_uncorrectable_texts = _volatile_uncorrectable_texts(g.find("ecc_errors/volatile"))
        gpu.retired_pending = _yes(_text(g, "retired_pages/pending_retirement"))
        gpu.remap_pending = _yes(_text(g, "remapped_rows/remapped_row_pending"))
        gpu.remap_failure = _yes(_text(g, "remapped_rows/remapped_row_failure"))
        gpu.remap_uncorrectable = _int(_text(g, "remapped_rows/remapped_row_unc"), "remapped_row_unc")
        gpu.unrepairable_memory = _yes(_text(g, "ecc_errors/unrepairable_memory"))
        gpu.repair_pending = [
            tag.replace("_repair_pending", "")
            for tag in ("channel_repair_pending", "tpc_repair_pending")
            if _yes(_text(g, f"ecc_errors/{tag}"))
        ]
        link = g.find("pci/pci_gpu_link_info")
        gpu.link_gen_current = _int(_text(link, "pcie_gen/current_link_gen"), "current_link_gen")
        gpu.link_gen_max = _int(_text(link, "pcie_gen/max_link_gen"), "max_link_gen")
        gpu.link_width_current = _int(_text(link, "link_widths/current_link_width"), "current_link_width")
        gpu.link_width_max = _int(_text(link, "link_widths/max_link_width"), "max_link_width")
        gpu.link_gen_device_max = _int(_text(link, "pcie_gen/max_device_link_gen"), "max_device_link_gen")
        gpu.link_gen_host_max = _int(_text(link, "pcie_gen/max_host_link_gen"), "max_host_link_gen")
        gpu.device_id = _device_id(_text(g, "pci/pci_device_id"))
        gpu.memory_total_mib = _int(_text(g, "fb_memory_usage/total"), "fb_memory_usage total")
        # <gpu_power_readings> since driver 530 or so, <power_readings> before; enforced_power_limit is
        # what older drivers call the limit in force.
        power = g.find("gpu_power_readings")
        power = power if power is not None else g.find("power_readings")
        gpu.power_limit_w = _watts(
            _text(power, "current_power_limit") or _text(power, "enforced_power_limit"), "power limit"
        )
        gpu.power_default_w = _watts(_text(power, "default_power_limit"), "default_power_limit")
        gpu.power_max_w = _watts(_text(power, "max_power_limit"), "max_power_limit")
        temp = g.find("temperature")
        gpu.temp_c = _celsius(_text(temp, "gpu_temp"), "gpu_temp")
        gpu.temp_shutdown_c = _celsius(_text(temp, "gpu_temp_max_threshold"), "gpu_temp_max_threshold")
        gpu.temp_slowdown_c = _celsius(_text(temp, "gpu_temp_slow_threshold"), "gpu_temp_slow_threshold")
        gpu.temp_max_operating_c = _celsius(
            _text(temp, "gpu_temp_max_gpu_threshold"), "gpu_temp_max_gpu_threshold"
        )
        gpu.tlimit_margin_c = _celsius(_text(temp, "gpu_temp_tlimit"), "gpu_temp_tlimit")
        gpu.tlimit_shutdown_c = _celsius(
            _text(temp, "gpu_temp_max_tlimit_threshold"), "gpu_temp_max_tlimit_threshold"
        )
        gpu.tlimit_slowdown_c = _celsius(
            _text(temp, "gpu_temp_slow_tlimit_threshold"), "gpu_temp_slow_tlimit_threshold"
        )
        gpu.tlimit_max_operating_c = _celsius(
            _text(temp, "gpu_temp_max_gpu_tlimit_threshold"), "gpu_temp_max_gpu_tlimit_threshold"
        )
        gpu.performance_state = _text(g, "performance_state")
        gpu.mig_mode = _text(g, "mig_mode/current_mig")
        recovery = _text(g, "gpu_recovery_action")
        if recovery is not None and len(recovery) > 64:
            raise ParseError(
                f"nvidia-smi -q -x: GPU {index}: gpu_recovery_action is {len(recovery)} characters long"
            )
        gpu.recovery_action = recovery
        for container, prefix in (
            ("clocks_event_reasons", "clocks_event_reason_"),
            ("clocks_throttle_reasons", "clocks_throttle_reason_"),
        ):
            reasons = g.find(container)
            if reasons is None:
                continue
            for child in reasons:
                state = _yes(child.text)
                if state is not None:
                    gpu.event_reasons[child.tag.removeprefix(prefix)] = state
        gpus.append(gpu)
    attached = _int(_text(root, "attached_gpus"), "attached_gpus")
    return SmiLog(_text(root, "driver_version"), _text(root, "cuda_version"), attached, gpus)


def parse_smi_version(text: str) -> dict[str, str]:
    """`nvidia-smi --version`: 'NVIDIA-SMI version : 580.159.04', 'NVML version : 580.159', ..."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            out[key.strip().lower()] = value.strip()
    if "nvidia-smi version" not in out:
        raise ParseError(f"nvidia-smi --version: no 'NVIDIA-SMI version' line: {first_line(text)!r}")
    return out


def smi_result(facts: HostFacts) -> ProbeResult:
    return facts.result(SMI_XML)


def smi_no_devices(facts: HostFacts) -> bool:
    """nvidia-smi ran against a loaded driver that sees no GPU at all."""
    res = facts.results.get(SMI_XML)
    return bool(res and res.rc not in (None, 0) and "No devices were found" in (res.stdout + res.stderr))


def _require_nvidia_smi(res: ProbeResult) -> None:
    """Skip, pointing at driver.loaded, where the shell found no nvidia-smi to run."""
    if res.rc == 127:
        raise Unavailable(SKIP, "nvidia-smi not found: driver not installed (see driver.loaded)")


def smi_log(facts: HostFacts) -> SmiLog:
    """nvidia-smi -q -x, parsed. Skips (pointing at driver.loaded) when the driver is not working."""

    def load() -> SmiLog:
        res = smi_result(facts)
        if smi_no_devices(facts):
            return SmiLog(None, None, 0, [])
        _require_nvidia_smi(res)
        if not res.ok:
            raise Unavailable(SKIP, f"nvidia-smi failed (see driver.loaded): {res.reason()}")
        return parse_nvidia_smi_xml(res.stdout)

    return facts.parsed("smi", load)


def smi_gpus(facts: HostFacts) -> list[SmiGpu]:
    """GPUs as the driver sees them; skip when the host has none or the driver sees none."""
    try:
        require_gpu(facts)
    except Unavailable as exc:
        if exc.status == SKIP:
            raise
        # PCI list unreadable: still judge what the driver reports.
    log = smi_log(facts)
    if not log.gpus:
        raise Unavailable(SKIP, "the driver sees no GPU (see gpu.count)")
    return log.gpus


def smi_version(facts: HostFacts) -> dict[str, str]:
    return facts.parsed("smiver", lambda: parse_smi_version(facts.ok_text(SMI_VERSION)))


# ------------------------------------------------------------------------------------------- NVLink


@dataclass
class NvlinkGpu:
    index: int
    name: str
    links: dict[int, float | None] = field(default_factory=dict)  # link → GB/s; None: <inactive>

    @property
    def active(self) -> int:
        return sum(1 for speed in self.links.values() if speed is not None)


# `nvidia-smi nvlink -s`, one block per GPU (as on real hosts: a V100 with inactive links in
# Azure/azhpc-diagnostics#73, a GB200 in NVIDIA/k8s-test-infra#371):
#   GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
#   \t Link 0: 26.562 GB/s
#   \t Link 3: <inactive>
# A GPU without NVLink prints its GPU line only.
_NVLINK_GPU = re.compile(r"GPU (?P<index>[0-9]{1,4}): (?P<name>.*?)(?: \(UUID: [^)]*\))?")
_NVLINK_LINK = re.compile(r"Link (?P<link>[0-9]{1,3}): (?P<value><inactive>|[0-9]{1,6}(\.[0-9]{1,6})? GB/s)")


def parse_nvlink_status(text: str) -> dict[int, NvlinkGpu]:
    """`nvidia-smi nvlink -s` → each GPU's links by index. A line that is neither a GPU's nor a link's
    (a driver's note) is ignored; a link line outside any GPU, or in an unknown form, is a ParseError."""
    gpus: dict[int, NvlinkGpu] = {}
    current: NvlinkGpu | None = None
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        m = _NVLINK_GPU.fullmatch(line)
        if m:
            current = NvlinkGpu(int(m["index"]), m["name"].strip()[:120])
            gpus[current.index] = current
            continue
        if line.startswith("Link "):
            link = _NVLINK_LINK.fullmatch(line)
            if link is None or current is None:
                raise ParseError(f"nvidia-smi nvlink -s: unexpected line {line[:60]!r}")
            value = link["value"]
            current.links[int(link["link"])] = None if value == "<inactive>" else float(value.split()[0])
    if not gpus and text.strip():
        raise ParseError(f"nvidia-smi nvlink -s: no GPU in the output: {first_line(text)!r}")
    return gpus


def nvlink_status(facts: HostFacts) -> dict[int, NvlinkGpu]:
    """Each GPU's NVLink links (skip where the probe did not apply or was not collected)."""

    def load() -> dict[int, NvlinkGpu]:
        res = facts.result(SMI_NVLINK)
        _require_nvidia_smi(res)
        if not res.ok:
            raise Unavailable(ERROR, f"nvidia-smi nvlink -s failed: {res.reason()}")
        return parse_nvlink_status(res.stdout)

    return facts.parsed("nvlink", load)
