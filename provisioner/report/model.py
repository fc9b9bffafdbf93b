"""The result of a verification run: per host, the findings of each check; and what it adds up to."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from provisioner.checks.model import ERROR, FAIL, PASS, RANK, SKIP, STATUSES, WARN, Finding, worst
from provisioner.hosttext import safe_text

FAIL_ON = ("warn", "fail")


@dataclass
class HostReport:
    host: str
    findings: list[Finding]
    address: str | None = None
    error: str | None = None  # the host could not be probed (unreachable, auth, snapshot error)
    duration_s: float = 0.0
    collected_at: str | None = None

    def by_check(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            out.setdefault(f.id, []).append(f)
        return out

    def status_of(self, check_id: str) -> str | None:
        found = [f.status for f in self.findings if f.id == check_id]
        return worst(found) if found else None

    @property
    def status(self) -> str:
        return worst([f.status for f in self.findings]) if self.findings else (ERROR if self.error else SKIP)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host}
        if self.address:
            out["address"] = self.address
        out["status"] = self.status
        if self.error:
            out["error"] = self.error
        if self.collected_at:
            out["collected_at"] = self.collected_at
        out["duration_s"] = round(self.duration_s, 3)
        out["checks"] = [f.to_dict() for f in self.findings]
        return out


@dataclass
class Report:
    hosts: list[HostReport]
    checks: list[str]
    started_at: str
    duration_s: float = 0.0
    policy: str | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def check_statuses(self) -> Iterable[str]:
        """Worst status per host × check (what the drift table shows)."""
        for h in self.hosts:
            for check_id in self.checks:
                status = h.status_of(check_id)
                if status is not None:
                    yield status

    def summary(self) -> dict[str, Any]:
        counts = dict.fromkeys(STATUSES, 0)
        for status in self.check_statuses():
            counts[status] += 1
        failing = [h.host for h in self.hosts if RANK[h.status] >= RANK[WARN]]
        return {
            "hosts": len(self.hosts),
            "hosts_ok": sum(1 for h in self.hosts if h.status in (PASS, SKIP)),
            "hosts_with_findings": len(failing),
            "hosts_unreachable": sum(1 for h in self.hosts if h.error),
            "checks": counts,
            "status": worst([h.status for h in self.hosts]) if self.hosts else SKIP,
        }

    def exit_code(self, fail_on: str = "warn") -> int:
        """0 when every check is pass or skip; 1 on warn (unless fail_on='fail'), fail or error."""
        bad = {FAIL, ERROR} | ({WARN} if fail_on == "warn" else set())
        return (
            1
            if any(f.status in bad for h in self.hosts for f in h.findings)
            or any(h.error for h in self.hosts)
            else 0
        )

    def to_dict(self) -> dict[str, Any]:
        from provisioner import __version__

        return {
            "collector": f"gpuprov {__version__}",
            "generated_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "source": self.source,
            "policy": self.policy,
            "checks_run": self.checks,
            "hosts": [h.to_dict() for h in self.hosts],
            "summary": self.summary(),
        }


def _safe_data(value: Any) -> Any:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(str(k)): _safe_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_safe_data(v) for v in value]
    return value


def sanitized(report: Report) -> Report:
    """The report with every string that can come from a host or a snapshot made safe to display."""
    hosts = [
        replace(
            h,
            host=safe_text(h.host),
            address=safe_text(h.address) if h.address else h.address,
            error=safe_text(h.error) if h.error else h.error,
            collected_at=safe_text(h.collected_at) if h.collected_at else h.collected_at,
            findings=[
                replace(
                    f,
                    detail=safe_text(f.detail),
                    bus_id=safe_text(f.bus_id) if f.bus_id else f.bus_id,
                    data=_safe_data(f.data),
                )
                for f in h.findings
            ],
        )
        for h in report.hosts
    ]
    return replace(report, hosts=hosts, source=safe_text(report.source))
