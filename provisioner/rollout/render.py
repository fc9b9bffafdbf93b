"""How the CLI shows a rolling run: progress lines as they happen, then the summary table or JSON."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from provisioner.hosttext import safe_text


class Progress:
    """One line per host and step on stderr (stdout stays for the summary)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, host: str | None, text: str) -> None:
        elapsed = time.monotonic() - self.started
        with self._lock:
            who = f"{host:<20} " if host else ""
            # Reasons carry hosts' and kubectl's own words: shown, never obeyed by the terminal.
            self.stream.write(f"[{elapsed:6.1f}s] {safe_text(who + text)}\n")
            self.stream.flush()


def render_summary(summary: dict[str, Any], output_format: str) -> None:
    if output_format == "json":
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False, width=max(100, Console().width))
    table = Table(title=f"{summary.get('verb', 'rollout')} → {summary['target']}")
    for col in ("host", "from", "to", "result", "time", "reason"):
        table.add_column(col, justify="right" if col == "time" else "left")
    for h in summary["hosts"]:
        table.add_row(
            h["host"],
            h["from"] or "-",
            h["to"] or "-",
            h["result"] or "-",
            f"{h['duration_s']:.0f}s",
            Text(safe_text(h["reason"] or "")),
        )
    console.print(table)
    totals = ", ".join(f"{n} {r}" for r, n in summary["totals"].items())
    tail = "" if summary["status"] == "finished" else f"; {summary['status']}: {summary['stop_reason']}"
    if summary["resumable"]:
        tail += "; continue with --resume"
    console.print(f"hosts: {totals}{tail}; record: {summary['record']}")
