"""The `gpuprov` command line: parse → call the library → render.

This is the only module that maps errors to exit codes. Heavy modules (Ansible, paramiko)
are imported inside the verbs so that `gpuprov --help` stays instant.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

import typer

from provisioner.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, GpuprovError
from provisioner.hosttext import safe_text

if TYPE_CHECKING:
    from provisioner.playbookverb.run import StageRequest, VerbResult

app = typer.Typer(
    name="gpuprov",
    help="Provision, verify and upgrade NVIDIA GPU servers (driver → CUDA → Docker → container toolkit → "
    "Kubernetes → GPU Operator).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

# Other distributions add verb groups here (the lab adds `gpuprov lab`); the product imports none of them.
PLUGIN_GROUP = "gpuprov.cli"


def _version(value: bool) -> None:
    if value:
        from provisioner import __version__

        typer.echo(f"gpuprov {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Provision, verify and upgrade NVIDIA GPU servers."""


def _add_plugins() -> None:
    """Add the verb groups that installed distributions declare under PLUGIN_GROUP."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken add-on must not take the product's own verbs down
            sys.stderr.write(f"gpuprov: warning: cannot load the '{ep.name}' verbs: {exc}\n")
            continue
        app.add_typer(plugin, name=ep.name)


# Each verb's choices of --format (and certify's --level).
OutputFormat = StrEnum("OutputFormat", ["table", "json"])
ReportFormat = StrEnum("ReportFormat", ["table", "json", "junit", "prometheus"])
CertifyFormat = StrEnum("CertifyFormat", ["table", "json", "junit"])
TopFormat = StrEnum("TopFormat", ["table", "json", "prometheus"])
CertifyLevel = StrEnum("CertifyLevel", ["basic", "quick", "standard", "extended"])
FailOn = StrEnum("FailOn", ["warn", "fail"])


InventoryOpt = Annotated[
    Path | None, typer.Option("-i", "--inventory", help="Ansible inventory (YAML or INI file, or directory).")
]
LimitOpt = Annotated[str | None, typer.Option("--limit", "-l", help="Host pattern, as ansible --limit.")]
FormatOpt = Annotated[OutputFormat, typer.Option("--format")]


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


# The options of the verbs that run playbooks.
CheckOpt = Annotated[bool, typer.Option("--check", help="Dry run: report what would change.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ForksOpt = Annotated[int, typer.Option(min=1, max=500, help="Hosts worked on in parallel.")]


def _run_playbook_verb(
    verb: Callable[..., VerbResult],
    *,
    check: bool,
    yes: bool,
    forks: int,
    output_format: OutputFormat,
    shown: set[str] | None = None,
) -> int:
    """Run a playbook verb (`verb`, given its `controls`) with its live progress (of the plays `shown`;
    None: all), then show its result."""
    from provisioner.playbookverb.render import make_progress, show
    from provisioner.playbookverb.run import RunControls

    progress = make_progress(output_format.value, shown=shown)
    confirm = _confirm if sys.stdin.isatty() else None
    with progress:
        controls = RunControls(check, yes, forks, on_event=progress, notify=progress.note, confirm=confirm)
        result = verb(controls=controls)
    return show(result, output_format.value)


def _run_stage_verb(
    run: Callable[..., VerbResult],
    progress_filter: Callable[[list[str], list[str]], set[str] | None],
    request: StageRequest,
    *,
    check: bool,
    yes: bool,
    forks: int,
    output_format: OutputFormat,
    **options: Any,
) -> int:
    """A verb that goes stage by stage (bootstrap, reset): --only/--skip resolved, then run with the
    live progress of the stages it takes."""
    verb = partial(run, request, **options)
    shown = progress_filter(request.only, request.skip)
    return _run_playbook_verb(
        verb, check=check, yes=yes, forks=forks, output_format=output_format, shown=shown
    )


@app.command()
def bootstrap(
    inventory: InventoryOpt = None,
    only: Annotated[str | None, typer.Option(help="Comma-separated stages to run (default: all).")] = None,
    skip: Annotated[str | None, typer.Option(help="Comma-separated stages to leave out.")] = None,
    limit: LimitOpt = None,
    check: CheckOpt = False,
    yes: YesOpt = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Rerun only the hosts that failed in the last run.")
    ] = False,
    forks: ForksOpt = 20,
    output_format: FormatOpt = OutputFormat.table,
) -> int:
    """Take hosts from bare OS to GPU Operator, stage by stage, then verify them."""
    from provisioner.bootstrap.verb import progress_filter, run_bootstrap
    from provisioner.playbookverb.run import StageRequest

    return _run_stage_verb(
        run_bootstrap, progress_filter, StageRequest(inventory, _split(only), _split(skip), limit),
        check=check, yes=yes, forks=forks, output_format=output_format, retry_failed=retry_failed,
    )  # fmt: skip


@app.command()
def reset(
    inventory: InventoryOpt = None,
    only: Annotated[
        str | None, typer.Option(help="Comma-separated stages to take back (default: all).")
    ] = None,
    skip: Annotated[str | None, typer.Option(help="Comma-separated stages to leave in place.")] = None,
    limit: LimitOpt = None,
    check: Annotated[
        bool,
        typer.Option("--check", help="Dry run: list per host what would be removed or restored, with diffs."),
    ] = False,
    yes: YesOpt = False,
    remove_crds: Annotated[
        bool,
        typer.Option("--remove-crds", help="Also delete the GPU Operator's CRDs (and every object of them)."),
    ] = False,
    forks: ForksOpt = 20,
    output_format: FormatOpt = OutputFormat.table,
) -> int:
    """Take hosts back, stage by stage in reverse (GPU Operator first, driver last), to how gpuprov found
    them: what each stage installed, held, pinned and wrote, from the host's own ledger; then prove it."""
    from provisioner.playbookverb.run import StageRequest
    from provisioner.reset.verb import progress_filter, run_reset

    return _run_stage_verb(
        run_reset, progress_filter, StageRequest(inventory, _split(only), _split(skip), limit),
        check=check, yes=yes, forks=forks, output_format=output_format, remove_crds=remove_crds,
    )  # fmt: skip


