"""Evidence → action, per GPU and per host. Pure functions over parsed facts (docs/health.md).

Actions, weakest first: none < reset-gpu < reboot < service. A GPU's action is the strongest its
evidence asks for; a host's is the strongest of its GPUs' (and of Xids no GPU can be named for). Drain is
true for every action but none. The driver's `gpu_recovery_action`, when it says anything but None, is
that GPU's verdict on its faults: it replaces what this boot's Xids would ask for (memory state —
row-remap failure or pending, uncorrectable ECC, a GPU the driver lost — still counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from provisioner.probes import host, kernel_log, smi
from provisioner.probes.base import HostFacts, Unavailable
from provisioner.probes.kernel_log import XidEvent, pci_device

NONE, RESET_GPU, REBOOT, SERVICE = "none", "reset-gpu", "reboot", "service"
ACTIONS = (NONE, RESET_GPU, REBOOT, SERVICE)
UNKNOWN = "unknown"  # a host whose evidence could not be read: never "none"

XID_TABLE = Path(__file__).with_name("xids.yaml")

# nvidia-smi's <gpu_recovery_action> values (NVIDIA, "Error Recovery and Response Flags",
# https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html).
RECOVERY_ACTIONS = {
    "none": NONE,
    "reset": RESET_GPU,
    "reboot": REBOOT,
    "drain p2p": RESET_GPU,
    "drain and reset": RESET_GPU,
}
_NO_VALUE = {"n/a", "[n/a]", "not supported", "[not supported]"}


def strongest(actions: list[str]) -> str:
    return max(actions, key=ACTIONS.index, default=NONE)


# ------------------------------------------------------------------------------------------ the Xid table


@dataclass(frozen=True)
class XidRule:
    xid: int
    name: str
    bucket: str
    action: str
    why: str = ""
    known: bool = True


@dataclass(frozen=True)
class XidTable:
    rules: dict[int, XidRule]
    unknown_bucket: str
    unknown_action: str
    unknown_why: str

    def rule(self, xid: int) -> XidRule:
        found = self.rules.get(xid)
        if found is not None:
            return found
        return XidRule(xid, "not in the catalog table", self.unknown_bucket, self.unknown_action,
                       self.unknown_why, known=False)  # fmt: skip


def table_from(doc: Any) -> XidTable:
    """The Xid table from its YAML document; ValueError when it is malformed (a packaging bug)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("xids"), dict):
        raise ValueError("Xid table: expected a mapping with 'buckets', 'unknown' and 'xids'")
    buckets = doc.get("buckets") or {}

    def action_of(bucket: str) -> str:
        action = buckets.get(bucket, SERVICE)
        if action not in ACTIONS:
            raise ValueError(f"Xid table: bucket {bucket}: unknown action {action!r}")
        return action

    rules: dict[int, XidRule] = {}
    for xid, entry in doc["xids"].items():
        if not isinstance(xid, int) or not isinstance(entry, dict) or "bucket" not in entry:
            raise ValueError(f"Xid table: entry {xid!r}: expected an Xid number with a bucket")
        bucket = str(entry["bucket"])
        action = str(entry.get("action") or action_of(bucket))
        if action not in ACTIONS:
            raise ValueError(f"Xid table: Xid {xid}: unknown action {action!r}")
        rules[xid] = XidRule(xid, str(entry.get("name", "")), bucket, action, str(entry.get("why", "")))
    unknown = doc.get("unknown") or {}
    ub = str(unknown.get("bucket", "CONTACT_SUPPORT"))
    return XidTable(rules, ub, action_of(ub), str(unknown.get("why", "")))


@cache
def xid_table() -> XidTable:
    return table_from(yaml.safe_load(XID_TABLE.read_text()))


# ------------------------------------------------------------------------------------------- evidence


@dataclass
class GpuEvidence:
    index: int | None  # nvidia-smi's index; None for a GPU the driver does not see
    pci: str
    recovery_action: str | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    unrepairable_memory: bool | None = None
    volatile_uncorrectable: int | None = None
    missing_from_driver: bool = False
    xids: list[XidEvent] = field(default_factory=list)


