"""GPU hardware health: presence, count, persistence, ECC, row remapping, PCIe link, clocks, Xid.

Per-GPU checks report one finding per GPU that is not fine (with its index and PCI bus id), or one
pass finding that covers all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from provisioner.checks.model import (
    ERROR,
    FAIL,
    PASS,
    SKIP,
    WARN,
    CheckFn,
    Finding,
    Unavailable,
    check,
    outcome,
)
from provisioner.expectations import Expectations
from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.probes import host, kernel_log, smi
from provisioner.probes.base import HostFacts
from provisioner.probes.host import HOST_FACTS
from provisioner.probes.kernel_log import KERNEL_LOG
from provisioner.probes.smi import SMI_XML, SmiGpu

PCI = HOST_FACTS  # PCI functions (host-facts.json's pci section)


def _gpu_finding(status: str, gpu: SmiGpu, detail: str, **data: Any) -> Finding:
    """A finding about one GPU: "GPU <index> (<bus id>): <detail>", with the index and bus id recorded."""
    return outcome(
        status, f"GPU {gpu.index} ({gpu.bus_id}): {detail}", gpu=gpu.index, bus_id=gpu.bus_id, **data
    )


GpuCheckFn = Callable[[list[SmiGpu], Expectations], list[Finding]]


def _gpu_check(check_id: str, *, severity: str) -> Callable[[GpuCheckFn], CheckFn]:
    """Register a check of the GPUs the driver sees: it is given them, from nvidia-smi's XML (the PCI
    list tells a host without GPUs, a skip, from a driver that sees none)."""

    def register(judge: GpuCheckFn) -> CheckFn:
        @wraps(judge)
        def run(facts: HostFacts, exp: Expectations) -> list[Finding]:
            return judge(smi.smi_gpus(facts), exp)

        return check(check_id, probes=(PCI, SMI_XML), severity=severity)(run)

    return register


def _all_pass(gpus: list[SmiGpu], what: str) -> list[Finding]:
    n = len(gpus)
    return [outcome(PASS, f"{what} on {'the GPU' if n == 1 else f'all {n} GPUs'}")]


@check("gpu.present", probes=(PCI,), severity="critical")
def gpu_present(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """an NVIDIA GPU is on the PCI bus"""
    devices = host.pci(facts)
    gpus = host.pci_gpus(facts)
    if gpus:
        kinds: dict[str, int] = {}
        for d in gpus:
            kinds[f"{d.vendor}:{d.device}"] = kinds.get(f"{d.vendor}:{d.device}", 0) + 1
        listed = ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items()))
        return [outcome(PASS, f"{len(gpus)} NVIDIA GPU(s) on the PCI bus ({listed})", count=len(gpus))]
    if exp.gpu_present is False:
        return [outcome(SKIP, f"no NVIDIA GPU on the PCI bus, none expected ({exp.source('gpu.present')})")]
    return [
        outcome(
            FAIL,
            f"no NVIDIA GPU on the PCI bus ({len(devices)} PCI devices seen, none NVIDIA class 0300/0302)",
        )
    ]


@check("gpu.count", probes=(PCI, SMI_XML), severity="critical")
def gpu_count(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """GPUs seen by the driver = NVIDIA GPUs on the PCI bus (= policy count)"""
    pci = host.pci_gpus(facts)
    findings: list[Finding] = []
    if exp.gpu_count is not None and len(pci) != exp.gpu_count:
        findings.append(
            outcome(
                FAIL,
                f"{len(pci)} GPU(s) on the PCI bus, {exp.gpu_count} expected ({exp.source('gpu.count')})",
                expected=exp.gpu_count,
                pci=len(pci),
            )
        )
    if not pci:
        if findings:
            return findings
        if exp.gpu_count == 0:
            return [outcome(PASS, f"no GPU, as expected ({exp.source('gpu.count')})", count=0)]
        raise Unavailable(SKIP, "no NVIDIA GPU on the PCI bus")
    try:
        driver = smi.smi_log(facts).gpus
    except Unavailable as exc:
        if findings:
            return findings
        if exc.status == ERROR:
            raise
        note = f"; {exp.gpu_count} expected and found" if exp.gpu_count is not None else ""
        raise Unavailable(
            SKIP, f"{len(pci)} GPU(s) on the PCI bus{note}; driver count unknown: {exc.reason}"
        ) from None
    seen = {g.bus_id for g in driver}
    missing = [(i, d.address) for i, d in enumerate(pci) if d.address not in seen]
    for index, bus in missing:
        findings.append(
            outcome(
                FAIL,
                f"GPU at {bus} is on the PCI bus but not seen by the driver "
                f"({len(driver)} of {len(pci)} seen)",
                gpu=index,
                bus_id=bus,
            )
        )
    if not missing and len(driver) != len(pci):
        findings.append(outcome(FAIL, f"driver sees {len(driver)} GPU(s), PCI bus has {len(pci)}"))
    if findings:
        return findings
    expected = f", as expected ({exp.source('gpu.count')})" if exp.gpu_count is not None else ""
    return [
        outcome(PASS, f"{len(pci)} GPU(s) on the PCI bus, all seen by the driver{expected}", count=len(pci))
    ]


@_gpu_check("gpu.persistence", severity="medium")
def gpu_persistence(gpus: list[SmiGpu], exp: Expectations) -> list[Finding]:
    """persistence mode enabled"""
    want = True if exp.gpu_persistence is None else exp.gpu_persistence
    want_text = "Enabled" if want else "Disabled"
    findings: list[Finding] = []
    for g in gpus:
        if g.persistence is None or g.persistence == "N/A":
            findings.append(_gpu_finding(ERROR, g, "persistence mode not reported"))
        elif g.persistence != want_text:
            findings.append(
                _gpu_finding(
                    FAIL,
                    g,
                    f"persistence mode {g.persistence}, expected {want_text} "
                    f"({exp.source('gpu.persistence')})",
                )
            )
    return findings or _all_pass(gpus, f"persistence mode {want_text}")


@_gpu_check("gpu.ecc", severity="high")
def gpu_ecc(gpus: list[SmiGpu], exp: Expectations) -> list[Finding]:
    """ECC enabled where expected; no volatile uncorrectable ECC errors"""
    findings: list[Finding] = []
    for g in gpus:
        counted = _volatile_uncorrectable(g)
        if counted.errors:
            findings.append(
                _gpu_finding(
                    FAIL,
                    g,
                    f"{counted.errors} volatile uncorrectable ECC error(s) since the driver loaded",
                    severity="critical",
                    uncorrectable=counted.errors,
                )
            )
        # With ECC on, the counters are what this check is for: no count is not a count of zero. With
        # ECC off or unsupported nvidia-smi prints N/A there, as it should. An impossible count is
        # wrong whatever the mode.
        unjudged = counted.impossible or (counted.missing if g.ecc_current == "Enabled" else None)
        if unjudged:
            findings.append(_gpu_finding(ERROR, g, unjudged))
        supported = g.ecc_current not in (None, "N/A")
        if exp.gpu_ecc is None:
            if supported and g.ecc_current != "Enabled":
                findings.append(
                    _gpu_finding(FAIL, g, f"ECC {g.ecc_current} (supported; expected Enabled by default)")
                )
        elif not supported:
            if exp.gpu_ecc:
                findings.append(
                    _gpu_finding(
                        FAIL,
                        g,
                        f"ECC not supported or not reported, expected Enabled ({exp.source('gpu.ecc')})",
                    )
                )
        elif (g.ecc_current == "Enabled") != exp.gpu_ecc:
            want = "Enabled" if exp.gpu_ecc else "Disabled"
            findings.append(
                _gpu_finding(FAIL, g, f"ECC {g.ecc_current}, expected {want} ({exp.source('gpu.ecc')})")
            )
        if supported and g.ecc_pending not in (None, "N/A", g.ecc_current):
            findings.append(
                _gpu_finding(
                    WARN, g, f"ECC {g.ecc_current} now, {g.ecc_pending} after the next GPU reset/reboot"
                )
            )
    if findings:
        return findings
    modes = {g.ecc_current for g in gpus}
    if modes <= {None, "N/A"}:
        return [outcome(SKIP, "ECC not supported on these GPUs; no uncorrectable errors reported")]
    if modes == {"Enabled"}:
        return _all_pass(gpus, "ECC enabled, no volatile uncorrectable errors")
    # ECC off as the policy wants (or off where unsupported): nothing counts errors, none are claimed.
    return _all_pass(gpus, f"ECC mode as expected ({exp.source('gpu.ecc')}), no uncorrectable errors counted")


@dataclass(frozen=True)
class _VolatileCount:
    errors: int  # uncorrectable errors counted
    missing: str | None = None  # why there is no count (N/A, no counter): as it should be with ECC off
    impossible: str | None = None  # a count no working GPU and driver print (negative, not a number)


def _volatile_uncorrectable(gpu: SmiGpu) -> _VolatileCount:
    """The volatile uncorrectable ECC count from the counters as printed; neither "N/A" nor a value
    that is no count is read as zero."""
    if not gpu.ecc_volatile_uncorrectable_texts:
        return _VolatileCount(0, missing="nvidia-smi shows no volatile uncorrectable ECC counter")
    total = 0
    missing: str | None = None
    for counter, text in gpu.ecc_volatile_uncorrectable_texts:
        if text == "N/A":
            missing = missing or f"volatile uncorrectable ECC counter {counter} is N/A: errors unknown"
            continue
        try:
            value = parse_int(text, lo=-(2**63), what=f"volatile ECC counter {counter}")
        except HostNumberError as exc:
            return _VolatileCount(total, missing, f"unreadable {exc}")
        if value < 0:
            return _VolatileCount(
                total, missing, f"volatile ECC counter {counter} is {value}: a count cannot be negative"
            )
        total += value
    return _VolatileCount(total, missing)


@_gpu_check("gpu.memory_remap", severity="high")
def gpu_memory_remap(gpus: list[SmiGpu], exp: Expectations) -> list[Finding]:
    """no pending row remap (warn), no remap failure (fail); no pending page retirement"""
    findings: list[Finding] = []
    evaluated = 0
    for g in gpus:
        if g.remap_failure is None and g.remap_pending is None and g.retired_pending is None:
            continue
        evaluated += 1
        if g.remap_failure:
            findings.append(
                _gpu_finding(
                    FAIL,
                    g,
                    "row remapping failure (memory cannot be repaired: replace the GPU)",
                    severity="critical",
                )
            )
        if g.unrepairable_memory:
            findings.append(_gpu_finding(FAIL, g, "unrepairable memory reported", severity="critical"))
        if g.remap_pending:
            findings.append(_gpu_finding(WARN, g, "row remap pending (reset the GPU or reboot to apply)"))
        if g.retired_pending:
            findings.append(_gpu_finding(WARN, g, "page retirement pending (reset the GPU or reboot)"))
        for what in g.repair_pending:
            findings.append(_gpu_finding(WARN, g, f"{what} repair pending"))
    if findings:
        return findings
    if not evaluated:
        return [outcome(SKIP, "neither row remapping nor page retirement is reported by these GPUs")]
    return _all_pass(gpus, "no pending or failed row remaps")


@_gpu_check("gpu.pcie_link", severity="medium")
def gpu_pcie_link(gpus: list[SmiGpu], exp: Expectations) -> list[Finding]:
    """PCIe link at its maximum generation and width"""
    findings: list[Finding] = []
    notes: list[str] = []
    unknown = 0
    for g in gpus:
        if None in (g.link_gen_current, g.link_gen_max, g.link_width_current, g.link_width_max):
            unknown += 1
            continue
        assert g.link_gen_current is not None and g.link_gen_max is not None
        assert g.link_width_current is not None and g.link_width_max is not None
        width_low = g.link_width_current < g.link_width_max
        gen_low = g.link_gen_current < g.link_gen_max
        now = f"Gen{g.link_gen_current} x{g.link_width_current} (max Gen{g.link_gen_max} x{g.link_width_max})"
        idle = (g.performance_state or "P0") not in ("P0", "P1", "P2")
        if width_low or (gen_low and not idle):
            findings.append(
                _gpu_finding(
                    WARN,
                    g,
                    f"PCIe link degraded: {now}",
                    gen=g.link_gen_current,
                    gen_max=g.link_gen_max,
                    width=g.link_width_current,
                    width_max=g.link_width_max,
                )
            )
        elif gen_low:
            notes.append(f"GPU {g.index} at Gen{g.link_gen_current} while idle ({g.performance_state})")
    if findings:
        return findings
    if unknown == len(gpus):
        raise Unavailable(ERROR, "nvidia-smi reported no PCIe link generation/width")
    detail = "PCIe link at maximum generation and width"
    if notes:
        detail += "; power-saving downshift only: " + ", ".join(notes)
    return _all_pass(gpus, detail)


_SLOWDOWN = {
    "hw_slowdown": "hardware slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "power brake slowdown",
    "sw_thermal_slowdown": "software thermal slowdown",
}


@_gpu_check("gpu.throttle", severity="medium")
def gpu_throttle(gpus: list[SmiGpu], exp: Expectations) -> list[Finding]:
    """no hardware slowdown, thermal or power-brake clock reason active"""
    findings: list[Finding] = []
    if all(not g.event_reasons for g in gpus):
        raise Unavailable(ERROR, "nvidia-smi reported no clocks event (throttle) reasons")
    for g in gpus:
        active = [text for key, text in _SLOWDOWN.items() if g.event_reasons.get(key)]
        if active:
            findings.append(_gpu_finding(WARN, g, f"clocks held down: {', '.join(active)}", reasons=active))
    return findings or _all_pass(gpus, "no slowdown reason active")


# Xid → (status, short name). From NVIDIA's Xid catalogue; unknown Xids warn and are named by number.
XID_FAIL = {48, 63, 64, 74, 79, 92, 94, 95}
XID_WARN = {13, 31, 43}
XID_NAMES = {
    8: "GPU stopped processing (timeout)",
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing",
    45: "preemptive cleanup after earlier errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remap recording event",
    64: "ECC page retirement / row remap recording failure",
    68: "video decoder exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    154: "GPU recovery action changed",
}


def xid_name(xid: int) -> str:
    return XID_NAMES.get(xid, "see NVIDIA's Xid catalogue")


@check("gpu.xid", probes=(KERNEL_LOG, PCI, SMI_XML), severity="high")
def gpu_xid(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """no NVRM Xid in this boot's kernel log (severity by Xid)"""
    events = kernel_log.xids(facts)
    ignored = set(exp.xid_ignore)
    by_gpu: dict[tuple[int | None, str], list[int]] = {}
    first_msg: dict[tuple[int | None, str], str] = {}
    skipped: list[int] = []
    for ev in events:
        if ev.xid in ignored:
            skipped.append(ev.xid)
            continue
        key = kernel_log.gpu_index_for_pci(facts, ev.pci)
        by_gpu.setdefault(key, []).append(ev.xid)
        first_msg.setdefault(key, ev.message)
    findings: list[Finding] = []
    for (index, bus), xids in sorted(
        by_gpu.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
    ):
        counts: dict[int, int] = {}
        for x in xids:
            counts[x] = counts.get(x, 0) + 1
        status = FAIL if any(x in XID_FAIL for x in counts) else WARN
        listed = ", ".join(
            f"Xid {x} ({xid_name(x)})" + (f" ×{n}" if n > 1 else "") for x, n in counts.items()
        )
        who = f"GPU {index} ({bus})" if index is not None else f"PCI {bus}"
        msg = first_msg[(index, bus)]
        findings.append(
            outcome(
                status,
                f"{who}: {listed}" + (f"; first: {msg[:120]}" if msg else ""),
                gpu=index,
                bus_id=bus,
                severity="critical" if status == FAIL else "medium",
                xids=sorted(counts),
            )
        )
    if findings:
        return findings
    note = f" ({len(skipped)} ignored by policy: {sorted(set(skipped))})" if skipped else ""
    try:
        if not host.pci_gpus(facts):
            return [outcome(SKIP, "no NVIDIA GPU on the PCI bus; no Xid in the kernel log" + note)]
    except Unavailable:
        pass
    return [outcome(PASS, "no Xid in this boot's kernel log" + note)]