@app.command()
def stages() -> int:
    """List the bootstrap stages in the order they run."""
    from provisioner.stages import STAGES

    for stage in STAGES:
        typer.echo(f"{stage.name:<26} {stage.summary}")
    return 0


LocalOpt = Annotated[bool, typer.Option("--local", help="Probe this machine directly (no SSH).")]
ParallelOpt = Annotated[int, typer.Option("--parallel", min=1, max=2000, help="Hosts probed at once.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, help="Seconds allowed per host.")]
ChecksOpt = Annotated[
    str | None, typer.Option("--checks", help="Comma-separated check ids or prefixes (gpu.*); default: all.")
]
FailOnOpt = Annotated[FailOn, typer.Option("--fail-on", help="Lowest status that makes the exit code 1.")]
SnapshotOpt = Annotated[Path | None, typer.Option("--snapshot", help="Evaluate a snapshot directory.")]


ReportFormatOpt = Annotated[ReportFormat, typer.Option("--format")]
ReportOutputOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to FILE.")]


@dataclass(frozen=True)
class ReportOptions:
    """The options `verify` and `check` share, in the order their help lists them; `--policy` is each
    verb's own (optional for `verify`, required for `check`)."""

    inventory: InventoryOpt = None
    local: LocalOpt = False
    snapshot: SnapshotOpt = None
    output_format: ReportFormatOpt = ReportFormat.table
    output: ReportOutputOpt = None
    fail_on: FailOnOpt = FailOn.warn
    limit: LimitOpt = None
    parallel: ParallelOpt = 50
    checks: ChecksOpt = None
    timeout: TimeoutOpt = 180.0


def _report_verb(*, drift: bool, policy_at: int) -> Callable[[Callable[..., None]], Callable[..., int]]:
    """Make a report verb out of a stub that declares only `policy` (and the help, as its docstring): the
    command takes the ReportOptions with `--policy` at position `policy_at` among them, and renders the
    verification report, as a drift matrix when `drift`."""

    def make(stub: Callable[..., None]) -> Callable[..., int]:
        hints = get_type_hints(ReportOptions, include_extras=True)
        shared = [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name], default=f.default
            )
            for f in fields(ReportOptions)
        ]
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(stub, eval_str=True).parameters.values()
        ]

        def command(*, policy: Path | None, **options: Any) -> int:
            return _report(ReportOptions(**options), policy=policy, drift=drift)

        command.__name__ = command.__qualname__ = stub.__name__
        command.__doc__ = stub.__doc__
        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*shared[:policy_at], *own, *shared[policy_at:]], return_annotation=int
        )
        return command

    return make


