"""How the CLI shows a playbook verb (bootstrap, sharing apply, tenants apply): progress while the
playbook runs, then the result.

In a terminal the progress is a live table (rich Live): per host the stage and the task running now, and
for how long; a line is printed above it as each host finishes a stage or fails. Elsewhere (a pipe, a
log file, --format json) the same lines are printed plainly, on stderr, so stdout keeps the summary.
Everything hosts said (task names come from playbooks, messages and diffs from hosts) is shown escaped.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from provisioner.hosttext import safe_text, short_safe_text
from provisioner.playbookverb.run import CHECKED


class PlainProgress:
    """Prints one line per host as each stage finishes there, and failures as they happen.

    Lines go to stderr so that `--format json` keeps stdout machine-readable. Plays of stages left out
    by --only/--skip still start (Ansible validates every role's arguments, a task tagged `always`), but
    they are not shown as stages that ran; only their failures are.
    """

    def __init__(self, stream: Any = None, shown: set[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.shown = shown  # the plays to report; None: all
        self.stage: str | None = None
        self.seen: dict[str, dict[str, int]] = {}  # host -> {"changed": n, "tasks": n}
        self.failed: set[tuple[str, str | None]] = set()
        self.started = time.monotonic()

    def _print(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        # Failure messages carry hosts' own words: shown, never obeyed by the terminal.
        self.stream.write(f"[{elapsed:6.1f}s] {safe_text(text)}\n")
        self.stream.flush()

    def _close_stage(self) -> None:
        if self.stage is None or not self._shown(self.stage):
            self.seen = {}
            return
        for host, counts in sorted(self.seen.items()):
            if (host, self.stage) in self.failed:
                continue
            what = f"changed {counts['changed']}" if counts["changed"] else "ok"
            self._print(f"{host:<20} {self.stage:<26} {what}")
        self.seen = {}

    def __call__(self, event: Any) -> None:
        if event.kind == "play_start":
            self._close_stage()
            self.stage = event.stage
            if self.stage and self._shown(self.stage):
                self._print(f"── {self.stage}")
            return
        if event.host is None:
            return
        counts = self.seen.setdefault(event.host, {"changed": 0, "tasks": 0})
        counts["tasks"] += 1
        if event.changed:
            counts["changed"] += 1
        if event.kind in ("runner_on_failed", "runner_on_unreachable"):
            key = (event.host, event.stage)
            if key not in self.failed:
                self.failed.add(key)
                label = "UNREACHABLE" if event.kind == "runner_on_unreachable" else "FAILED"
                self._print(
                    f"{event.host:<20} {event.stage or '-':<26} {label}: {event.task}: {event.message}"
                )

    def _shown(self, stage: str) -> bool:
        return self.shown is None or stage in self.shown

    def finish(self) -> None:
        self._close_stage()

    def note(self, text: str) -> None:
        self.stream.write(safe_text(text) + "\n")
        self.stream.flush()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def render_summary(
    summary: dict[str, Any], output_format: str, verify_report: dict[str, Any], verify_s: float = 0.0
) -> None:
    """The result: JSON, or a table per host (then the verification table and check mode's changes)."""
    if output_format == "json":
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False, width=max(100, Console().width))
    title = str(summary.get("verb") or "bootstrap").replace("-", " ")
    table = Table(title=title + (" (check mode)" if summary["check"] else ""), show_lines=False)
    for col in ("host", "status", "ok", "changed", "failed", "unreach.", "skipped", "reason"):
        table.add_column(
            col, justify="right" if col in ("ok", "changed", "failed", "unreach.", "skipped") else "left"
        )
    for h in summary["hosts"]:
        table.add_row(
            h["host"],
            h["status"],
            str(h["ok"]),
            str(h["changed"]),
            str(h["failed"]),
            str(h["unreachable"]),
            str(h["skipped"]),
            Text(safe_text(h["reason"] or "")),
        )
    console.print(table)
    if verify_report:
        from provisioner.report import render
        from provisioner.report.model import Report

        report = Report(
            hosts=list(verify_report.values()),
            checks=sorted({f.id for hr in verify_report.values() for f in hr.findings}),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            source="ssh",
            duration_s=verify_s,
        )
        sys.stdout.write(render(report, "table", fail_on="warn", drift=False, color=sys.stdout.isatty()))
    if summary.get("check"):
        for line in change_lines(summary.get("changes") or {}, summary["hosts"]):
            console.print(Text(line))
    totals = ", ".join(f"{n} {s}" for s, n in summary["totals"].items())
    console.print(f"hosts: {totals}; record: {summary['record']}")


@dataclass
class _HostRow:
    stage: str = "-"
    task: str = "-"
    task_started: float = 0.0
    changed: int = 0
    state: str = "running"  # running | failed | unreachable | done


class LiveProgress:
    """A live table of the hosts while the playbook runs, with a line above it per finished stage."""

    def __init__(
        self, shown: set[str] | None = None, console: Any = None, refresh_per_second: float = 4
    ) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True, highlight=False)
        self.shown = shown
        self.rows: dict[str, _HostRow] = {}
        self.stage: str | None = None
        self.stage_changed: dict[str, int] = {}
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.refresh_per_second = refresh_per_second
        self.live: Any = None
        self.pending: list[str] = []

    # -- the table
    def table(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        with self.lock:
            rows = sorted(self.rows.items())
            stage = self.stage
        title = f"bootstrap: {stage or 'starting'} ({now - self.started:.0f}s)"
        table = Table(title=title, title_justify="left", expand=False)
        for col in ("host", "stage", "task now", "for", "changed"):
            table.add_column(col, justify="right" if col in ("for", "changed") else "left", no_wrap=True)
        for host, row in rows:
            running = row.state == "running" and row.task_started
            table.add_row(
                Text(short_safe_text(host, 40)),
                Text(short_safe_text(row.stage, 26)),
                Text(short_safe_text(row.task if row.state == "running" else row.state.upper(), 60)),
                f"{now - row.task_started:.0f}s" if running else "",
                str(row.changed),
            )
        return table

    def _line(self, text: str) -> None:
        """Queue a line; _flush prints it. Never print while holding the lock: Live's refresh thread holds
        its own lock while it asks for the table, which takes ours."""
        elapsed = time.monotonic() - self.started
        self.pending.append(f"[{elapsed:6.1f}s] {safe_text(text)}")

    def _flush(self) -> None:
        from rich.text import Text

        with self.lock:
            lines, self.pending = self.pending, []
        for line in lines:
            self.console.print(Text(line))

    def note(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text(safe_text(text)))

    def _shown(self, stage: str | None) -> bool:
        return stage is not None and (self.shown is None or stage in self.shown)

    def _close_stage(self) -> None:
        if self._shown(self.stage):
            for host, changed in sorted(self.stage_changed.items()):
                row = self.rows.get(host)
                if row is not None and row.state == "running":
                    self._line(f"{host:<20} {self.stage:<26} {f'changed {changed}' if changed else 'ok'}")
        self.stage_changed = {}

    # -- events (from the runner's thread)
    def __call__(self, event: Any) -> None:
        self._start()
        self._take(event)
        self._flush()

    def _take(self, event: Any) -> None:
        if event.kind == "play_start":
            with self.lock:
                self._close_stage()
                self.stage = event.stage
            return
        if event.host is None:
            return
        with self.lock:
            row = self.rows.setdefault(event.host, _HostRow())
            if self._shown(event.stage):
                row.stage = event.stage or "-"
            if event.kind == "runner_on_start":
                row.task, row.task_started = event.task or "-", time.monotonic()
                if self._shown(event.stage):
                    self.stage_changed.setdefault(event.host, 0)
                return
            if event.kind in (
                "runner_on_ok",
                "runner_on_skipped",
                "runner_on_failed",
                "runner_on_unreachable",
            ):
                row.task_started = 0.0  # the task is over on this host: no clock until its next one
            if event.changed:
                row.changed += 1
                if self._shown(event.stage):
                    self.stage_changed[event.host] = self.stage_changed.get(event.host, 0) + 1
            if event.kind in ("runner_on_failed", "runner_on_unreachable") and row.state == "running":
                row.state = "unreachable" if event.kind == "runner_on_unreachable" else "failed"
                what = f"{row.state.upper()}: {event.task}: {event.message}"
                self._line(f"{event.host:<20} {event.stage or '-':<26} {what}")

    def _start(self) -> None:
        """The table appears with the playbook's first event: a confirmation question comes first."""
        if self.live is not None:
            return
        from rich.live import Live

        self.live = Live(
            get_renderable=self.table,
            console=self.console,
            refresh_per_second=self.refresh_per_second,
            transient=True,
        )
        self.live.__enter__()

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self._close_stage()
            for host, row in sorted(self.rows.items()):
                if row.state == "running":
                    row.state = "done"
                    self._line(f"{host:<20} finished: {row.changed} change(s)")
        self._flush()
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def finish(self) -> None:
        self.__exit__()


def make_progress(output_format: str, shown: set[str] | None = None, stdout: TextIO | None = None) -> Any:
    """Live in a terminal; plain lines when stdout is not a terminal or the output is JSON."""
    out = stdout or sys.stdout
    if output_format != "json" and out.isatty():
        return LiveProgress(shown=shown)
    return PlainProgress(shown=shown)


def change_lines(
    changes: dict[str, list[dict[str, str]]], hosts: list[dict[str, Any]] | None = None
) -> list[str]:
    """Check mode's findings as text: per host, each task that would change and its diff (escaped). A
    host whose run did not finish (`hosts`: the summary's rows; unreachable, failed, not run) never reads
    "nothing would change": what would change there is unknown, and the line says why."""
    status = {h["host"]: str(h.get("status")) for h in hosts or []}
    lines: list[str] = []
    for host in [*changes, *(h for h in status if h not in changes)]:
        tasks = changes.get(host, [])
        state = status.get(host, "done")
        if state not in CHECKED:
            why = "could not be reached" if state == "unreachable" else state
            before = f"; before that, {len(tasks)} task(s) would change" if tasks else ""
            lines.append(f"{host}: {why}: what would change there is unknown{before}")
        elif not tasks:
            lines.append(f"{host}: nothing would change")
            continue
        else:
            lines.append(f"{host}: {len(tasks)} task(s) would change")
        for t in tasks:
            lines.append(f"  {t['stage']}: {t['task']}")
            lines.extend(f"    {line}" for line in (t.get("diff") or "").splitlines())
    return [safe_text(line) for line in lines]


def show(result: Any, output_format: str) -> int:
    """Print a VerbResult the way the CLI does; returns its exit code."""
    if result.summary is not None:
        render_summary(result.summary, output_format, result.verify_report, result.verify_s)
    return int(result.exit_code)
