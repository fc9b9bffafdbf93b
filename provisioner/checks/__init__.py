"""Checks: pure functions over parsed probes + expectations → Findings.

Ids are the stable ones of the host-snapshot contract; reports and policies refer to them. A check
that cannot be evaluated says `skip` (not applicable / not collected) or `error` (could not read
what it needs) with the reason; it never passes by default. An exception inside a check becomes an
`error` finding, so one bad probe output never hides the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from provisioner.checks import (  # noqa: F401  (registers the checks)
    cluster,
    driver,
    gpu,
    monitoring,
    system,
    tenants,
)
from provisioner.checks.model import (
    ERROR,
    FAIL,
    PASS,
    RANK,
    REGISTRY,
    SKIP,
    STATUSES,
    WARN,
    Check,
    Finding,
    Unavailable,
    worst,
)
from provisioner.errors import InputError
from provisioner.expectations import Expectations
from provisioner.probes import PROBES
from provisioner.probes.base import HostFacts
from provisioner.probes.container import SMOKE

# Report order: the contract's table order.
CHECK_IDS: tuple[str, ...] = (
    "os.supported",
    "gpu.present",
    "gpu.count",
    "driver.loaded",
    "driver.version",
    "driver.userspace_match",
    "gpu.persistence",
    "gpu.ecc",
    "gpu.memory_remap",
    "gpu.pcie_link",
    "gpu.throttle",
    "gpu.xid",
    "cuda.version",
    "packages.held",
    "container_toolkit.runtime",
    "services.active",
    "k8s.node_ready",
    "k8s.gpu_allocatable",
    "gpu.sharing",
    "mig.config",
    "monitoring.dcgm_exporter",
    "tenants.quota",
    "dcgm.diag",
    "container.smoke",
)
assert set(CHECK_IDS) == set(REGISTRY), "every registered check has a place in the report order"

__all__ = [
    "CHECK_IDS",
    "ERROR",
    "FAIL",
    "PASS",
    "RANK",
    "SKIP",
    "STATUSES",
    "WARN",
    "Check",
    "Finding",
    "HostFacts",
    "evaluate",
    "probes_for",
    "select_checks",
    "worst",
]


def select_checks(ids: Iterable[str] | None) -> list[str]:
    """Validate a subset of check ids (None = all), keeping report order. Accepts prefixes: 'gpu.*'."""
    if ids is None:
        return list(CHECK_IDS)
    wanted: set[str] = set()
    for raw in ids:
        item = raw.strip()
        if not item:
            continue
        if item.endswith("*"):
            matched = [c for c in CHECK_IDS if c.startswith(item[:-1])]
        else:
            matched = [item] if item in REGISTRY else []
        if not matched:
            raise InputError(f"--checks: unknown check id {item!r} (ids: {', '.join(CHECK_IDS)})")
        wanted.update(matched)
    if not wanted:
        raise InputError("--checks: no check selected")
    return [c for c in CHECK_IDS if c in wanted]


def probes_for(ids: Iterable[str], smoke: bool = False) -> list[str]:
    """The probes the given checks read, in probe-set order."""
    needed = {p for c in ids for p in REGISTRY[c].probes}
    if not smoke:
        needed.discard(SMOKE)
    return [p.name for p in PROBES if p.name in needed]


def evaluate(facts: HostFacts, exp: Expectations, ids: Iterable[str] | None = None) -> list[Finding]:
    """Run the checks over one host's facts; every selected check yields at least one finding."""
    findings: list[Finding] = []
    for check_id in select_checks(ids):
        spec = REGISTRY[check_id]
        if check_id in exp.skip_checks:
            findings.append(
                Finding(check_id, SKIP, spec.severity, f"skipped by policy ({exp.source('checks.skip')})")
            )
            continue
        try:
            produced = spec.fn(facts, exp) or []
        except Unavailable as exc:
            produced = [Finding("", exc.status, "", exc.reason)]
        except Exception as exc:  # a check must never take the report down with it
            produced = [Finding("", ERROR, "", f"internal error in {check_id}: {type(exc).__name__}: {exc}")]
        if not produced:
            produced = [Finding("", ERROR, "", f"{check_id} produced no result")]
        findings += [
            dataclasses.replace(f, id=check_id, severity=f.severity or spec.severity) for f in produced
        ]
    return findings