def _report(opts: ReportOptions, *, policy: Path | None, drift: bool) -> int:
    from provisioner.report import check_output_path, render, write_output
    from provisioner.verification import run_verification

    if opts.output is not None:
        check_output_path(opts.output)
    report = run_verification(
        inventory=opts.inventory,
        local=opts.local,
        snapshot=opts.snapshot,
        policy_path=policy,
        limit=opts.limit,
        parallel=opts.parallel,
        checks=_split(opts.checks) or None,
        timeout=opts.timeout,
    )
    color = opts.output is None and opts.output_format == ReportFormat.table and sys.stdout.isatty()
    text = render(report, opts.output_format.value, fail_on=opts.fail_on.value, drift=drift, color=color)
    if opts.output is not None:
        write_output(text, opts.output)
    else:
        sys.stdout.write(text)
    return report.exit_code(opts.fail_on.value)


@app.command()
@_report_verb(drift=False, policy_at=3)
def verify(
    policy: Annotated[Path | None, typer.Option("--policy", help="Policy file (YAML).")] = None,
) -> None:
    """Probe hosts; check GPUs, driver, CUDA, runtimes, services, Kubernetes (exit 1 on findings)."""


@app.command()
@_report_verb(drift=True, policy_at=0)
def check(
    policy: Annotated[Path, typer.Option("--policy", help="Policy file (YAML): the desired fleet state.")],
) -> None:
    """Check hosts against a policy and show the fleet's drift (host × check)."""


@app.command()
def snapshot(
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write (one per host inside).")],
    inventory: InventoryOpt = None,
    local: LocalOpt = False,
    limit: LimitOpt = None,
    parallel: ParallelOpt = 50,
    timeout: TimeoutOpt = 180.0,
) -> int:
    """Save every host's probe outputs (support bundle); `verify --snapshot DIR` replays them."""
    from provisioner.verification import run_snapshot

    results = run_snapshot(
        inventory=inventory, local=local, out_dir=output, limit=limit, parallel=parallel, timeout=timeout
    )
    for r in results:
        if r.error:
            why = safe_text(r.error)
            typer.echo(f"{r.host}: not collected: {why} (recorded in {r.path / 'meta.json'})", err=True)
        else:
            typer.echo(f"{r.host}: {r.probes} probes → {r.path}")
    return 1 if any(r.error for r in results) else 0


