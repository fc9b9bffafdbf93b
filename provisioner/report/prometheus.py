"""Prometheus textfile-collector format (node_exporter --collector.textfile.directory).

`gpuprov_check_status` is the worst status of a check on a host as a number, so alerts can use
`>= 2`: 0 pass, 1 skip, 2 warn, 3 error, 4 fail. Per-GPU findings also appear with a `gpu` label.
"""

from __future__ import annotations

import calendar
import time

from provisioner.checks.model import ERROR, FAIL, PASS, SKIP, WARN, worst
from provisioner.report.model import Report

# Stable numeric scale for alerting (independent of how reports order statuses).
CODE = {PASS: 0, SKIP: 1, WARN: 2, ERROR: 3, FAIL: 4}


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**values: str) -> str:
    """`{k="v",...}` with values escaped as the exposition format wants them."""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in values.items()) + "}"


def _timestamp(iso: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return time.time()


def render_prometheus(report: Report) -> str:
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    family(
        "gpuprov_check_status",
        "gauge",
        "Worst result of a check on a host: 0 pass, 1 skip, 2 warn, 3 error, 4 fail.",
    )
    for h in report.hosts:
        for check_id in report.checks:
            status = h.status_of(check_id)
            if status is not None:
                lines.append(f"gpuprov_check_status{labels(host=h.host, check=check_id)} {CODE[status]}")
    family("gpuprov_check_ok", "gauge", "1 when the check passed or did not apply (skip), else 0.")
    for h in report.hosts:
        for check_id in report.checks:
            status = h.status_of(check_id)
            if status is not None:
                ok = 1 if status in (PASS, SKIP) else 0
                lines.append(f"gpuprov_check_ok{labels(host=h.host, check=check_id)} {ok}")
    family(
        "gpuprov_gpu_check_status",
        "gauge",
        "Result of a check for one GPU (index as nvidia-smi numbers them); scale of gpuprov_check_status.",
    )
    for h in report.hosts:
        per_gpu: dict[tuple[str, int], list[str]] = {}
        for f in h.findings:
            if f.gpu is not None:
                per_gpu.setdefault((f.id, f.gpu), []).append(f.status)
        for (check_id, gpu), statuses in sorted(per_gpu.items()):
            rank = CODE[worst(statuses)]
            lines.append(
                f"gpuprov_gpu_check_status{labels(host=h.host, check=check_id, gpu=str(gpu))} {rank}"
            )
    family("gpuprov_host_reachable", "gauge", "1 when the host could be probed, else 0.")
    for h in report.hosts:
        lines.append(f"gpuprov_host_reachable{labels(host=h.host)} {0 if h.error else 1}")
    family("gpuprov_host_probe_duration_seconds", "gauge", "Time spent probing the host.")
    for h in report.hosts:
        lines.append(f"gpuprov_host_probe_duration_seconds{labels(host=h.host)} {h.duration_s:.3f}")
    family("gpuprov_last_run_timestamp_seconds", "gauge", "When this verification ran (Unix time).")
    lines.append(f"gpuprov_last_run_timestamp_seconds {_timestamp(report.started_at):.0f}")
    return "\n".join(lines) + "\n"
