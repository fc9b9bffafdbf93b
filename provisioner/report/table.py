"""Human-readable reports (rich): per-host finding tables, and the fleet drift table (host × check)."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from provisioner.checks.model import ERROR, FAIL, PASS, SKIP, WARN
from provisioner.report.model import HostReport, Report

STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim", ERROR: "magenta"}
MARK = {PASS: "✓", WARN: "!", FAIL: "✗", SKIP: "-", ERROR: "E"}
# Short column names for the drift table; the legend under it maps them back to check ids.
SHORT = {
    "os.supported": "os",
    "gpu.present": "gpu",
    "gpu.count": "cnt",
    "driver.loaded": "drv",
    "driver.version": "ver",
    "driver.userspace_match": "usr",
    "gpu.persistence": "pm",
    "gpu.ecc": "ecc",
    "gpu.memory_remap": "rmp",
    "gpu.pcie_link": "pcie",
    "gpu.throttle": "clk",
    "gpu.xid": "xid",
    "cuda.version": "cuda",
    "packages.held": "held",
    "container_toolkit.runtime": "ctk",
    "services.active": "svc",
    "k8s.node_ready": "node",
    "k8s.gpu_allocatable": "allc",
    "gpu.sharing": "shr",
    "mig.config": "mig",
    "monitoring.dcgm_exporter": "mon",
    "tenants.quota": "tnt",
    "dcgm.diag": "dcgm",
    "container.smoke": "smk",
}
# With more hosts than this, per-host tables show only what is not a pass.
ALL_ROWS_UP_TO = 3


def _console(color: bool, width: int | None, buf: io.StringIO | None = None) -> tuple[Console, io.StringIO]:
    """A console writing to `buf` (a new buffer unless given: two consoles of one report share it)."""
    buf = buf if buf is not None else io.StringIO()
    console = Console(
        file=buf,
        force_terminal=color,
        no_color=not color,
        width=width or 120,
        highlight=False,
        soft_wrap=False,
    )
    return console, buf


def _status(status: str) -> Text:
    return Text(status, style=STYLE[status])


def _host_title(h: HostReport) -> Text:
    title = Text(h.host, style="bold")
    if h.address and h.address != h.host:
        title.append(f" ({h.address})")
    title.append("  ")
    title.append_text(_status(h.status))
    return title


def _summary_line(report: Report) -> str:
    s = report.summary()
    c = s["checks"]
    parts = [f"{s['hosts']} host(s): {s['hosts_ok']} ok, {s['hosts_with_findings']} with findings"]
    if s["hosts_unreachable"]:
        parts.append(f"{s['hosts_unreachable']} unreachable")
    counts = ", ".join(f"{c[k]} {k}" for k in (PASS, WARN, FAIL, SKIP, ERROR))
    return "; ".join(parts) + f" — checks: {counts} ({report.duration_s:.1f} s)"


def render_table(report: Report, *, color: bool = False, width: int | None = None) -> str:
    console, buf = _console(color, width)
    show_all = len(report.hosts) <= ALL_ROWS_UP_TO
    for h in report.hosts:
        table = Table(title=_host_title(h), title_justify="left", expand=False, show_lines=False)
        table.add_column("check", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("gpu", justify="right", no_wrap=True)
        table.add_column("detail", overflow="fold")
        hidden = 0
        for f in h.findings:
            if not show_all and f.status in (PASS, SKIP):
                hidden += 1
                continue
            # Text, not str: a host's words are never read as rich markup.
            table.add_row(f.id, _status(f.status), "" if f.gpu is None else str(f.gpu), Text(f.detail))
        if table.row_count:
            console.print(table)
        else:
            console.print(_host_title(h))
        if hidden:
            console.print(
                Text(f"  {hidden} pass/skip result(s) not shown (--format json lists all)", style="dim")
            )
        if h.error:
            console.print(Text(f"  {h.error}", style=STYLE[ERROR]))
        console.print()
    console.print(_summary_line(report))
    return buf.getvalue()


def render_drift(report: Report, *, color: bool = False, width: int | None = None) -> str:
    """Fleet drift: one row per host, one column per check, then the details of what drifted."""
    host_width = max([4, *(len(h.host) for h in report.hosts)])
    needed = host_width + sum(len(SHORT.get(c, c)) + 4 for c in report.checks) + 8
    # The grid may be wider than the terminal (it never wraps); the rest keeps the terminal's width.
    grid, buf = _console(color, max(width or 120, needed))
    console, _ = _console(color, width, buf)
    table = Table(
        title="fleet drift (host × check)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("host", no_wrap=True, min_width=host_width)
    for check_id in report.checks:
        short = SHORT.get(check_id, check_id)
        table.add_column(short, justify="center", no_wrap=True, min_width=len(short))
    for h in report.hosts:
        cells: list[Text | str] = [Text(h.host)]
        for check_id in report.checks:
            status = h.status_of(check_id)
            cells.append(Text(MARK[status], style=STYLE[status]) if status else "")
        table.add_row(*cells)
    grid.print(table)
    legend = "  ".join(f"{MARK[s]} {s}" for s in (PASS, WARN, FAIL, SKIP, ERROR))
    console.print(Text(legend, style="dim"))
    console.print(Text("columns: " + ", ".join(f"{SHORT.get(c, c)}={c}" for c in report.checks), style="dim"))
    drifted = [(h, f) for h in report.hosts for f in h.findings if f.status in (WARN, FAIL, ERROR)]
    if drifted:
        console.print()
        details = Table(title="drift", title_justify="left")
        details.add_column("host", no_wrap=True)
        details.add_column("check", no_wrap=True)
        details.add_column("status", no_wrap=True)
        details.add_column("gpu", justify="right", no_wrap=True)
        details.add_column("detail", overflow="fold")
        for h, f in drifted:
            gpu = "" if f.gpu is None else str(f.gpu)
            details.add_row(Text(h.host), f.id, _status(f.status), gpu, Text(f.detail))
        console.print(details)
    console.print()
    console.print(_summary_line(report))
    return buf.getvalue()