@app.command()
def remediate(
    inventory: InventoryOpt = None,
    local: LocalOpt = False,
    snapshot: SnapshotOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan only; nothing is changed.")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Repeat every --interval seconds until Ctrl-C.")
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between --watch cycles.")] = 60.0,
    max_concurrent: Annotated[
        int,
        typer.Option(
            "--max-concurrent", help="Nodes out of work at once, at most (those left for service count)."
        ),
    ] = 1,
    budget: Annotated[
        str | None,
        typer.Option("--budget", help="Hosts drained per period, at most: N/PERIOD (3/1h, 10/1d)."),
    ] = None,
    allow_reboot: Annotated[
        bool, typer.Option("--allow-reboot", help="Reboot hosts whose GPUs need it (else they are held).")
    ] = False,
    certify_level: Annotated[
        str,
        typer.Option(
            "--certify-level", help="Certification before a node goes back: basic|quick|standard|extended."
        ),
    ] = "quick",
    limit: LimitOpt = None,
    output_format: FormatOpt = OutputFormat.table,
    parallel: ParallelOpt = 50,
    timeout: TimeoutOpt = 180.0,
) -> int:
    """Decide per host and GPU what to do (none, reset-gpu, reboot, service) from Xids, the driver's
    recovery action, row remapping and ECC; without --dry-run, do it: cordon, drain, reset or reboot,
    certify, uncordon, or leave the node tainted for service (exit 1 when any host is not healthy)."""
    from provisioner.health import remediate as R
    from provisioner.health import repair

    if dry_run:
        # The acting options are checked in a dry run too: a typo must not wait for the real run.
        repair.check_options(
            inventory=Path("."), local=False, snapshot=None, certify_level=certify_level,
            max_concurrent=max_concurrent, budget=budget, watch=watch, interval=interval,
        )  # fmt: skip
        if watch:
            from provisioner.errors import InputError

            raise InputError("--watch acts in cycles: leave out --dry-run")
        plans = R.run_remediate(
            inventory=inventory, local=local, snapshot=snapshot, limit=limit, parallel=parallel,
            timeout=timeout,
        )  # fmt: skip
        sys.stdout.write(R.to_json(plans) if output_format is OutputFormat.json else R.to_table(plans))
        return R.exit_code(plans)
    from provisioner.rollout.render import Progress

    options = repair.check_options(
        inventory=inventory, local=local, snapshot=snapshot, certify_level=certify_level,
        max_concurrent=max_concurrent, budget=budget, watch=watch, interval=interval,
    )  # fmt: skip
    assert inventory is not None

    def show(result: repair.CycleResult) -> None:
        text = repair.to_json(result) if output_format is OutputFormat.json else repair.to_table(result)
        sys.stdout.write(text)
        sys.stdout.flush()

    return repair.run_remediate_act(
        inventory=inventory, limit=limit, options=options, allow_reboot=allow_reboot, watch=watch,
        interval=interval, progress=Progress(), show=show,
    )  # fmt: skip


@app.command()
def certify(
    inventory: InventoryOpt = None,
    local: LocalOpt = False,
    snapshot: SnapshotOpt = None,
    level: Annotated[
        CertifyLevel,
        typer.Option(
            "--level",
            help="basic: every verify check and the GPU model's expectations, no DCGM (hosts without it); "
            "quick: + DCGM level 1 (seconds); "
            "standard: + dcgmi diag -r 2 (about 2 min) and nvbandwidth where installed; "
            "extended: + dcgmi diag -r 3 (about 15 min).",
        ),
    ] = CertifyLevel.quick,
    limit: LimitOpt = None,
    output_format: Annotated[CertifyFormat, typer.Option("--format")] = CertifyFormat.table,
    parallel: ParallelOpt = 50,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=1, help="Seconds allowed per host (default: what the level needs)."),
    ] = None,
) -> int:
    """Is each node fit for work? Certify hosts at a level; on a cluster (-i with a control plane) label
    certified nodes gpuprov.io/certified=LEVEL and unlabel the others (exit 1 when any is not certified)."""
    from provisioner.health import certify_render as R
    from provisioner.health.certify_run import run_certify

    def say(text: str) -> None:
        sys.stderr.write(safe_text(text) + "\n")
        sys.stderr.flush()

    run = run_certify(
        inventory=inventory,
        local=local,
        snapshot=snapshot,
        level=level.value,
        limit=limit,
        parallel=parallel,
        timeout=timeout,
        progress=say,
    )
    render = {CertifyFormat.json: R.to_json, CertifyFormat.junit: R.to_junit}.get(output_format, R.to_table)
    sys.stdout.write(render(run))
    return run.exit_code()


