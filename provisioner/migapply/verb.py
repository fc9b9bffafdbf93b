"""The `gpuprov mig apply` verb: read and check everything first (exit 2, nothing touched), then roll.

Checked before any node is cordoned:
- the inventory: each selected GPU host's `gpuprov_mig_config` (a layout name, as the node label holds
  it) and the cluster-wide `gpuprov_mig_strategy` (single or mixed);
- the cluster: the ClusterPolicy's mig.strategy is the declared one, its MIG manager is on, and the
  layouts exist in the manager's config map, which parses as mig-parted's `version: v1` format, and passes
  the real `nvidia-mig-parted assert --valid-config` where that tool is installed on the controller;
- each host: its GPUs (by PCI device id) have every profile the layout asks for, as often as asked, within
  the GPU's slices and on a driver branch with MIG; under the single strategy, one profile per node.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.content import role_default
from provisioner.errors import EXIT_OK, InputError
from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.hosttext import last_line, short_safe_text
from provisioner.mig import check_layout, parse_config, single_strategy_problem, wanted_devices
from provisioner.migapply.fleet import CONFIG_LABEL, STATE_LABEL, MigFleet, MigProbe
from provisioner.migapply.rollout import (
    DEFAULT_ADVERTISE_TIMEOUT,
    DEFAULT_STATE_TIMEOUT,
    MIG,
    MigOptions,
    MigRollout,
    devices_problem,
)
from provisioner.rollout.engine import begin_new_run, execute, exit_code, start_or_resume, summary
from provisioner.rollout.model import ProgressFn, StepFailed
from provisioner.rollout.plan import (
    CHANGE,
    SKIP,
    HostPlan,
    Plan,
    Target,
    check_count,
    check_limit_names,
    first_control_plane,
    parse_batch,
)
from provisioner.rollout.state import CHANGED, FINAL_OK, HostState, RolloutState, inventory_lock, resumable

MIG_PARTED_ENV = "GPUPROV_MIG_PARTED"


@dataclass
class MigResult:
    exit_code: int
    summary: dict[str, Any] | None = None
    plan_text: str = ""
    plan_doc: dict[str, Any] | None = None  # a dry run's plan, for --format json
    notes: list[str] = field(default_factory=list)


def mig_parted() -> str | None:
    """NVIDIA's nvidia-mig-parted on the controller (GPUPROV_MIG_PARTED, else PATH), if any."""
    named = os.environ.get(MIG_PARTED_ENV)
    if named:
        if not os.access(named, os.X_OK):
            raise InputError(f"{MIG_PARTED_ENV}={named}: not an executable nvidia-mig-parted")
        return named
    return shutil.which("nvidia-mig-parted")


