"""`gpuprov bootstrap`: bare hosts → GPU Operator through the stage playbook, then verification.

Order of work: inventory and settings validated (bad input: exit 2, no host touched) → confirmation →
playbooks/site.yml through ansible-runner with one tag per chosen stage → live per-host, per-stage
progress from runner events → a run record (events, stats, summary) → verification of the hosts that
came through, limited to the checks that prove the stages that ran.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.config import validate_inventory_settings
from provisioner.content import PLAYBOOKS_DIR, role_default
from provisioner.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError
from provisioner.hosttext import safe_text
from provisioner.stages import STAGE_NAMES, STAGES, VERIFY, select_stages

SITE_PLAYBOOK = PLAYBOOKS_DIR / "site.yml"
FACTS_PLAY = "Facts"  # site.yml's first play, tagged always: it runs whatever the stages


# ------------------------------------------------------------------------------------------ progress


class Progress:
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


# ------------------------------------------------------------------------------------------ summary


@dataclass
class HostOutcome:
    host: str
    status: str  # done | failed | unreachable | reboot-pending | not-run | interrupted
    stats: dict[str, int] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    reboot_pending: bool = False
    verify: str | None = None  # worst verification status, when verified
    verify_failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "status": self.status}
        out.update(
            {
                k: self.stats.get(k, 0)
                for k in ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")
            }
        )
        out["stages"] = self.stages
        out["reason"] = self.reason
        out["reboot_pending"] = self.reboot_pending
        out["verify"] = self.verify
        if self.verify_failures:
            out["verify_failures"] = self.verify_failures
        return out


def _effective(host_vars: dict[str, Any], role: str, knob: str) -> Any:
    value = host_vars.get(knob)
    if isinstance(value, str) and "{{" in value:
        return None
    return value if value is not None else role_default(role, knob)


def expectations_for(host: Any, stages: list[str]) -> dict[str, Any]:
    """Policy keys that the stages just applied to `host` make certain (what verify should find)."""
    hv = host.vars
    gpu_host = "gpu_nodes" in host.groups
    exp: dict[str, Any] = {}
    services: list[str] = []
    if gpu_host and "nvidia_driver" in stages:
        version = _effective(hv, "nvidia_driver", "nvidia_driver_version")
        branch = _effective(hv, "nvidia_driver", "nvidia_driver_branch")
        if version:
            exp["driver.version"] = str(version)
        elif branch:
            exp["driver.version"] = str(branch)
        exp["gpu.persistence"] = True
    if gpu_host and "cuda_toolkit" in stages:
        versions = _effective(hv, "cuda_toolkit", "cuda_toolkit_versions")
        default = _effective(hv, "cuda_toolkit", "cuda_toolkit_default_version")
        if default:
            exp["cuda.version"] = str(default)
        elif isinstance(versions, list) and versions:
            exp["cuda.version"] = str(versions[-1])
    if "docker" in stages:
        services += ["docker", "containerd"]
    if gpu_host and "nvidia_container_toolkit" in stages:
        exp["container_toolkit.runtime"] = ["docker", "containerd"]
    if "kubernetes" in stages and "k8s_cluster" in host.groups:
        services += ["containerd", "kubelet"]
        exp["k8s.node"] = True
    if services:
        exp["services.active"] = sorted(set(services))
    return exp


def _check_ids(stages: list[str], host: Any) -> list[str]:
    ids: list[str] = []
    for stage in STAGES:
        if stage.name in stages:
            ids.extend(stage.check_ids_for(host.groups))
    return list(dict.fromkeys(ids))


def _verify(hosts: list[Any], stages: list[str]) -> dict[str, Any]:
    """Verify each host against what its stages promise; returns {host: HostReport}."""
    from provisioner.policy import Policy
    from provisioner.verification import verify_hosts

    by_checks: dict[tuple[str, ...], list[Any]] = {}
    for h in hosts:
        by_checks.setdefault(tuple(_check_ids(stages, h)), []).append(h)
    reports: dict[str, Any] = {}
    for ids, group in by_checks.items():
        if not ids:
            continue
        policy = Policy(path=None, hosts={h.name: expectations_for(h, stages) for h in group})
        report = verify_hosts(group, policy, checks=list(ids))
        for hr in report.hosts:
            reports[hr.host] = hr
    return reports


# ------------------------------------------------------------------------------------------ the verb


def _confirm(hosts: list[Any], stages: list[str], assume_yes: bool) -> None:
    if assume_yes:
        return
    if not sys.stdin.isatty():
        raise InputError(
            f"refusing to change {len(hosts)} host(s) without --yes (standard input is not a terminal)"
        )
    import typer

    names = ", ".join(h.name for h in hosts[:8]) + (" ..." if len(hosts) > 8 else "")
    if not typer.confirm(f"Bootstrap {len(hosts)} host(s) ({names}) through {', '.join(stages)}?"):
        raise InputError("not confirmed; nothing was changed")


def _retry_limit(inventory: Path, limit: str | None) -> str | None:
    import json

    record = records.latest("bootstrap", str(inventory.resolve()))
    if record is None:
        raise InputError(f"--retry-failed: no earlier bootstrap run recorded for {inventory}")
    doc = json.loads((record / "summary.json").read_text())
    failed = [h["host"] for h in doc.get("hosts", []) if h.get("status") not in ("done",)]
    if not failed:
        return None
    names = ",".join(failed)
    return f"{names}:&{limit}" if limit else names


def run_bootstrap(
    *,
    inventory: Path | None,
    only: list[str],
    skip: list[str],
    limit: str | None,
    check: bool,
    assume_yes: bool,
    retry_failed: bool,
    forks: int,
    output_format: str,
) -> int:
    from provisioner.inventory import load_inventory

    if inventory is None:
        raise InputError("-i/--inventory is required (try: gpuprov lab inventory)")
    chosen = select_stages(only, skip)
    plays = [s for s in chosen if s in STAGE_NAMES]
    if not SITE_PLAYBOOK.is_file():
        raise InputError(f"{SITE_PLAYBOOK}: playbook missing from this installation")
    inv = load_inventory(inventory)
    if retry_failed:
        limit = _retry_limit(inventory, limit)
        if limit is None:
            sys.stderr.write("bootstrap: the last run left no failed host; nothing to retry\n")
            return EXIT_OK
    hosts = inv.select(limit)
    if not hosts:
        raise InputError(f"{inventory}: no host selected" + (f" by --limit {limit}" if limit else ""))
    validate_inventory_settings(inv, hosts)
    if not check:
        _confirm(hosts, chosen, assume_yes)

    record = records.new_record("bootstrap")
    command = {
        "verb": "bootstrap",
        "inventory": str(inventory.resolve()),
        "stages": chosen,
        "limit": limit,
        "check": check,
        "forks": forks,
        "hosts": [h.name for h in hosts],
    }
    records.write_json(record / "command.json", command)
    sys.stderr.write(f"bootstrap: {len(hosts)} host(s), stages {', '.join(chosen)}; record {record}\n")

    outcomes = {h.name: HostOutcome(h.name, "not-run") for h in hosts}
    interrupted = False
    if plays:
        from provisioner.runner import run_playbook

        all_plays = len(plays) == len(STAGE_NAMES)
        shown = {FACTS_PLAY, *plays}
        progress = Progress(shown=None if all_plays else shown)
        result = run_playbook(
            SITE_PLAYBOOK,
            inventory,
            record_dir=record,
            limit=limit,
            tags=None if all_plays else plays,
            check=check,
            forks=forks,
            on_event=progress,
        )
        progress.finish()
        interrupted = result.interrupted
        for name, outcome in outcomes.items():
            stats = result.stats.get(name)
            outcome.stats = stats.as_dict() if stats else {}
            outcome.stages = {
                stage: state
                for stage, state in result.stages.get(name, {}).items()
                if stage in shown or state in ("failed", "unreachable")
            }
            failures = [f for f in result.failures if f.host == name]
            if failures:
                first = failures[0]
                outcome.status = "unreachable" if first.unreachable else "failed"
                outcome.reason = f"{first.stage or '-'}: {first.task}: {first.message}".strip()
            elif stats is not None:
                outcome.status = "done"
            elif interrupted:
                outcome.status = "interrupted"
            outcome.reboot_pending = name in result.reboot_pending
            if outcome.reboot_pending and outcome.status == "done":
                outcome.status = "reboot-pending"
                outcome.reason = "the driver change needs a reboot; gpuprov_reboot_allowed is false"
        if interrupted:
            for outcome in outcomes.values():
                if outcome.status in ("done", "not-run") and not outcome.stats:
                    outcome.status = "interrupted"
    else:
        for outcome in outcomes.values():
            outcome.status = "done"

    verify_report: dict[str, Any] = {}
    verify_s = 0.0
    if VERIFY in chosen and not check and not interrupted:
        ready = [h for h in hosts if outcomes[h.name].status == "done"]
        if ready:
            sys.stderr.write(f"bootstrap: verifying {len(ready)} host(s)\n")
            t0 = time.monotonic()
            verify_report = _verify(ready, chosen)
            verify_s = time.monotonic() - t0
            for name, hr in verify_report.items():
                outcome = outcomes[name]
                outcome.verify = hr.status
                bad = [f for f in hr.findings if f.status in ("warn", "fail", "error")]
                outcome.verify_failures = [f"{f.id}: {f.status}: {f.detail}" for f in bad]
                if hr.error:
                    outcome.verify_failures.append(f"unreachable: {hr.error}")
                if bad or hr.error:
                    outcome.status = "verify-failed"
                    outcome.reason = outcome.verify_failures[0]

    summary = {
        "verb": "bootstrap",
        "inventory": command["inventory"],
        "record": str(record),
        "check": check,
        "stages": chosen,
        "interrupted": interrupted,
        "hosts": [outcomes[h.name].to_dict() for h in hosts],
    }
    summary["totals"] = {
        status: sum(1 for o in outcomes.values() if o.status == status)
        for status in sorted({o.status for o in outcomes.values()})
    }
    if verify_report:
        records.write_json(record / "verify.json", {n: hr.to_dict() for n, hr in verify_report.items()})
    records.write_json(record / "summary.json", summary)
    _render(summary, output_format, verify_report, verify_s)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if all(o.status == "done" for o in outcomes.values()) else EXIT_FAILED


def _render(
    summary: dict[str, Any], output_format: str, verify_report: dict[str, Any], verify_s: float = 0.0
) -> None:
    import json

    if output_format == "json":
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False, width=max(100, Console().width))
    table = Table(title="bootstrap" + (" (check mode)" if summary["check"] else ""), show_lines=False)
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
    totals = ", ".join(f"{n} {s}" for s, n in summary["totals"].items())
    console.print(f"hosts: {totals}; record: {summary['record']}")
