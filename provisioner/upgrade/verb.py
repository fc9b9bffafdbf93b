"""`run_upgrade`: the verb, one straight walk. The flags are checked first (exit 2, nothing touched), then
the inventory; a new run probes and plans, a resumed one reads its plan back; the rollout runs it and the
result goes back to the CLI, which alone prints."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.content import role_default
from provisioner.errors import EXIT_FAILED, EXIT_OK, InputError
from provisioner.rollout.engine import begin_new_run, execute, exit_code, start_or_resume, summary
from provisioner.rollout.model import DEFAULT_DRAIN_TIMEOUT, ProgressFn
from provisioner.rollout.plan import (
    BatchSize,
    Plan,
    check_count,
    check_limit_names,
    first_control_plane,
    parse_batch,
)
from provisioner.rollout.state import CHANGED, HostState, RolloutState, inventory_lock, resumable
from provisioner.upgrade.plan import DriverTarget, build_plan, needs, parse_target
from provisioner.upgrade.rollout import DRIVER, DriverFleet, DriverRollout, Options


@dataclass(frozen=True)
class _Flags:
    """The command line, checked; None where a flag was not given (a resumed run keeps its own)."""

    target: DriverTarget | None
    batch: BatchSize | None
    canary: int | None
    max_fail: int | None
    pause: bool | None
    drain: bool | None
    reboot_allowed: bool | None
    drain_timeout: float | None

    def options(self) -> Options:
        """A new run's options: the flags, defaults for the rest."""
        assert self.target is not None
        return Options(
            target=self.target,
            batch=self.batch or BatchSize(1),
            canary=self.canary or 0,
            max_fail=self.max_fail or 0,
            pause=bool(self.pause),
            drain=self.drain is not False,
            reboot_allowed=bool(self.reboot_allowed),
            drain_timeout=self.drain_timeout or DEFAULT_DRAIN_TIMEOUT,
        )

    def resumed(self, recorded: Mapping[str, Any]) -> Options:
        """The recorded options; plan-shaping ones may be repeated but not changed, the rest may change."""
        for key, flag, value in (
            ("to", "--to", self.target),
            ("batch", "--batch", self.batch),
            ("canary", "--canary", self.canary),
        ):
            if value is not None and str(value) != str(recorded.get(key)):
                raise InputError(
                    f"--resume continues the recorded plan ({flag} {recorded.get(key)}); "
                    f"{flag} {value} differs"
                )
        changed = {
            key: value
            for key in ("max_fail", "pause", "drain", "reboot_allowed", "drain_timeout")
            if (value := getattr(self, key)) is not None
        }
        return dataclasses.replace(Options.from_dict(recorded), **changed)


_FULL_VERSION = re.compile(r"\d{3}\.\d+\.\d+")


def resolve_install_version(target: DriverTarget, hosts: Sequence[Any]) -> str:
    """The exact driver version to install for `target`.

    The nvidia_driver role installs exact, pinned versions. A full version is used as given; a branch
    (or 580.159) resolves to the pinned version it matches: the hosts' nvidia_driver_version from the
    inventory, else the role's default. Anything else is bad input, before any host is touched.
    """
    if _FULL_VERSION.fullmatch(target.text):
        return target.text
    pins: set[str] = set()
    for h in hosts:
        value = (getattr(h, "vars", None) or {}).get("nvidia_driver_version")
        if value is not None and "{{" not in str(value):
            pins.add(str(value))
    default = role_default("nvidia_driver", "nvidia_driver_version")
    if default is not None and "{{" not in str(default):
        pins.add(str(default))
    matching = sorted(v for v in pins if target.matches(v) and _FULL_VERSION.fullmatch(v))
    if len(matching) == 1:
        return matching[0]
    if len(matching) > 1:
        raise InputError(
            f"--to {target}: the inventory pins several versions of it ({', '.join(matching)}); "
            "give the exact version"
        )
    known = ", ".join(sorted(pins)) or "none"
    raise InputError(
        f"--to {target}: no pinned {target}.x version to install (inventory nvidia_driver_version or the "
        f"nvidia_driver role default; pinned: {known}); give the exact version, like {target.branch}.159.04"
    )


