"""Findings, statuses and the check registry: the vocabulary reports and policies share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# A fact's Unavailable is the checks' too: a check raises it for what it cannot judge.
from provisioner.probes.base import ERROR, SKIP, HostFacts
from provisioner.probes.base import Unavailable as Unavailable

if TYPE_CHECKING:
    from provisioner.expectations import Expectations

PASS, WARN, FAIL = "pass", "warn", "fail"
STATUSES: tuple[str, ...] = (PASS, WARN, FAIL, SKIP, ERROR)
# How bad a status is, for "worst of" summaries: a host whose checks passed or did not apply is a
# pass; a fail outranks an error (it is a real finding, the error is a gap in what we know).
RANK: dict[str, int] = {SKIP: 0, PASS: 1, WARN: 2, ERROR: 3, FAIL: 4}

# Severity says how much a non-passing result matters; a check has a default, a finding may raise it.
SEVERITIES: tuple[str, ...] = ("critical", "high", "medium", "low", "info")


def worst(statuses: list[str] | tuple[str, ...]) -> str:
    return max(statuses, key=lambda s: RANK[s]) if statuses else SKIP


@dataclass(frozen=True)
class Finding:
    id: str
    status: str
    severity: str
    detail: str
    gpu: int | None = None  # GPU index (nvidia-smi order = PCI bus order) when the finding is about one GPU
    bus_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "status": self.status,
            "severity": self.severity,
            "detail": self.detail,
        }
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.bus_id is not None:
            out["bus_id"] = self.bus_id
        if self.data:
            out["data"] = self.data
        return out


def outcome(
    status: str,
    detail: str,
    *,
    gpu: int | None = None,
    bus_id: str | None = None,
    severity: str = "",
    **data: Any,
) -> Finding:
    """A finding from inside a check; the registry fills in the check id and default severity."""
    return Finding("", status, severity, detail, gpu, bus_id, data)


CheckFn = Callable[["HostFacts", "Expectations"], list[Finding]]


@dataclass(frozen=True)
class Check:
    id: str
    probes: tuple[str, ...]
    severity: str
    summary: str
    fn: CheckFn


REGISTRY: dict[str, Check] = {}


def check(check_id: str, *, probes: tuple[str, ...], severity: str) -> Callable[[CheckFn], CheckFn]:
    """Register a check; ids are the stable ones of the host-snapshot contract. The function's docstring
    is the check's summary: what it finds fine."""

    def register(fn: CheckFn) -> CheckFn:
        if check_id in REGISTRY:
            raise ValueError(f"duplicate check id {check_id}")
        if not fn.__doc__:
            raise ValueError(f"check {check_id} has no docstring to summarise it")
        REGISTRY[check_id] = Check(check_id, probes, severity, " ".join(fn.__doc__.split()), fn)
        return fn

    return register
