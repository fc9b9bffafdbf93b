"""Running playbooks through ansible-runner, and nothing else: the only importer of ansible_runner.

Results are typed (per-host stats, per-host per-stage outcome, failures with their reason) and come
from runner events and the final stats event, never from scraping Ansible's stdout. Each run gets a
fresh private data dir inside its run record, with `suppress_env_files` so no secret lingers on disk.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.content import ANSIBLE_CFG, ROLES_DIR
from provisioner.errors import GpuprovError
from provisioner.stages import STAGE_NAMES

# The fact set on a host whose driver takes effect only after a reboot that was not allowed (the
# nvidia_driver role's tasks/reboot.yml, playbooks/tasks/upgrade_driver_reboot.yml). An ok task result whose
# ansible_facts hold it as true (or "true") adds the host to PlaybookResult.reboot_pending, where it stays
# for the rest of the run.
REBOOT_PENDING_FACT = "nvidia_driver_reboot_pending"
# The facts an ok task result passes on in Event.facts; any other fact it set (or gathered) is dropped. The
# upgrade play's step and reboot note (playbooks/upgrade_driver.yml) are what the upgrade's progress reads.
PROGRESS_FACTS = frozenset({"gpuprov_upgrade_step", "gpuprov_upgrade_note", REBOOT_PENDING_FACT})


@dataclass
class HostStats:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The counts by Ansible's names for them; the host is what they are filed under."""
        counts = asdict(self)
        del counts["host"]
        return counts


@dataclass(frozen=True)
class Event:
    """One runner event, reduced to what progress and summaries need."""

    kind: str  # runner_on_ok, runner_on_failed, runner_on_unreachable, runner_on_skipped, play_start, ...
    host: str | None
    stage: str | None
    task: str | None
    changed: bool = False
    message: str = ""
    facts: Mapping[str, Any] = field(default_factory=dict)  # the PROGRESS_FACTS the task set
    diff: str = ""  # what the task changed (or would change, in check mode), as a unified diff


@dataclass(frozen=True)
class Failure:
    host: str
    stage: str | None
    task: str | None
    message: str
    unreachable: bool = False


@dataclass
class PlaybookResult:
    status: str  # successful | failed | canceled | timeout | error
    rc: int
    stats: dict[str, HostStats] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    reboot_pending: set[str] = field(default_factory=set)
    # host -> stage -> "ok" | "changed" | "failed" | "unreachable"
    stages: dict[str, dict[str, str]] = field(default_factory=dict)
    interrupted: bool = False
    artifact_dir: Path | None = None

    def failed_hosts(self) -> list[str]:
        return sorted(
            {f.host for f in self.failures} | {h for h, s in self.stats.items() if s.failed or s.unreachable}
        )


_STAGE_RANK = {"ok": 0, "changed": 1, "failed": 2, "unreachable": 3}


# What ansible.builtin.command says of any command that exits non-zero: the command's own last words
# (its stderr) say more.
_COMMAND_FAILED = "non-zero return code"


def _message(res: dict[str, Any]) -> str:
    """The most useful one-line reason from a task result."""
    keys = ("msg", "stderr", "module_stderr", "stdout", "reason")
    if res.get("msg") == _COMMAND_FAILED and any(str(res.get(k) or "").strip() for k in ("stderr", "stdout")):
        rc = res.get("rc")
        detail = _message({k: res[k] for k in ("stderr", "stdout") if k in res})
        return (f"exit {rc}: {detail}" if isinstance(rc, int) else detail)[:400]
    for key in keys:
        value = res.get(key)
        if isinstance(value, str) and value.strip():
            lines = [line for line in value.strip().splitlines() if line.strip()]
            text = lines[-1] if key in ("stderr", "module_stderr") and lines else lines[0]
            return text.strip()[:400]
    if res.get("results"):  # loop results: the first failed item's reason
        for item in res["results"]:
            if isinstance(item, dict) and item.get("failed"):
                return _message(item)
    return ""


MAX_DIFF_LINES = 200


