"""`gpuprov lab ...`: the local simulated GPU fleet's verbs, added to the product's CLI by an entry point.

The product's CLI finds this app through the `gpuprov.cli` entry-point group (see the lab's pyproject);
the product itself never imports the lab. Heavy modules are imported inside the verbs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

app = typer.Typer(
    help="The local simulated GPU fleet (test bed and demo target).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

LabOpt = Annotated[
    str, typer.Option("--lab", envvar="GPUPROV_LAB", help="Lab name (several labs can coexist).")
]


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def _lab_progress(message: str) -> None:
    typer.echo(message, err=True)


@app.command("up")
def lab_up(
    lab: LabOpt = "default",
    hosts: Annotated[
        int | None,
        typer.Option("--hosts", help="Hosts in total: cp1 plus GPU hosts gpu1..gpuN-1 (default 4)."),
    ] = None,
    profiles: Annotated[
        str | None,
        typer.Option(help="GPU profiles of gpu1, gpu2, ... (comma-separated), e.g. h200,h100-sxm-8,l40s."),
    ] = None,
    os_names: Annotated[
        str | None,
        typer.Option(
            "--os",
            help="Operating systems of gpu1, gpu2, ... (comma-separated): bookworm (containerd 1.6), trixie "
            "(1.7), trixie-containerd2 (2.x, lab-only); default: one of each in turn (cp1 is bookworm).",
        ),
    ] = None,
    subnet: Annotated[
        str | None,
        typer.Option(help="Private IPv4 network for the lab (a /24 or larger); default: a free one."),
    ] = None,
    mirror_port: Annotated[
        int | None,
        typer.Option("--mirror-port", help="Port of the lab mirror on the lab gateway (default 8080)."),
    ] = None,
) -> int:
    """Create the lab, or reconcile it with the options (idempotent)."""
    from gpuprov_lab import fleet, render

    req = fleet.UpRequest(
        lab=lab,
        hosts=hosts,
        profiles=_split(profiles) if profiles is not None else None,
        os=_split(os_names) if os_names is not None else None,
        subnet=subnet,
        mirror_port=mirror_port,
    )
    st = fleet.up(req, progress=_lab_progress)
    typer.echo(render.up_summary(st))
    return 0


@app.command("down")
def lab_down(lab: LabOpt = "default") -> int:
    """Remove the lab: containers, network, volumes, mirror server, state."""
    from gpuprov_lab import fleet, render

    typer.echo(render.down_summary(lab, fleet.down(lab, progress=_lab_progress)))
    return 0


@app.command("status")
def lab_status(
    lab: LabOpt = "default",
    output_format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> int:
    """Hosts of the lab: address, profile, state, SSH."""
    from gpuprov_lab import fleet, render

    st, rows, mirror_ok = fleet.status(lab)
    if output_format is OutputFormat.json:
        typer.echo(render.status_json(st, rows, mirror_ok))
    else:
        render.status_table(st, rows, mirror_ok)
    return 0


@app.command("inventory")
def lab_inventory(
    lab: LabOpt = "default",
    standalone_gpus: Annotated[
        bool,
        typer.Option(
            "--standalone-gpus",
            help="GPU hosts never join Kubernetes: they go in gpu_nodes alone, not in k8s_cluster.",
        ),
    ] = False,
) -> int:
    """Write the lab's Ansible inventory; its path is the last line printed."""
    from gpuprov_lab import inventory, state

    typer.echo(str(inventory.write(state.require(lab), kubernetes=not standalone_gpus)))
    return 0


@app.command("fault")
def lab_fault(
    host: Annotated[str, typer.Argument(help="Lab host (cp1, gpu1, ...).")],
    kind: Annotated[
        str,
        typer.Argument(
            help="ecc, xid, pcie, gpu-missing, remap-pending, remap-failure, install-fail, drain-block, "
            "unreachable, mig-fail; or clear."
        ),
    ],
    gpu: Annotated[int | None, typer.Option("--gpu", help="GPU index for GPU faults (default 0).")] = None,
    xid: Annotated[
        int | None, typer.Option("--xid", help="Xid number for the xid fault (default 79).")
    ] = None,
    lab: LabOpt = "default",
) -> int:
    """Inject a fault into a lab host, or clear its faults."""
    from gpuprov_lab import faults

    now = faults.inject(lab, host, kind, gpu=gpu, xid=xid)
    typer.echo(f"{host}: " + (", ".join(faults.describe(f) for f in now) or "no faults"))
    return 0
