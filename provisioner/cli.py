"""The `gpuprov` command line: parse → call the library → render.

This is the only module that maps errors to exit codes. Heavy modules (Ansible, paramiko, the lab)
are imported inside the verbs so that `gpuprov --help` stays instant.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from provisioner.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, GpuprovError

app = typer.Typer(
    name="gpuprov",
    help="Provision, verify and upgrade NVIDIA GPU servers (driver → CUDA → Docker → container toolkit → "
    "Kubernetes → GPU Operator).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
lab_app = typer.Typer(
    help="The local simulated GPU fleet (test bed and demo target).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(lab_app, name="lab")


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


class ReportFormat(str, Enum):
    table = "table"
    json = "json"
    junit = "junit"
    prometheus = "prometheus"


class FailOn(str, Enum):
    warn = "warn"
    fail = "fail"


InventoryOpt = Annotated[
    Path | None, typer.Option("-i", "--inventory", help="Ansible inventory (YAML or INI file, or directory).")
]
LimitOpt = Annotated[str | None, typer.Option("--limit", "-l", help="Host pattern, as ansible --limit.")]
LabOpt = Annotated[
    str, typer.Option("--lab", envvar="GPUPROV_LAB", help="Lab name (several labs can coexist).")
]


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


@app.command()
def bootstrap(
    inventory: InventoryOpt = None,
    only: Annotated[str | None, typer.Option(help="Comma-separated stages to run (default: all).")] = None,
    skip: Annotated[str | None, typer.Option(help="Comma-separated stages to leave out.")] = None,
    limit: LimitOpt = None,
    check: Annotated[bool, typer.Option("--check", help="Dry run: report what would change.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Rerun only the hosts that failed in the last run.")
    ] = False,
    forks: Annotated[int, typer.Option(min=1, max=500, help="Hosts worked on in parallel.")] = 20,
    output_format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> int:
    """Take hosts from bare OS to GPU Operator, stage by stage, then verify them."""
    from provisioner.bootstrap import run_bootstrap

    return run_bootstrap(
        inventory=inventory,
        only=_split(only),
        skip=_split(skip),
        limit=limit,
        check=check,
        assume_yes=yes,
        retry_failed=retry_failed,
        forks=forks,
        output_format=output_format.value,
    )


@app.command()
def stages() -> int:
    """List the bootstrap stages in the order they run."""
    from provisioner.stages import STAGES

    for stage in STAGES:
        typer.echo(f"{stage.name:<26} {stage.summary}")
    return 0


def main() -> None:
    """Console entry point: run the app and turn library errors into one line and an exit code."""
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
        typer.echo(f"gpuprov: error: {exc}", err=True)
        rc = exc.exit_code
    sys.exit(rc if isinstance(rc, int) else 0)
