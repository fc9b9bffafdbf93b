"""What the NVIDIA driver says through nvidia-smi: `nvidia-smi -q -x` (each GPU as the driver sees it:
persistence, ECC mode and counters, retired and remapped memory, PCIe link, clocks event reasons, MIG
mode) and `nvidia-smi --version` (the userspace and NVML versions)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import defusedxml
import defusedxml.ElementTree as defused_et

from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.hosttext import first_line
from provisioner.probes.base import SKIP, HostFacts, ParseError, Probe, ProbeResult, Unavailable
from provisioner.probes.host import normalize_bus_id, require_gpu

SMI_XML = "nvidia-smi-q.xml"
SMI_VERSION = "nvidia-smi-version.txt"

# The start of every nvidia-smi probe: a host without the driver's userspace says so as "not found".
HAVE_SMI = (
    'command -v nvidia-smi >/dev/null 2>&1 || { echo "nvidia-smi: command not found" >&2; return 127; }'
)

PROBES: tuple[Probe, ...] = (
    Probe(SMI_XML, f"{HAVE_SMI}\nt 60 nvidia-smi -q -x", 70, "nvidia-smi -q -x"),
    Probe(SMI_VERSION, f"{HAVE_SMI}\nt 20 nvidia-smi --version", 25, "nvidia-smi --version"),
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


def smi_log(facts: HostFacts) -> SmiLog:
    """nvidia-smi -q -x, parsed. Skips (pointing at driver.loaded) when the driver is not working."""

    def load() -> SmiLog:
        res = smi_result(facts)
        if smi_no_devices(facts):
            return SmiLog(None, None, 0, [])
        if res.rc == 127:
            raise Unavailable(SKIP, "nvidia-smi not found: driver not installed (see driver.loaded)")
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