@app.command()
def top(
    inventory: InventoryOpt = None,
    local: LocalOpt = False,
    limit: LimitOpt = None,
    once: Annotated[bool, typer.Option("--once", help="One sample, printed, then exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 3.0,
    output_format: Annotated[TopFormat, typer.Option("--format", help="json/prometheus need --once.")] = (
        TopFormat.table
    ),
    parallel: ParallelOpt = 50,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, max=600, help="Seconds per host per refresh.")
    ] = 20.0,
) -> int:
    """The fleet's GPUs live: utilisation, memory, temperature, power, slowdowns, Xids of this boot."""
    import json

    from rich.console import Console
    from rich.live import Live

    from provisioner import top as T

    if output_format is not TopFormat.table and not once:
        raise typer.BadParameter("--format json|prometheus is for scripts: add --once", param_hint="--format")
    console = Console(highlight=False, soft_wrap=False, width=max(120, Console().width))
    # A terminal watching a live run gets one table redrawn; a pipe or a log gets one table per refresh.
    live = Live(console=console, auto_refresh=False) if not once and sys.stdout.isatty() else None

    def show(samples: list) -> None:
        if output_format is TopFormat.json:
            typer.echo(json.dumps(T.to_json(samples), indent=2))
        elif output_format is TopFormat.prometheus:
            typer.echo(T.to_prometheus(samples), nl=False)
        else:
            title = "" if once else f"gpuprov top  {time.strftime('%H:%M:%S')}  every {interval:g}s"
            if live is not None:
                live.update(T.table(samples, title + "  (Ctrl-C to quit)"), refresh=True)
            else:
                console.print(T.table(samples, title))
                sys.stdout.flush()

    try:
        with live or contextlib.nullcontext():
            last = T.run_top(inventory=inventory, local=local, limit=limit, once=once, interval=interval,
                             parallel=parallel, timeout=timeout, show=show)  # fmt: skip
    except KeyboardInterrupt:
        return 0
    return 1 if once and any(s.failed for s in last) else 0


# The options of the rolling changes.
BatchOpt = Annotated[
    str | None, typer.Option("--batch", help="Hosts per batch: a number or a share (25%); default 1.")
]
MaxFailOpt = Annotated[
    int | None, typer.Option("--max-fail", help="Failures allowed before batches stop (default 0).")
]


@app.command("upgrade-driver")
def upgrade_driver(
    inventory: InventoryOpt = None,
    to: Annotated[
        str | None, typer.Option("--to", help="Driver branch (580) or version (580.159.04) to upgrade to.")
    ] = None,
    batch: BatchOpt = None,
    canary: Annotated[int | None, typer.Option("--canary", help="Hosts upgraded alone first.")] = None,
    max_fail: MaxFailOpt = None,
    pause: Annotated[bool, typer.Option("--pause", help="Ask before each batch after the first.")] = False,
    drain: Annotated[
        bool | None,
        typer.Option("--drain/--no-drain", help="Drain nodes (default), or only evict pods that use GPUs."),
    ] = None,
    reboot_allowed: Annotated[
        bool, typer.Option("--reboot-allowed", help="Reboot a host whose modules cannot be reloaded.")
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the latest unfinished upgrade of this inventory.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan (batches, order, from → to); change nothing.")
    ] = False,
    output_format: FormatOpt = OutputFormat.table,
    limit: LimitOpt = None,
    drain_timeout: Annotated[
        float | None, typer.Option("--drain-timeout", help="Seconds allowed for a drain (default 300).")
    ] = None,
) -> int:
    """Roll a driver upgrade across GPU hosts: cordon, drain, upgrade, reload, verify, uncordon."""
    from provisioner.rollout.render import Progress
    from provisioner.upgrade.render import show
    from provisioner.upgrade.verb import run_upgrade

    result = run_upgrade(
        inventory=inventory, to=to, batch=batch, canary=canary, max_fail=max_fail, pause=pause or None,
        drain=drain, reboot_allowed=reboot_allowed or None, resume=resume, dry_run=dry_run, limit=limit,
        drain_timeout=drain_timeout, progress=Progress(), confirm=_confirm,
    )  # fmt: skip
    return show(result, output_format.value)


mig_app = typer.Typer(help="MIG layouts on Kubernetes GPU nodes, through the GPU Operator's MIG manager.")
app.add_typer(mig_app, name="mig")