@dataclass
class HostEvidence:
    host: str
    gpus: list[GpuEvidence] = field(default_factory=list)
    unattributed_xids: list[XidEvent] = field(default_factory=list)  # no GPU on this host has that bus
    error: str | None = None


def answered_by_reset(
    e: XidEvent, reset_at: Mapping[str, float] | None, table: XidTable | None = None
) -> bool:
    """The Xid was logged before a GPU reset of its GPU (`reset_at`: PCI device → the host's uptime just
    before the reset) and a reset is all it asks for: the reset answered it."""
    done = (reset_at or {}).get(pci_device(e.pci))
    if done is None or e.uptime is None or e.uptime > done:
        return False
    return (table or xid_table()).rule(e.xid).action in (NONE, RESET_GPU)


def forget_answered(facts: HostFacts, reset_at: Mapping[str, float] | None) -> None:
    """From here on `facts` reads the kernel log without the Xids a GPU reset answered: what a judgement
    of the host after the reset (certification) must see. Nothing changes when the log is unreadable."""
    if not reset_at:
        return
    try:
        events = kernel_log.xids(facts)
    except Unavailable:
        return
    facts.settle(kernel_log.XIDS_KEY, [e for e in events if not answered_by_reset(e, reset_at)])


def gather(
    facts: HostFacts, reset_at: Mapping[str, float] | None = None, table: XidTable | None = None
) -> HostEvidence:
    """What the decision reads, from the facts `verify` reads (PCI list, nvidia-smi -q -x, kernel log).
    Any of them unreadable → an error: no evidence must never read as 'nothing to do'.

    `reset_at`: GPUs (by PCI domain:bus:device) reset in this boot, with the host's uptime just before the
    reset. The kernel log keeps the Xids that led to the reset for the rest of the boot; those stamped
    before it whose action a reset is (or less) are what the reset answered, not new evidence. An Xid
    that asks for more (a reboot, service) still counts, and so does one without a time stamp."""
    ev = HostEvidence(facts.host)
    try:
        pci = host.pci_gpus(facts)
        gpus = smi.smi_log(facts).gpus if pci else []
        events = kernel_log.xids(facts)
    except Unavailable as exc:
        ev.error = exc.reason
        return ev
    by_device: dict[str, GpuEvidence] = {}
    for g in gpus:
        ev.gpus.append(
            GpuEvidence(
                index=g.index,
                pci=g.bus_id,
                recovery_action=g.recovery_action,
                remap_pending=g.remap_pending,
                remap_failure=g.remap_failure,
                unrepairable_memory=g.unrepairable_memory,
                volatile_uncorrectable=g.ecc_volatile_uncorrectable,
            )
        )
    seen = {g.bus_id for g in gpus}
    for d in pci:
        if d.address not in seen:
            ev.gpus.append(GpuEvidence(index=None, pci=d.address, missing_from_driver=True))
    for g in ev.gpus:
        by_device[pci_device(g.pci)] = g
    for e in events:
        if answered_by_reset(e, reset_at, table):
            continue
        target = by_device.get(pci_device(e.pci))
        if target is not None:
            target.xids.append(e)
        else:
            ev.unattributed_xids.append(e)
    return ev


# ------------------------------------------------------------------------------------------- decisions


@dataclass
class GpuPlan:
    index: int | None
    pci: str
    action: str
    reasons: list[str]


@dataclass
class HostPlan:
    host: str
    action: str
    drain: bool | None
    reasons: list[str]
    gpus: list[GpuPlan]
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "action": self.action,
            "drain": self.drain,
            "reasons": self.reasons,
            "gpus": [
                {"index": g.index, "pci": g.pci, "action": g.action, "reasons": g.reasons} for g in self.gpus
            ],
        }
        if self.error is not None:
            out["error"] = self.error
        return out


