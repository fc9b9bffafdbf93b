"""What `gpuprov remediate --dry-run` does: read each host's evidence (over SSH, locally or from a
snapshot), decide, and render the plan. It only reads: nothing on any host is changed."""

from __future__ import annotations

import json
from pathlib import Path

from provisioner.checks import HostFacts, probes_for
from provisioner.executors import ExecutorError
from provisioner.health.decide import NONE, UNKNOWN, HostPlan, plan_host
from provisioner.hosttext import short_safe_text
from provisioner.verification import (
    DEFAULT_PARALLEL,
    DEFAULT_TIMEOUT,
    Target,
    _run_parallel,
    collect_from,
    read_targets,
)

# The probes `gpu.xid` reads: kernel log, PCI list (host facts), nvidia-smi -q -x.
EVIDENCE_CHECKS = ("gpu.xid",)


def _plan_target(target: Target, names: list[str], timeout: float) -> HostPlan:
    try:
        results = collect_from(target, names, timeout)
    except ExecutorError as exc:
        return HostPlan(target.name, UNKNOWN, None, [f"host not read: {exc.reason}"], [], error=exc.reason)
    return plan_host(HostFacts(target.name, results))


def run_remediate(
    *,
    inventory: Path | None = None,
    local: bool = False,
    snapshot: Path | None = None,
    limit: str | None = None,
    parallel: int = DEFAULT_PARALLEL,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[HostPlan]:
    """Validate every input first (InputError, before any host is contacted), then read and decide."""
    targets = read_targets(inventory, local, snapshot, limit, parallel)
    names = probes_for(EVIDENCE_CHECKS)
    return _run_parallel(targets, lambda t: _plan_target(t, names, timeout), parallel)


def exit_code(plans: list[HostPlan]) -> int:
    """0 when every host needs nothing; 1 when any host needs an action or could not be read."""
    return 0 if all(p.action == NONE and p.error is None for p in plans) else 1


def to_json(plans: list[HostPlan]) -> str:
    # ensure_ascii: host text reaches the output escaped, never as terminal controls.
    return json.dumps({"hosts": [p.to_json() for p in plans]}, indent=2, ensure_ascii=True) + "\n"


def to_table(plans: list[HostPlan]) -> str:
    """One line per host (host, action, drain), its reasons indented below; every host text made safe."""
    hosts = [short_safe_text(p.host, 60) for p in plans]
    width = max([len("HOST"), *map(len, hosts)])
    lines = [f"{'HOST':<{width}}  {'ACTION':<9}  DRAIN"]
    for name, p in zip(hosts, plans, strict=True):
        drain = "-" if p.drain is None else ("yes" if p.drain else "no")
        lines.append(f"{name:<{width}}  {p.action:<9}  {drain}")
        for reason in p.reasons:
            lines.append(f"    {short_safe_text(reason, 300)}")
    needs = [p for p in plans if p.action != NONE or p.error is not None]
    lines.append("")
    lines.append(
        f"{len(plans)} host(s): {len(plans) - len(needs)} need nothing, {len(needs)} need an action or "
        "could not be read. Dry run: nothing was changed."
    )
    return "\n".join(lines) + "\n"