def _diff_text(res: dict[str, Any]) -> str:
    """A task result's `diff` (Ansible's before/after pairs or a module's prepared text) as one unified
    diff, cut at MAX_DIFF_LINES. Host text: the caller shows it escaped."""
    import difflib

    diffs = res.get("diff")
    if diffs is None and isinstance(res.get("results"), list):
        return _loop_diff_text(res["results"])
    if isinstance(diffs, dict):
        diffs = [diffs]
    if not isinstance(diffs, list):
        return ""
    out: list[str] = []
    for d in diffs:
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("prepared"), str):
            out.extend(d["prepared"].rstrip("\n").splitlines())
            continue
        before, after = d.get("before"), d.get("after")
        if before is None and after is None:
            continue
        if not isinstance(before, str) or not isinstance(after, str):
            import json

            before = json.dumps(before, indent=2, sort_keys=True, default=str) if before is not None else ""
            after = json.dumps(after, indent=2, sort_keys=True, default=str) if after is not None else ""
        out.extend(
            line.rstrip("\n")
            for line in difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                str(d.get("before_header") or "before"),
                str(d.get("after_header") or "after"),
            )
        )
    if len(out) > MAX_DIFF_LINES:
        out = [*out[:MAX_DIFF_LINES], f"... ({len(out) - MAX_DIFF_LINES} more lines in the run record)"]
    return "\n".join(out)


def _loop_diff_text(results: list[Any]) -> str:
    """A loop's changed items, each under a line naming it, with the item's own diff."""
    out: list[str] = []
    for r in results:
        if not isinstance(r, dict) or not r.get("changed"):
            continue
        label = r.get("_ansible_item_label", r.get("item", ""))
        out.append(f"== {label if isinstance(label, str) else json.dumps(label, default=str)}")
        text = _diff_text({k: v for k, v in r.items() if k != "results"})
        if text:
            out.extend(text.splitlines())
    if len(out) > MAX_DIFF_LINES:
        out = [*out[:MAX_DIFF_LINES], f"... ({len(out) - MAX_DIFF_LINES} more lines in the run record)"]
    return "\n".join(out)


class _EventSink:
    """Turns raw runner events into the typed result while the playbook runs."""

    def __init__(self, result: PlaybookResult, on_event: Callable[[Event], None] | None) -> None:
        self.result = result
        self.on_event = on_event
        self.play: str | None = None
        self.lock = threading.Lock()

    def _stage(self, data: dict[str, Any]) -> str | None:
        if self.play in STAGE_NAMES:
            return self.play
        role = data.get("role")
        return role if role in STAGE_NAMES else self.play

    def __call__(self, raw: dict[str, Any]) -> bool:
        kind = raw.get("event", "")
        data = raw.get("event_data") or {}
        with self.lock:
            if kind == "playbook_on_play_start":
                self.play = data.get("play") or data.get("name")
                self._emit(Event("play_start", None, self.play, None))
            elif kind == "playbook_on_stats":
                self._stats(data)
            elif kind.startswith("runner_on_") or kind == "runner_item_on_failed":
                self._host_event(kind, data)
        return True  # keep the event on disk too (the run record)

    def _host_event(self, kind: str, data: dict[str, Any]) -> None:
        host = data.get("host")
        if not host:
            return
        res = data.get("res") or {}
        stage = self._stage(data)
        task = data.get("task")
        changed = bool(res.get("changed"))
        outcome = {
            "runner_on_ok": "changed" if changed else "ok",
            "runner_on_failed": None if data.get("ignore_errors") else "failed",
            "runner_on_unreachable": "unreachable",
        }.get(kind)
        if outcome and stage:
            per_host = self.result.stages.setdefault(host, {})
            if _STAGE_RANK[outcome] >= _STAGE_RANK.get(per_host.get(stage, "ok"), 0):
                per_host[stage] = outcome
        message = ""
        if outcome in ("failed", "unreachable"):
            message = _message(res)
            self.result.failures.append(
                Failure(host, stage, task, message, unreachable=outcome == "unreachable")
            )
        facts: dict[str, Any] = {}
        if kind == "runner_on_ok":
            # Progress travels as facts the playbooks set (never as task names); only gpuprov's own are
            # kept, as a fact-gathering result holds hundreds.
            got = res.get("ansible_facts") or {}
            facts = {k: v for k, v in got.items() if k in PROGRESS_FACTS}
            if got.get(REBOOT_PENDING_FACT) is True or str(got.get(REBOOT_PENDING_FACT)).lower() == "true":
                self.result.reboot_pending.add(host)
        diff = _diff_text(res) if changed else ""
        if changed and not diff and isinstance(res.get("msg"), str):
            diff = res["msg"]  # a changed task without a diff says what it did (or would do) in words
        self._emit(Event(kind, host, stage, task, changed, message, facts, diff))

    def _stats(self, data: dict[str, Any]) -> None:
        keys = {
            "ok": "ok",
            "changed": "changed",
            "failures": "failed",
            "dark": "unreachable",
            "skipped": "skipped",
            "rescued": "rescued",
            "ignored": "ignored",
        }
        for src, attr in keys.items():
            for host, count in (data.get(src) or {}).items():
                stats = self.result.stats.setdefault(host, HostStats(host))
                setattr(stats, attr, int(count))
        for host in data.get("processed") or {}:
            self.result.stats.setdefault(host, HostStats(host))

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)