def _xid_findings(events: list[XidEvent], table: XidTable) -> tuple[list[tuple[str, str]], list[str]]:
    """(action, reason) per distinct Xid, and warnings for Xids the table does not know."""
    counts: dict[int, int] = {}
    for e in events:
        counts[e.xid] = counts.get(e.xid, 0) + 1
    found: list[tuple[str, str]] = []
    warnings: list[str] = []
    for xid, n in sorted(counts.items()):
        rule = table.rule(xid)
        times = f" ×{n}" if n > 1 else ""
        why = f"; {rule.why}" if rule.why else ""
        found.append((rule.action, f"Xid {xid}{times} ({rule.name}): {rule.bucket} → {rule.action}{why}"))
        if not rule.known:
            warnings.append(
                f"Xid {xid} is not in the Xid table: treated as {rule.bucket} ({rule.action}), the catalog's "
                "bucket for unassigned codes"
            )
    return found, warnings


def recovery_action(text: str | None) -> tuple[str | None, str | None]:
    """(action, warning) for nvidia-smi's gpu_recovery_action; (None, None) when it asks for nothing."""
    if text is None:
        return None, None
    key = " ".join(text.split()).lower()
    if key in _NO_VALUE or key == "none":
        return None, None
    action = RECOVERY_ACTIONS.get(key)
    if action is None:
        return SERVICE, f"unknown gpu_recovery_action {text[:40]!r}: treated as service"
    return action, None


def decide_gpu(g: GpuEvidence, table: XidTable | None = None) -> tuple[GpuPlan, list[str]]:
    table = table or xid_table()
    found: list[tuple[str, str]] = []
    warnings: list[str] = []
    xids, xid_warnings = _xid_findings(g.xids, table)
    warnings += xid_warnings
    driver, warning = recovery_action(g.recovery_action)
    if warning:
        warnings.append(warning)
    if driver is not None:
        found.append(
            (driver, f"driver's gpu_recovery_action is {g.recovery_action} → {driver} (authoritative)")
        )
        found += [(NONE, f"{text} (superseded by the driver's recovery action)") for _, text in xids]
    else:
        found += xids
    if g.missing_from_driver:
        found.append((REBOOT, "on the PCI bus but not seen by the driver (NVML) → reboot"))
    if g.remap_failure:
        found.append((SERVICE, "row remapping failed: memory cannot be repaired → service"))
    if g.unrepairable_memory:
        found.append((SERVICE, "driver reports unrepairable memory → service"))
    if g.remap_pending:
        found.append((RESET_GPU, "row remap pending: a GPU reset activates it → reset-gpu"))
    if g.volatile_uncorrectable:
        found.append(
            (
                RESET_GPU,
                f"{g.volatile_uncorrectable} volatile uncorrectable ECC error(s) → reset-gpu",
            )
        )
    action = strongest([a for a, _ in found])
    return GpuPlan(g.index, g.pci, action, [text for _, text in found]), warnings


def decide(ev: HostEvidence, table: XidTable | None = None) -> HostPlan:
    table = table or xid_table()
    if ev.error is not None:
        return HostPlan(ev.host, UNKNOWN, None, [f"evidence unreadable: {ev.error}"], [], error=ev.error)
    plans: list[GpuPlan] = []
    warnings: list[str] = []
    reasons: list[str] = []
    for g in ev.gpus:
        plan, warned = decide_gpu(g, table)
        plans.append(plan)
        warnings += warned
        who = f"GPU {g.index}" if g.index is not None else f"GPU at {g.pci}"
        reasons += [f"{who}: {r}" for r in plan.reasons]
    loose, warned = _xid_findings(ev.unattributed_xids, table)
    warnings += warned
    buses = sorted({e.pci for e in ev.unattributed_xids})
    reasons += [f"PCI {', '.join(buses)} (no such GPU on this host): {text}" for _, text in loose]
    action = strongest([p.action for p in plans] + [a for a, _ in loose])
    reasons += [f"warning: {w}" for w in warnings]
    return HostPlan(ev.host, action, action != NONE, reasons, plans, warnings=warnings)


def plan_host(
    facts: HostFacts, table: XidTable | None = None, reset_at: Mapping[str, float] | None = None
) -> HostPlan:
    return decide(gather(facts, reset_at, table), table)