def make_fleet(
    inventory: Any,
    hosts: list[Any],
    control_plane: Any | None,
    options: Options,
    record: Path | None,
    inventory_path: Path,
    progress: ProgressFn,
) -> DriverFleet:
    """The real fleet (SSH + ansible-runner); imported here so that planning stays light."""
    from provisioner.upgrade.adapters import RealFleet

    return RealFleet(
        hosts=hosts,
        control_plane=control_plane,
        inventory_path=inventory_path,
        record=record,
        install_version=options.install_version,
        progress=progress,
    )


@dataclass
class UpgradeResult:
    """What an upgrade-driver invocation did: a summary (a run), or a plan (a dry run)."""

    exit_code: int
    summary: dict[str, Any] | None = None
    plan: Plan | None = None
    options: Options | None = None
    plan_doc: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


def run_upgrade(
    *,
    inventory: Path | None,
    to: str | None,
    batch: str | None = None,
    canary: int | None = None,
    max_fail: int | None = None,
    pause: bool | None = None,
    drain: bool | None = None,
    reboot_allowed: bool | None = None,
    resume: bool = False,
    dry_run: bool = False,
    limit: str | None = None,
    drain_timeout: float | None = None,
    fleet_factory: Callable[..., DriverFleet] = make_fleet,
    stdin_isatty: Callable[[], bool] | None = None,
    progress: ProgressFn | None = None,
    confirm: Callable[[str], bool] | None = None,
) -> UpgradeResult:
    """The verb. Input is checked first (exit 2, nothing touched); what happened comes back as an
    UpgradeResult. `progress` gets a line per host and step as they happen; `confirm` answers --pause's
    question before each batch (both from the CLI)."""
    from provisioner.config import validate_inventory_settings
    from provisioner.inventory import load_inventory

    if inventory is None:
        raise InputError("-i/--inventory is required (try: gpuprov lab inventory)")
    if resume and dry_run:
        raise InputError("--resume and --dry-run together: a resumed run continues its recorded plan")
    if resume and limit:
        raise InputError("--resume continues the recorded plan's hosts; leave out --limit")
    flags = _Flags(
        target=parse_target(to) if to is not None else None,
        batch=parse_batch(batch) if batch is not None else None,
        canary=check_count("--canary", canary) if canary is not None else None,
        max_fail=check_count("--max-fail", max_fail) if max_fail is not None else None,
        pause=pause,
        drain=drain,
        reboot_allowed=reboot_allowed,
        drain_timeout=drain_timeout,
    )
    if drain_timeout is not None and not (0 < drain_timeout < math.inf):
        raise InputError(f"--drain-timeout {drain_timeout:g}: must be a number of seconds more than 0")
    if not resume and flags.target is None:
        parse_target(None)  # raises: --to is required
    isatty = stdin_isatty or sys.stdin.isatty

    inv = load_inventory(inventory)
    inv_key = str(Path(inventory).resolve())
    check_limit_names(limit, inv.host_names(), inv.group_names)
    progress = progress or (lambda host, text: None)

    with inventory_lock(inv_key):
        state: RolloutState | None = None
        plan: Plan | None = None
        if resume:
            record = resumable(inv_key, DRIVER)
            state = RolloutState.load(record, DRIVER)
            options = flags.resumed(state.doc["options"])
            plan = Plan.from_dict(state.doc["plan"])
            known = set(inv.host_names())
            missing = [h for h in state.hosts if h not in known]
            if missing:
                raise InputError(
                    f"--resume: host(s) {', '.join(missing)} of {record} are no longer in {inventory}"
                )
            selected = [h for h in inv.select(None) if h.name in state.hosts]
        else:
            options = flags.options()
            selected = [h for h in inv.select(limit) if "gpu_nodes" in h.groups]
            if not selected:
                by = f" by --limit {limit}" if limit else ""
                raise InputError(f"{inventory}: no host of group gpu_nodes selected{by}")
        if not options.install_version:
            options.install_version = resolve_install_version(options.target, selected)
        if options.pause and not dry_run and not isatty():
            raise InputError("--pause asks before each batch: standard input must be a terminal")
        validate_inventory_settings(inv, selected)
        control = first_control_plane(inv, inventory)

        record_dir = None if dry_run else (state.path.parent if state else records.new_record(DRIVER.verb))
        fleet = fleet_factory(inv, selected, control, options, record_dir, Path(inventory), progress)
        try:
            if state is None or plan is None:
                names = [h.name for h in selected]
                progress(None, f"upgrade-driver: probing {len(names)} GPU host(s)")
                probes = fleet.probe(names)
                plan = build_plan(
                    names, probes, options.target, options.batch, options.canary, kube=fleet.kube is not None
                )
                if dry_run:
                    return dry_run_result(plan, options)
                assert record_dir is not None
                skipped = {
                    name: {
                        "before": probes[name].loaded,
                        "after": probes[name].loaded,
                        "baseline": probes[name].to_dict(),
                        "node": probes[name].node,
                    }
                    for name in plan.skipped
                }
                state = begin_new_run(
                    record_dir, DRIVER, inventory=inv_key, limit=limit, options=options.to_dict(), plan=plan,
                    hosts=names, skipped=skipped, progress=progress,
                )  # fmt: skip
            else:
                progress(None, f"upgrade-driver: resuming {state.path.parent}")
                start_or_resume(state, plan, None, progress)
            rollout = DriverRollout(fleet, state, plan, options, progress, confirm=confirm or _refuse_pause)
            outcome = execute(rollout, resumed=resume)
        finally:
            fleet.close()

    target = options.target.text

    def said(s: HostState) -> dict[str, Any]:
        # The state's CHANGED is written "upgraded", the word this verb shows.
        return {"result": s.result, "to": s.after or target, "cordoned": s.cordoned_by_us}

    result = summary(state, outcome, target, said)
    result["notes"] = pin_notes(selected, state, options.install_version)
    for note in result["notes"]:
        progress(None, f"note: {note}")
    records.write_json(state.path.parent / "summary.json", result)
    return UpgradeResult(exit_code(state, outcome), summary=result)