def ansible_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The Ansible settings gpuprov runs with; raw `ansible-playbook` gets the same from ansible.cfg."""
    env = {
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_ROLES_PATH": str(ROLES_DIR),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
    }
    env.update(extra or {})
    return env


# What of the caller's environment a run record keeps (ansible-runner stores the whole of it next to the
# command it ran): what explains how Ansible ran, never the tokens and keys a shell may hold.
RECORDED_ENV = re.compile(
    r"(ANSIBLE_\w+|PATH|HOME|USER|LOGNAME|LANG|LC_\w+|TERM|SSH_AUTH_SOCK|PYTHONUNBUFFERED"
    r"|(?i:https?_proxy|no_proxy|all_proxy))"
)


def _scrub_recorded_env(artifacts: Path) -> None:
    """Drop every variable the allow-list does not name from ansible-runner's stored command files."""
    for command in artifacts.glob("*/command"):
        try:
            doc = json.loads(command.read_text())
        except (OSError, ValueError):
            continue
        env = doc.get("env")
        if not isinstance(env, dict):
            continue
        kept = {k: v for k, v in env.items() if RECORDED_ENV.fullmatch(k)}
        doc["env"] = kept
        doc["env_dropped"] = len(env) - len(kept)
        records.write_json(command, doc)


def ansible_playbook_binary() -> str:
    """ansible-playbook from the same environment as this Python (a venv need not be on PATH)."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.exists():
        return str(beside)
    found = shutil.which("ansible-playbook")
    if found is None:
        raise GpuprovError(
            "ansible-playbook not found (install gpuprov with its dependencies: scripts/setup.sh)"
        )
    return found


def _path_with(directory: Path) -> str:
    current = os.environ.get("PATH", "")
    return current if str(directory) in current.split(os.pathsep) else f"{directory}{os.pathsep}{current}"


def run_playbook(
    playbook: Path,
    inventory: Path,
    *,
    record_dir: Path,
    limit: str | None = None,
    hosts: Sequence[str] | None = None,
    tags: list[str] | None = None,
    check: bool = False,
    forks: int = 20,
    extravars: dict[str, Any] | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> PlaybookResult:
    """Run one playbook; Ctrl-C cancels it cleanly (result.interrupted) instead of raising. `hosts`
    restricts it to exactly those inventory hosts: they go to Ansible as a limit file (one name per
    line), never joined into a pattern, where a ',' or ':' in a name would select other hosts."""
    import ansible_runner

    private = record_dir / "runner"
    private.mkdir(parents=True, exist_ok=True)
    if hosts is not None:
        if limit is not None:
            raise ValueError("run_playbook: limit and hosts are exclusive")
        limit_file = record_dir / "limit-hosts.txt"
        limit_file.write_text("".join(f"{h}\n" for h in hosts))
        limit = f"@{limit_file.resolve()}"
    result = PlaybookResult(status="error", rc=-1, artifact_dir=private / "artifacts")
    sink = _EventSink(result, on_event)
    cancel = threading.Event()

    previous = None
    if threading.current_thread() is threading.main_thread():

        def _on_sigint(signum: int, frame: Any) -> None:
            cancel.set()

        previous = signal.signal(signal.SIGINT, _on_sigint)
    cmdline = "--check --diff" if check else None
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private),
            playbook=str(playbook.resolve()),
            inventory=str(Path(inventory).resolve()),
            limit=limit,
            tags=",".join(tags) if tags else None,
            forks=forks,
            cmdline=cmdline,
            extravars=extravars or {},
            envvars=ansible_env({"PATH": _path_with(Path(ansible_playbook_binary()).parent)}),
            event_handler=sink,
            cancel_callback=cancel.is_set,
            suppress_env_files=True,
            quiet=True,
            ident="run",
        )
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        _scrub_recorded_env(private / "artifacts")
        records.make_private(record_dir)
    result.status = str(runner.status)
    result.rc = int(runner.rc) if runner.rc is not None else -1
    result.interrupted = cancel.is_set() or result.status == "canceled"
    if not result.stats and not result.failures and not result.interrupted and result.status != "successful":
        # Ansible never got as far as a host: say why instead of reporting zero hosts.
        stdout = private / "artifacts" / "run" / "stdout"
        tail = stdout.read_text(errors="replace").strip().splitlines()[-5:] if stdout.is_file() else []
        raise GpuprovError(f"ansible-playbook did not run ({result.status}): " + " | ".join(tail))
    records.write_json(record_dir / "stats.json", {h: s.as_dict() for h, s in sorted(result.stats.items())})
    return result
