"""Text forms of lab results for the CLI (tables and JSON); no logic lives here."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from rich.console import Console
from rich.table import Table

from gpuprov_lab.fleet import DownReport, HostStatus
from gpuprov_lab.state import LabState


def status_table(st: LabState, rows: list[HostStatus], mirror_ok: bool) -> None:
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    table = Table(
        title=f"lab {st.name} ({st.subnet}, mirror {st.mirror_url} {'ok' if mirror_ok else 'DOWN'})"
    )
    for col in ("host", "address", "profile", "state", "ssh", "faults"):
        table.add_column(col)
    for r in rows:
        profile = r.profile if r.gpus == 0 else f"{r.profile} ({r.gpus} GPU)"
        table.add_row(r.host, r.address, profile, r.state, r.ssh, ", ".join(r.faults) or "-")
    console.print(table)


def status_json(st: LabState, rows: list[HostStatus], mirror_ok: bool) -> str:
    return json.dumps(
        {
            "lab": st.name,
            "subnet": st.subnet,
            "mirror_url": st.mirror_url,
            "mirror_ok": mirror_ok,
            "hosts": [asdict(r) for r in rows],
        },
        indent=2,
    )


def up_summary(st: LabState) -> str:
    lines = [f"lab {st.name}: {len(st.hosts)} host(s) on {st.subnet}, mirror {st.mirror_url}/"]
    for h in st.hosts:
        lines.append(f"  {h.name:<6} {h.ip:<15} {h.profile}")
    lines.append(f"inventory: {st.paths.inventory}")
    return "\n".join(lines)


def down_summary(lab: str, r: DownReport) -> str:
    parts = [
        f"{len(r.containers)} container(s)",
        f"{len(r.networks)} network(s)",
        f"{len(r.volumes)} volume(s)",
        "mirror server stopped" if r.mirror_stopped else "no mirror server",
        "registry stopped" if r.registry_stopped else "no registry",
        "state removed" if r.state_removed else "no state",
    ]
    if r.engine_stopped:
        parts.append("engine stopped")
    return f"lab {lab} removed: " + ", ".join(parts)