def assert_valid_config(tool: str, text: str, layouts: set[str], where: str) -> None:
    """`nvidia-mig-parted assert --valid-config` for each layout: mig-parted's own parser says yes."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-mig-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(text)
        for layout in sorted(layouts):
            res = subprocess.run(
                [tool, "assert", "--valid-config", "-f", str(path), "-c", layout],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if res.returncode != 0:
                said = last_line(res.stderr + res.stdout) or f"exit {res.returncode}"
                raise InputError(f"{where}: nvidia-mig-parted refuses {layout}: {said}")


def _declared(hosts: list[Any], inventory: Path) -> tuple[dict[str, str], str]:
    """Each host's layout and the cluster's strategy. Their form was checked with every other setting
    (provisioner.config); what is left is that the strategy, one setting of the cluster, is one."""
    layouts: dict[str, str] = {}
    strategies: dict[str, list[str]] = {}
    for h in hosts:
        value = h.vars.get("gpuprov_mig_config")
        if value is None:
            continue
        layouts[h.name] = str(value)
        strategies.setdefault(str(h.vars.get("gpuprov_mig_strategy", "single")), []).append(h.name)
    if len(strategies) > 1:
        shown = "; ".join(f"{s} for {', '.join(n[:5])}" for s, n in sorted(strategies.items()))
        raise InputError(
            f"{inventory}: gpuprov_mig_strategy is one setting for the whole cluster (the ClusterPolicy's "
            f"mig.strategy), but the hosts disagree: {shown}"
        )
    return layouts, next(iter(strategies), "single")


def run_mig_apply(
    *,
    inventory: Path | None,
    limit: str | None = None,
    batch: str | None = None,
    canary: int | None = None,
    max_fail: int | None = None,
    resume: bool = False,
    dry_run: bool = False,
    state_timeout: float | None = None,
    advertise_timeout: float | None = None,
    progress: ProgressFn | None = None,
    confirm: Callable[[str], bool] | None = None,
    fleet_factory: Callable[..., MigFleet] = MigFleet,
) -> MigResult:
    from provisioner.config import validate_inventory_settings
    from provisioner.inventory import load_inventory

    if inventory is None:
        raise InputError("-i/--inventory is required (try: gpuprov lab inventory)")
    if resume and (dry_run or limit):
        raise InputError("--resume continues the recorded run: leave out --dry-run and --limit")
    for flag, seconds in (("--timeout", state_timeout), ("--advertise-timeout", advertise_timeout)):
        if seconds is not None and not (0 < seconds < math.inf):
            raise InputError(f"{flag} {seconds:g}: must be a number of seconds more than 0")
    batch_size = parse_batch(batch)
    canary_n = check_count("--canary", canary) if canary is not None else 0
    max_fail_n = check_count("--max-fail", max_fail) if max_fail is not None else 0
    progress = progress or (lambda host, text: None)

    inv = load_inventory(inventory)
    inv_key = str(Path(inventory).resolve())
    check_limit_names(limit, inv.host_names(), inv.group_names)
    control = first_control_plane(inv, inventory, "mig apply drives the GPU Operator's MIG manager")
    namespace = str(
        control.vars.get("gpu_operator_namespace") or role_default("gpu_operator", "gpu_operator_namespace")
    )

    with inventory_lock(inv_key):
        state: RolloutState | None = None
        if resume:
            record = resumable(inv_key, MIG)
            state = RolloutState.load(record, MIG)
            selected = [h for h in inv.select(None) if h.name in state.hosts]
            missing = sorted(set(state.hosts) - {h.name for h in selected})
            if missing:
                raise InputError(
                    f"--resume: host(s) {', '.join(missing)} of {record} are no longer in {inventory}"
                )
        else:
            selected = [h for h in inv.select(limit) if "gpu_nodes" in h.groups]
        validate_inventory_settings(inv, selected)
        layouts, strategy = _declared(selected, Path(inventory))
        if not layouts:
            by = f" among the hosts --limit {limit} selects" if limit else ""
            raise InputError(f"{inventory}: no GPU host declares gpuprov_mig_config{by}")
        selected = [h for h in selected if h.name in layouts]
        fleet = fleet_factory(hosts=selected, control_plane=control, namespace=namespace)
        try:
            options = MigOptions(
                batch=batch_size,
                strategy=strategy,
                layouts=layouts,
                canary=canary_n,
                max_fail=max_fail_n,
                state_timeout=state_timeout or DEFAULT_STATE_TIMEOUT,
                advertise_timeout=advertise_timeout or DEFAULT_ADVERTISE_TIMEOUT,
            )
            names = [h.name for h in selected]
            progress(None, f"mig apply: reading the cluster's MIG manager settings and {len(names)} host(s)")
            probes = {n: p for n, p in fleet.probe(names).items() if isinstance(p, MigProbe)}
            notes = _check(fleet, options, probes, names, inventory)
            plan = _plan(fleet, options, probes, names)
            if dry_run:
                doc = {"dry_run": True, **plan.to_dict(), "waves": plan.waves, "options": options.to_dict()}
                doc["notes"] = notes
                return MigResult(
                    EXIT_OK, plan_text=_render_plan(plan, options, probes), plan_doc=doc, notes=notes
                )
            for note in notes:
                progress(None, f"note: {note}")
            if state is None:
                skipped = {
                    name: {"before": layouts[name], "after": layouts[name], "node": probes[name].node}
                    for name in plan.skipped
                }
                state = begin_new_run(
                    records.new_record(MIG.verb), MIG, inventory=inv_key, limit=limit,
                    options=options.to_dict(), plan=plan, hosts=names, skipped=skipped, progress=progress,
                )  # fmt: skip
            else:
                progress(None, f"mig apply: resuming {state.path.parent}")
                start_or_resume(state, plan, None, progress)
            rollout = MigRollout(fleet, state, plan, options, progress, confirm=confirm)
            outcome = execute(rollout, resumed=resume)
        finally:
            fleet.close()
    result = summary(state, outcome, "declared layouts", _said)
    result["notes"] = notes
    records.write_json(state.path.parent / "summary.json", result)
    return MigResult(exit_code(state, outcome), summary=result, notes=notes)


def _check(
    fleet: MigFleet, options: MigOptions, probes: dict[str, MigProbe], names: list[str], inventory: Path
) -> list[str]:
    """Everything that must hold before a node is touched; InputError listing every problem."""
    try:
        cluster = fleet.cluster_mig()
    except StepFailed as exc:
        raise InputError(f"cannot read the GPU Operator's MIG settings: {exc.reason}") from exc
    where = f"configmap {fleet.namespace}/{cluster.config_map}"
    if not cluster.manager_enabled:
        raise InputError("the ClusterPolicy has migManager.enabled=false: nothing would apply a layout")
    if cluster.strategy != options.strategy:
        raise InputError(
            f"the ClusterPolicy has mig.strategy {short_safe_text(cluster.strategy)}, the inventory "
            f"declares {options.strategy} (gpuprov_mig_strategy): run "
            "`gpuprov bootstrap --only gpu_operator` to set it first"
        )
    configs = parse_config(cluster.config_text, where)
    notes: list[str] = []
    tool = mig_parted()
    if tool:
        assert_valid_config(tool, cluster.config_text, set(options.layouts.values()), where)
        notes.append(
            f"layouts checked by {Path(tool).name} assert --valid-config and the GPUs' profile tables"
        )
    else:
        notes.append(
            "nvidia-mig-parted is not installed on this controller: layouts checked by gpuprov's parser "
            "and the GPUs' profile tables only"
        )
    options.configs = configs
    options.host_services = cluster.host_services
    problems: list[str] = []
    for name in names:
        probe = probes.get(name)
        layout = options.layouts[name]
        if probe is None or probe.error:
            problems.append(
                f"{name}: cannot check {layout} against its GPUs: {probe.error if probe else 'no probe'}"
            )
            continue
        if not probe.gpus:
            problems.append(f"{name}: nvidia-smi lists no GPU")
            continue
        branch = None
        if probe.loaded:
            try:
                branch = parse_int(probe.loaded.split(".")[0], lo=1, hi=9999, what="driver branch")
            except HostNumberError:
                problems.append(
                    f"{name}: cannot check {layout}: driver version {short_safe_text(probe.loaded, 40)!r} "
                    "is not a version"
                )
                continue
        for device_id in sorted({g.device_id for g in probe.gpus}):
            count = sum(1 for g in probe.gpus if g.device_id == device_id)
            for why in check_layout(
                configs, layout, device_id=device_id, gpu_count=count, driver_branch=branch
            ):
                problems.append(f"{name}: {why}")
        if options.strategy == "single" and layout in configs:
            why = single_strategy_problem(wanted_devices(configs[layout], probe.device_ids))
            if why:
                problems.append(f"{name}: {layout} {why} (gpuprov_mig_strategy is single)")
    if problems:
        raise InputError("MIG layouts refused, nothing changed:\n  " + "\n  ".join(problems))
    return notes


def _plan(fleet: MigFleet, options: MigOptions, probes: dict[str, MigProbe], names: list[str]) -> Plan:
    """Hosts whose node already runs the layout (label, manager's success, devices) are skipped."""
    # The layouts are per host (options.layouts); the plan's target only names the run in its record.
    plan = Plan(target=Target("declared-mig-layouts"))
    todo: list[str] = []
    for name in names:
        probe = probes[name]
        layout = options.layouts[name]
        labels: dict[str, str] = {}
        if probe.node:
            try:
                labels = fleet.labels(probe.node)
            except StepFailed:
                labels = {}
        current = labels.get(CONFIG_LABEL) or "unset"
        wanted = wanted_devices(options.configs[layout], probe.device_ids)
        if (
            current == layout
            and labels.get(STATE_LABEL) == "success"
            and devices_problem(probe, wanted) is None
        ):
            plan.hosts[name] = HostPlan(name, SKIP, current, f"{layout} already applied", kube=True)
            continue
        plan.hosts[name] = HostPlan(name, CHANGE, current, kube=True)
        todo.append(name)
    plan.fill_waves(todo, options.batch, options.canary)
    return plan


def _render_plan(plan: Plan, options: MigOptions, probes: dict[str, MigProbe]) -> str:
    lines = [f"mig apply plan (strategy {options.strategy})"]
    for label, wave in plan.named_waves():
        lines.append(f"{label} ({len(wave)} host{'s' if len(wave) != 1 else ''}, in parallel):")
        for name in wave:
            p = plan.hosts[name]
            gpus = len(probes[name].gpus)
            lines.append(f"  {name:<20} {p.current} → {options.layouts[name]}  ({gpus} GPU(s))")
            lines.append(f"  {'':<20} cordon, evict GPU pods, label, MIG manager, verify, uncordon")
    for name in plan.skipped:
        lines.append(f"skip   {name:<20} {plan.hosts[name].reason}")
    if not plan.waves:
        lines.append("nothing to change: every selected host already has its layout")
    return "\n".join(lines) + "\n"


def _said(s: HostState) -> dict[str, Any]:
    """A host's row of the summary: its result in this verb's word, its layout, and whether its node is
    left cordoned."""
    return {
        "result": "applied" if s.result == CHANGED else s.result,
        "to": s.after,
        "cordoned": s.cordoned_by_us or (s.result not in FINAL_OK and bool(s.node)),
    }