@mig_app.command("apply")
def mig_apply(
    inventory: InventoryOpt = None,
    limit: LimitOpt = None,
    batch: BatchOpt = None,
    canary: Annotated[int | None, typer.Option("--canary", help="Hosts changed alone first.")] = None,
    max_fail: MaxFailOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Seconds the MIG manager gets per node to report (default 600)."),
    ] = None,
    advertise_timeout: Annotated[
        float | None,
        typer.Option(
            "--advertise-timeout",
            help="Seconds a node gets, after its MIG manager reports success, to advertise the layout's "
            "resources (default 120).",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the latest unfinished run (a node whose MIG manager failed gets a new "
            "manager pod, which retries the layout).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and print the plan; change nothing.")
    ] = False,
    output_format: FormatOpt = OutputFormat.table,
) -> int:
    """Apply each GPU host's declared MIG layout (gpuprov_mig_config), batch by batch: cordon, evict GPU
    pods, set nvidia.com/mig.config, wait for the MIG manager, verify devices and allocatable, uncordon."""
    from provisioner.migapply.verb import run_mig_apply
    from provisioner.rollout.render import Progress, render_summary

    result = run_mig_apply(
        inventory=inventory, limit=limit, batch=batch, canary=canary, max_fail=max_fail, resume=resume,
        dry_run=dry_run, state_timeout=timeout, advertise_timeout=advertise_timeout, progress=Progress(),
    )  # fmt: skip
    if result.summary is not None:
        render_summary(result.summary, output_format.value)
    elif output_format is OutputFormat.json and result.plan_doc is not None:
        import json

        sys.stdout.write(json.dumps(result.plan_doc, indent=2) + "\n")
    else:
        sys.stdout.write(result.plan_text)
        for note in result.notes:
            sys.stderr.write(f"note: {note}\n")
    return result.exit_code


def _day2_apply(name: str, help_text: str) -> Callable[..., int]:
    """The `apply` command of a day-2 verb (DAY2's `name`): the playbook verbs' options, on every host of
    the inventory."""

    def apply(
        inventory: InventoryOpt = None,
        check: CheckOpt = False,
        yes: YesOpt = False,
        forks: ForksOpt = 20,
        output_format: FormatOpt = OutputFormat.table,
    ) -> int:
        from provisioner.playbookverb.day2 import run_day2

        verb = partial(run_day2, name, inventory=inventory)
        return _run_playbook_verb(verb, check=check, yes=yes, forks=forks, output_format=output_format)

    apply.__doc__ = help_text
    return apply


sharing_app = typer.Typer(help="GPU sharing (time-slicing, MPS) through the GPU Operator's device plugin.")
app.add_typer(sharing_app, name="sharing")
sharing_app.command("apply")(
    _day2_apply(
        "sharing",
        """Publish the sharing profiles (gpuprov_gpu_sharing_profiles), label each GPU node with its
        profile (gpuprov_gpu_sharing), restart the device plugin where a profile changed, then verify
        gpu.sharing and k8s.gpu_allocatable on the GPU nodes.""",
    )
)
tenants_app = typer.Typer(help="Tenants: namespaces with GPU quotas and limits, dedicated node pools.")
app.add_typer(tenants_app, name="tenants")
tenants_app.command("apply")(
    _day2_apply(
        "tenants",
        """Create or update the tenants (gpuprov_tenants): namespaces, GPU quotas, limits, node pools;
        then verify tenants.quota.""",
    )
)


def _confirm(question: str) -> bool:
    return bool(typer.confirm(question, default=False))


def main() -> None:
    """Console entry point: run the app and turn library errors into one line and an exit code."""
    _add_plugins()
    try:
        rc = app(standalone_mode=False)
    except typer.Exit as exc:
        rc = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("gpuprov: interrupted", err=True)
        rc = EXIT_INTERRUPTED
    except typer.TyperException as exc:
        # Usage errors (unknown option, bad value): click-style message, exit 2.
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            typer.echo(f"gpuprov: error: {exc}", err=True)
        rc = getattr(exc, "exit_code", None) or EXIT_BAD_INPUT
    except GpuprovError as exc:
        # Messages may quote what a host or a file said: shown, never obeyed by the terminal.
        typer.echo(f"gpuprov: error: {safe_text(str(exc))}", err=True)
        rc = exc.exit_code
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EBADF, errno.EDQUOT):
            raise
        # The report itself could not be written (stdout is full, a pipe closed early): one line, no
        # traceback; stdout is pointed at /dev/null so the interpreter's own final flush stays quiet.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        with contextlib.suppress(OSError):
            sys.stderr.write(f"gpuprov: error: cannot write the output: {exc.strerror or exc}\n")
        rc = EXIT_BAD_INPUT
    sys.exit(rc if isinstance(rc, int) else 0)