def _refuse_pause(question: str) -> bool:
    return False


def dry_run_result(plan: Plan, options: Options) -> UpgradeResult:
    """The plan of a dry run. A plan for hosts nobody could look at is a guess: it says so and fails."""
    doc = plan.to_dict()
    doc["dry_run"] = True
    doc["options"] = options.to_dict()
    doc["waves"] = plan.waves
    for name, p in plan.hosts.items():
        doc["hosts"][name]["needs"] = needs(p, options.drain, options.reboot_allowed)
    unprobed = sorted(name for name, p in plan.hosts.items() if p.probe_error)
    warnings = []
    if unprobed:
        warnings.append(
            f"upgrade-driver: {len(unprobed)} of {len(plan.hosts)} host(s) could not be probed "
            f"({', '.join(unprobed[:10])}{', ...' if len(unprobed) > 10 else ''}): the plan is incomplete"
        )
    return UpgradeResult(
        EXIT_FAILED if unprobed else EXIT_OK, plan=plan, options=options, plan_doc=doc, warnings=warnings
    )


# ----------------------------------------------------------------------------------------- output


def pin_notes(hosts: Sequence[Any], state: RolloutState, installed: str) -> list[str]:
    """Upgraded hosts whose inventory (or the role's default) pins another version: the next bootstrap
    would move them back, so say so."""
    default = role_default("nvidia_driver", "nvidia_driver_version")
    by_pin: dict[str, list[str]] = {}
    for h in hosts:
        s = state.hosts.get(h.name)
        if s is None or s.result != CHANGED:
            continue
        pin = (getattr(h, "vars", None) or {}).get("nvidia_driver_version", default)
        if pin is not None and "{{" not in str(pin) and str(pin) != installed:
            by_pin.setdefault(str(pin), []).append(h.name)
    return [
        f"nvidia_driver_version is {pin} for {', '.join(names)} (inventory or role default): set it to "
        f"{installed}, or the next gpuprov bootstrap installs {pin} again"
        for pin, names in sorted(by_pin.items())
    ]
