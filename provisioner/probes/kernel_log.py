"""The kernel log of this boot (journalctl -k -b, else dmesg) and the NVRM Xid events in it: which GPU
reported what."""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.hosttext import first_line
from provisioner.probes.base import ERROR, HostFacts, ParseError, Probe, Unavailable
from provisioner.probes.host import normalize_bus_id, pci_gpus
from provisioner.probes.smi import smi_log

KERNEL_LOG = "kernel-log.txt"

_KERNEL_LOG = r"""
    if { [ -d /run/log/journal ] || [ -d /var/log/journal ]; } && command -v journalctl >/dev/null 2>&1 &&
       journalctl -k -b -n 1 -q --no-pager 2>/dev/null | grep -q .; then
      t 60 journalctl -k -b --no-pager -o short-monotonic
    else
      t 30 dmesg
    fi
"""

PROBES: tuple[Probe, ...] = (
    Probe(KERNEL_LOG, _KERNEL_LOG, 70, "kernel log of this boot (journalctl -k -b, else dmesg)"),
)


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str  # as printed: 0000:00:06 (domain:bus:device, no function) or with function
    message: str
    line: str
    # Seconds since boot the kernel stamped it with ("[ 123.456]" of dmesg and of journalctl's
    # short-monotonic): None when the line has no such stamp.
    uptime: float | None = None


# The Xid number is ASCII digits ending at a separator: "7²9" or "٧٩" are no Xid 7 or 79. Its size is
# checked where it is read (xid_number): an absurd number is an error, not a line to skip.
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9])?)\): "
    r"(?P<xid>[0-9]+)(?=[\s,]|$)\s*,?\s*(?P<msg>.*)$"
)
_FALLEN = re.compile(
    r"NVRM: (?:The NVIDIA )?GPU (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9])"
)
# NVIDIA's catalog of Xids stops below 200; four digits leave room for years of new ones.
XID_MAX = 9999


def xid_number(text: str) -> int:
    """The number of an Xid line (XID_LINE's `xid`); HostNumberError when no driver would print it."""
    return parse_int(text, lo=0, hi=XID_MAX, what="Xid")


# dmesg "[   12.345678] ...", journalctl short-monotonic "[   12.345678] host kernel: ...", journalctl
# short "Dec 02 15:10:01 host kernel: ...", and ISO timestamps.
_UPTIME = re.compile(r"^\[\s*(\d{1,10}\.\d{1,9})\]")
_KLOG_LINE = re.compile(r"^(\[\s*\d+\.\d+\]|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d |\d{4}-\d\d-\d\dT\d\d:\d\d)")


def parse_kernel_log(text: str) -> list[XidEvent]:
    """NVRM Xid events of this boot. A 'GPU ... has fallen off the bus' report without an Xid
    line (newer drivers print it over several lines) counts as Xid 79. Text that has no kernel-log
    line at all is refused: "no Xid" must mean a log was read."""
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise ParseError("kernel log is empty: no messages for this boot were readable")
    if not any(_KLOG_LINE.match(line) for line in lines[:200]):
        raise ParseError(f"kernel log: not in dmesg/journalctl format: {first_line(text, 80)!r}")
    events: list[XidEvent] = []
    fallen: list[XidEvent] = []
    for i, line in enumerate(lines):
        if "NVRM" not in line:
            continue
        m = XID_LINE.search(line)
        if m:
            try:
                xid = xid_number(m.group("xid"))
            except HostNumberError as exc:
                raise ParseError(f"kernel log line {i + 1}: {exc}") from None
            events.append(XidEvent(xid, m.group("pci").lower(), m.group("msg").strip(), line, _uptime(line)))
            continue
        f = _FALLEN.search(line)
        if f:
            window = " ".join(lines[i : i + 4])
            if "fallen off the bus" in window:
                fallen.append(
                    XidEvent(79, f.group("pci").lower(), "GPU has fallen off the bus", line, _uptime(line))
                )
    # Drivers that print an Xid 79 line also print the "fallen off the bus" report: one event, not two.
    seen_79 = {pci_device(e.pci) for e in events if e.xid == 79}
    events.extend(e for e in fallen if pci_device(e.pci) not in seen_79)
    return events


def _uptime(line: str) -> float | None:
    m = _UPTIME.match(line)
    return float(m.group(1)) if m else None


def pci_device(pci: str) -> str:
    """domain:bus:device, without the function and with an 8-digit domain cut to 4 (as lspci prints)."""
    base = pci.split(".", 1)[0].lower()
    domain, _, rest = base.partition(":")
    return f"{domain[-4:]}:{rest}"


XIDS_KEY = "xids"


def xids(facts: HostFacts) -> list[XidEvent]:
    def load() -> list[XidEvent]:
        res = facts.result(KERNEL_LOG)
        if not res.ok:
            raise Unavailable(ERROR, f"kernel log unreadable (needs root): {res.reason()}")
        return parse_kernel_log(res.stdout)

    return facts.parsed(XIDS_KEY, load)


def gpu_index_for_pci(facts: HostFacts, pci: str) -> tuple[int | None, str]:
    """Map a kernel-log PCI address (0000:3b:00, no function) to the GPU index and full bus id."""
    wanted = normalize_bus_id(pci)
    lists: list[list[str]] = []
    for source in (
        lambda: [g.bus_id for g in smi_log(facts).gpus],
        lambda: [d.address for d in pci_gpus(facts)],
    ):
        try:
            lists.append(source())
        except Unavailable:
            continue
    for candidates in lists:
        for index, bus in enumerate(candidates):
            if bus == wanted or bus.startswith(wanted + "."):
                return index, bus
    return None, wanted
