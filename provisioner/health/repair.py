"""What `gpuprov remediate -i INV` (without --dry-run) does: check every input (exit 2, nothing touched),
read each GPU host's evidence, plan, and act through the rolling engine (provisioner.health.act).

Which hosts are acted on:
- the evidence asks for nothing: left alone;
- the node carries gpuprov's needs-service taint: left alone (an operator takes it off after the repair);
- a reboot is needed and --allow-reboot was not given: left alone, not even drained (nothing gpuprov may
  do would repair it), and said so;
- any other action: cordoned, drained, repaired, certified, uncordoned — or left for service.
`--watch` repeats this every --interval seconds until interrupted; a cycle with nothing to do writes no
record. A run stopped half-way (Ctrl-C, a crash) leaves its nodes cordoned and recorded: the next run
takes over what it cordoned and puts those nodes back once repaired.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError
from provisioner.health.act import (
    REMEDIATE,
    Certifier,
    HealOptions,
    HealRollout,
    parse_budget,
)
from provisioner.health.certify import LEVELS as CERTIFY_LEVELS
from provisioner.health.decide import NONE, REBOOT, UNKNOWN, HostPlan
from provisioner.health.fleet import SERVICE_TAINT, HealFleet, HealProbe
from provisioner.hosttext import short_safe_text
from provisioner.rollout.engine import begin_new_run, execute
from provisioner.rollout.model import ProgressFn, StepFailed
from provisioner.rollout.plan import CHANGE, SKIP, BatchSize, Plan, Target
from provisioner.rollout.plan import HostPlan as WavePlan
from provisioner.rollout.state import (
    CHANGED,
    FAILED,
    NOT_STARTED,
    SKIPPED,
    RolloutState,
    inventory_lock,
    run_records,
)

CertifierFactory = Callable[[list[Any], Path, HealFleet], Certifier]
"""(the GPU hosts, the inventory, the cluster) → the certifier a run uses."""


@dataclass
class HostRow:
    plan: HostPlan
    outcome: str  # none | repaired | needs-service | held | failed | not-started | unreadable
    detail: str = ""
    node: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.plan.to_json(), "outcome": self.outcome, "detail": self.detail, "node": self.node}


@dataclass
class CycleResult:
    rows: list[HostRow]
    exit_code: int
    record: str | None = None
    stop_reason: str = ""
    notes: list[str] = field(default_factory=list)


def check_options(
    *,
    inventory: Path | None,
    local: bool,
    snapshot: Path | None,
    certify_level: str,
    max_concurrent: int,
    budget: str | None,
    watch: bool,
    interval: float,
) -> HealOptions:
    """Every option checked before any host is contacted (InputError: exit 2)."""
    if local or snapshot is not None:
        raise InputError(
            "remediate acts on a cluster's nodes: give -i/--inventory (--local and --snapshot plan only, "
            "with --dry-run)"
        )
    if inventory is None:
        raise InputError("-i/--inventory is required to act (try: gpuprov lab inventory)")
    if certify_level not in CERTIFY_LEVELS:
        raise InputError(
            f"--certify-level {short_safe_text(certify_level, 40)!r}: one of {', '.join(CERTIFY_LEVELS)}"
        )
    if max_concurrent < 1:
        raise InputError(f"--max-concurrent {max_concurrent}: at least 1 node")
    if watch and not (1 <= interval < math.inf):
        raise InputError(f"--interval {interval:g}: at least 1 second")
    return HealOptions(
        certify_level=certify_level, max_concurrent=max_concurrent, budget=parse_budget(budget)
    )


RESETS_FILE = "resets.json"


def _earlier_runs(inventory: str) -> Iterator[dict[str, Any]]:
    """The state of each earlier remediate run on this inventory, newest first (`record`: its folder)."""
    for path in run_records(REMEDIATE.verb):
        try:
            doc = json.loads((path / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("inventory") == inventory:
            yield {**doc, "record": path}


def earlier_resets(inventory: str) -> dict[str, tuple[str, dict[str, float]]]:
    """The GPU resets the latest earlier run on this inventory made (host → boot id, PCI device → uptime
    before the reset), read back from its record; the fleet uses them only while the host is still in
    that boot. A record without them, or with anything else in their place, gives none."""
    for doc in _earlier_runs(inventory):
        try:
            raw = json.loads((doc["record"] / RESETS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        out: dict[str, tuple[str, dict[str, float]]] = {}
        for host, entry in raw.items() if isinstance(raw, dict) else ():
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                continue
            marks = entry[1] if isinstance(entry[1], dict) else {}
            kept = {str(k): float(v) for k, v in marks.items() if isinstance(v, (int, float)) and v >= 0}
            out[str(host)] = (entry[0][:64], dict(list(kept.items())[:64]))
        return out
    return {}


def drained_since(inventory: str, since: float) -> int:
    """Hosts drained by earlier remediate runs on this inventory since `since` (unix time)."""
    count = 0
    for doc in _earlier_runs(inventory):
        for host in (doc.get("hosts") or {}).values():
            history = host.get("history") if isinstance(host, dict) else None
            if any(
                isinstance(h, list) and len(h) > 1 and h[0] == "draining" and isinstance(h[1], (int, float))
                and h[1] >= since
                for h in history or []
            ):  # fmt: skip
                count += 1
    return count


def taken_over(inventory: str) -> dict[str, dict[str, Any]]:
    """Hosts the latest earlier run left cordoned by itself without ending them (interrupted, crashed):
    what the new run needs to put their nodes back as they were. Older runs were taken over by it."""
    for doc in _earlier_runs(inventory):
        return {
            str(name): {
                "was_cordoned": bool(h.get("was_cordoned")),
                "cordoned_by_us": True,
                "paused_labels": dict(h.get("paused_labels") or {}),
                "node": h.get("node"),
            }
            for name, h in (doc.get("hosts") or {}).items()
            if isinstance(h, dict) and h.get("cordoned_by_us") and h.get("result") not in (CHANGED, SKIPPED)
        }
    return {}


def tainted_nodes(fleet: HealFleet) -> dict[str, str]:
    """Nodes carrying the needs-service taint → the reason annotated (the whole cluster: every node out
    counts against --max-concurrent)."""
    assert fleet.kube is not None
    res = fleet.kube.kubectl("get", "nodes", "-o", "json")
    if res.rc != 0:
        raise StepFailed(f"kubectl get nodes: {short_safe_text(res.stderr.strip()[-200:])}")
    try:
        items = json.loads(res.stdout).get("items") or []
    except (ValueError, AttributeError) as exc:
        raise StepFailed("kubectl get nodes: not JSON") from exc
    out: dict[str, str] = {}
    for n in items:
        taints = ((n.get("spec") or {}).get("taints")) or []
        if any(isinstance(t, dict) and t.get("key") == SERVICE_TAINT for t in taints):
            meta = n.get("metadata") or {}
            out[str(meta.get("name"))] = str((meta.get("annotations") or {}).get(SERVICE_TAINT, ""))
    return out


def run_cycle(
    *,
    inventory: Path,
    limit: str | None,
    options: HealOptions,
    allow_reboot: bool,
    fleet_factory: Callable[..., HealFleet],
    certifier_factory: CertifierFactory,
    progress: ProgressFn,
) -> CycleResult:
    """One pass: read, plan, act. InputError before any host is touched for a bad inventory."""
    from provisioner.inventory import load_inventory
    from provisioner.rollout.plan import check_limit_names, first_control_plane

    inv = load_inventory(inventory)
    inv_key = str(Path(inventory).resolve())
    check_limit_names(limit, inv.host_names(), inv.group_names)
    control = first_control_plane(inv, inventory, "remediate drains nodes")
    hosts = [h for h in inv.select(limit) if "gpu_nodes" in h.groups]
    if not hosts:
        raise InputError(
            f"{inventory}: no GPU host (group gpu_nodes) selected" + (f" by --limit {limit}" if limit else "")
        )
    options.allow_reboot = allow_reboot
    names = [h.name for h in hosts]
    with inventory_lock(inv_key):
        fleet = fleet_factory(hosts=hosts, control_plane=control)
        # The GPU resets of earlier runs and --watch cycles: their Xids stay in the boot's kernel log,
        # answered (the fleet uses a mark only while its host is in the boot it was made in).
        for host, marks in earlier_resets(inv_key).items():
            options.resets.setdefault(host, marks)
        fleet.reset_at = options.resets
        try:
            return _cycle(
                fleet,
                inv_key,
                hosts,
                names,
                limit,
                options,
                certifier_factory(hosts, inventory, fleet),
                progress,
            )
        finally:
            fleet.close()


def _cycle(
    fleet: HealFleet,
    inv_key: str,
    hosts: list[Any],
    names: list[str],
    limit: str | None,
    options: HealOptions,
    certifier: Certifier,
    progress: ProgressFn,
) -> CycleResult:
    progress(None, f"remediate: reading {len(names)} GPU host(s)")
    probes = fleet.probe(names)
    try:
        tainted = tainted_nodes(fleet)
    except StepFailed as exc:
        raise InputError(f"cannot read the cluster's nodes: {exc.reason}") from exc
    options.out_before = len(tainted)
    if options.budget:
        options.budget_used = drained_since(inv_key, time.time() - options.budget.period_s)
    earlier = {n: f for n, f in taken_over(inv_key).items() if n in names}
    rows: dict[str, HostRow] = {}
    plan = Plan(target=Target("evidence"))
    todo: list[str] = []
    for name in names:
        probe = probes.get(name)
        if not isinstance(probe, HealProbe) or probe.plan is None or probe.error:
            why = probe.error if probe is not None else "no probe result"
            hp = HostPlan(name, UNKNOWN, None, [f"host not read: {why}"], [], error=why)
            rows[name] = HostRow(hp, "unreadable", str(why))
            plan.hosts[name] = WavePlan(name, SKIP, UNKNOWN, f"not read: {why}", kube=True)
            continue
        hp = probe.plan
        node = probe.node
        if node in tainted and name not in earlier:
            note = tainted[node] or "no reason annotated"
            rows[name] = HostRow(hp, "held", f"left for service earlier ({short_safe_text(note, 300)}); "
                                 f"take the {SERVICE_TAINT} taint off once repaired", node)  # fmt: skip
            plan.hosts[name] = WavePlan(name, SKIP, hp.action, "left for service earlier", kube=True)
            continue
        if hp.action == NONE and name not in earlier:
            rows[name] = HostRow(hp, "none", "", node)
            plan.hosts[name] = WavePlan(name, SKIP, NONE, "nothing to do", kube=True)
            continue
        if hp.action == REBOOT and not options.allow_reboot:
            rows[name] = HostRow(
                hp, "held", "needs a reboot: run again with --allow-reboot (not drained)", node
            )
            plan.hosts[name] = WavePlan(name, SKIP, hp.action, "reboot not allowed", kube=True)
            continue
        rows[name] = HostRow(hp, "not-started", "", node)
        plan.hosts[name] = WavePlan(name, CHANGE, hp.action, kube=True)
        todo.append(name)
    capacity = max(1, options.max_concurrent - options.out_before)
    plan.fill_waves(todo, BatchSize(capacity), 0)
    if not todo:
        ordered = [rows[n] for n in names]
        return CycleResult(ordered, _exit(ordered))
    for name in todo:
        progress(name, f"{rows[name].plan.action}: {'; '.join(rows[name].plan.reasons)[:300]}")
    state = begin_new_run(
        records.new_record(REMEDIATE.verb), REMEDIATE, inventory=inv_key, limit=limit,
        options=options.to_dict(), plan=plan, hosts=todo, skipped={}, progress=progress,
    )  # fmt: skip
    for name, fields in earlier.items():
        if name in state.hosts:
            state.update(name, **fields)
    rollout = HealRollout(fleet, state, plan, options, progress, certifier=certifier)
    rollout.plans.update({n: rows[n].plan for n in todo})
    outcome = execute(rollout, resumed=False)
    for name in todo:
        rows[name] = _row_after(rows[name], state, name)
    ordered = [rows[n] for n in names]
    result = CycleResult(ordered, _exit(ordered), str(state.path.parent), outcome.reason)
    if outcome.status == "interrupted":
        result.exit_code = EXIT_INTERRUPTED
    records.write_json(state.path.parent / "summary.json", to_doc(result))
    records.write_json(state.path.parent / RESETS_FILE, {h: [b, m] for h, (b, m) in options.resets.items()})
    return result


def _row_after(row: HostRow, state: RolloutState, name: str) -> HostRow:
    s = state.hosts[name]
    if s.result == CHANGED:
        outcome = "repaired"
    elif s.result == FAILED and s.after == "service":
        outcome = "needs-service"
    elif s.result == SKIPPED:
        outcome = "none"
    elif s.result == NOT_STARTED:
        outcome = "not-started"
    else:
        outcome = str(s.result or "failed")
    return HostRow(row.plan, outcome, s.reason, s.node or row.node)


def _exit(rows: list[HostRow]) -> int:
    return EXIT_OK if all(r.outcome in ("none", "repaired") for r in rows) else EXIT_FAILED


def to_doc(result: CycleResult) -> dict[str, Any]:
    return {
        "hosts": [r.to_json() for r in result.rows],
        "record": result.record,
        "stop_reason": result.stop_reason,
    }


def to_json(result: CycleResult) -> str:
    return json.dumps(to_doc(result), indent=2, ensure_ascii=True) + "\n"


def to_table(result: CycleResult) -> str:
    hosts = [short_safe_text(r.plan.host, 60) for r in result.rows]
    width = max([len("HOST"), *map(len, hosts)])
    lines = [f"{'HOST':<{width}}  {'ACTION':<9}  {'OUTCOME':<13}  DETAIL"]
    for name, r in zip(hosts, result.rows, strict=True):
        lines.append(
            f"{name:<{width}}  {r.plan.action:<9}  {r.outcome:<13}  {short_safe_text(r.detail, 300)}"
        )
    if result.stop_reason:
        lines.append(f"stopped: {short_safe_text(result.stop_reason, 300)}")
    if result.record:
        lines.append(f"record: {result.record}")
    return "\n".join(lines) + "\n"


def node_certifier(hosts: list[Any], inventory: Path, fleet: HealFleet) -> Certifier:
    """Certification by `gpuprov certify` at the asked level (provisioner.health.certify_run), whose
    result also sets or removes the node's `gpuprov.io/certified` label and annotation. The Xids a GPU
    reset of this run answered do not count against the host (as for the repair's own judgement)."""
    kube = fleet.kube
    from provisioner.health.certify_run import certify_target, mark_certified
    from provisioner.verification import ssh_targets

    targets = {t.name: t for t in ssh_targets(hosts, inventory=inventory)}

    def certify(host: str, level: str, node: str) -> tuple[bool, list[str]]:
        result = certify_target(targets[host], level, reset_at=fleet.reset_marks(host))
        reasons = list(result.reasons)
        if kube is not None:
            try:
                reasons.append(mark_certified(kube, node, result))
            except StepFailed as exc:
                return False, [*reasons, f"certification not recorded on node {node}: {exc.reason}"]
        return result.certified, reasons

    return certify


def run_remediate_act(
    *,
    inventory: Path,
    limit: str | None,
    options: HealOptions,
    allow_reboot: bool,
    watch: bool = False,
    interval: float = 60.0,
    progress: ProgressFn | None = None,
    show: Callable[[CycleResult], None] | None = None,
    fleet_factory: Callable[..., HealFleet] = HealFleet,
    certifier_factory: CertifierFactory = node_certifier,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """One cycle, or with `watch` one every `interval` seconds until Ctrl-C; the last cycle's exit code
    (3 when a cycle was interrupted half-way)."""
    progress = progress or (lambda host, text: None)
    show = show or (lambda result: None)
    code = EXIT_OK
    while True:
        result = run_cycle(
            inventory=inventory, limit=limit, options=options, allow_reboot=allow_reboot,
            fleet_factory=fleet_factory, certifier_factory=certifier_factory, progress=progress,
        )  # fmt: skip
        show(result)
        code = result.exit_code
        if not watch or code == EXIT_INTERRUPTED:
            return code
        if result.stop_reason:
            progress(None, f"watch: {result.stop_reason}; waiting for the next cycle")
        try:
            sleep(interval)
        except KeyboardInterrupt:
            progress(None, "watch: interrupted between cycles; nothing in progress")
            return code
