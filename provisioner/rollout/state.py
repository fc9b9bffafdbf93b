"""A rolling change's state file, which makes a run resumable.

Each host walks a fixed sequence of steps; every change is written at once (atomically: a crash never
leaves half a file) to `state.json` in the run record. `--resume` reads it back: finished hosts stay
finished, every other host starts again from its probe (each step is idempotent), keeping what only
the first attempt could know (was the node cordoned before we came, which operand labels we paused).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.errors import GpuprovError, InputError

STATE_FILE = "state.json"
FORMAT = 1

# The engine's steps, in order, around the change's own (each client names those: ChangeKind).
PENDING = "pending"
PROBING = "probing"
CORDONING = "cordoning"
DRAINING = "draining"
VERIFYING = "verifying"
UNCORDONING = "uncordoning"

# Results. A host without a result is pending or in progress. CHANGED is written "upgraded", the state
# file's word since the driver upgrade was the only rolling change; each client shows it in its own
# words (mig apply: "applied").
CHANGED = "upgraded"
SKIPPED = "skipped"
FAILED = "failed"
REBOOT_PENDING = "reboot-pending"
NOT_STARTED = "not-started"
INTERRUPTED = "interrupted"
RESULTS = (CHANGED, SKIPPED, FAILED, REBOOT_PENDING, NOT_STARTED, INTERRUPTED)
FINAL_OK = (CHANGED, SKIPPED)


class StateError(GpuprovError):
    """A step change that the state machine does not allow: a bug, never the user's input."""


@dataclass(frozen=True)
class ChangeKind:
    """A kind of rolling change: the verb its records are named by, and its own steps between the drain
    and the verification, each with the steps it may go to. The first is where a host enters the change:
    after the drain, or straight after the probe when there is no node to cordon. `entries` are further
    steps a host may go to from the drain (a change whose hosts start at different steps)."""

    verb: str
    change_steps: Mapping[str, frozenset[str]]
    entries: frozenset[str] = frozenset()

    @cached_property
    def next_steps(self) -> dict[str, frozenset[str]]:
        """Where a host can go from each step (a result may end any step; see RESULTS)."""
        first = next(iter(self.change_steps))
        return {
            PENDING: frozenset({PROBING}),
            # At the target already after an earlier attempt: from the probe straight to verifying.
            PROBING: frozenset({CORDONING, first, VERIFYING}),
            CORDONING: frozenset({DRAINING, UNCORDONING}),
            DRAINING: frozenset({first, UNCORDONING, *self.entries}),
            **self.change_steps,
            VERIFYING: frozenset({UNCORDONING}),
            UNCORDONING: frozenset(),
        }

    @property
    def steps(self) -> tuple[str, ...]:
        return tuple(self.next_steps)


@dataclass
class HostState:
    host: str
    step: str = PENDING
    result: str | None = None
    reason: str = ""
    # What the host had and is to have, in the client's words (a driver version, a MIG layout); `after`
    # becomes what it has once verified.
    before: str | None = None
    after: str | None = None
    node: str | None = None  # Kubernetes node name, when the host is a node
    was_cordoned: bool | None = None  # unschedulable before this run first touched it
    cordoned_by_us: bool = False  # we cordoned it and have not uncordoned it yet
    # GPU Operator deploy labels before the operands were taken off the node (None: label absent)
    paused_labels: dict[str, str | None] = field(default_factory=dict)
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    duration_s: float = 0.0  # summed over attempts
    baseline: dict[str, Any] | None = None  # the probe (HostProbe.to_dict()) of the first attempt
    history: list[list[Any]] = field(default_factory=list)  # [step or result, unix time]

    @property
    def done(self) -> bool:
        return self.result in FINAL_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "result": self.result,
            "reason": self.reason,
            "from": self.before,
            "to": self.after,
            "node": self.node,
            "was_cordoned": self.was_cordoned,
            "cordoned_by_us": self.cordoned_by_us,
            "paused_labels": self.paused_labels,
            "attempts": self.attempts,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": round(self.duration_s, 3),
            "before": self.baseline,
            "history": self.history,
        }

    @classmethod
    def from_dict(cls, host: str, doc: Mapping[str, Any], steps: tuple[str, ...]) -> HostState:
        step = doc.get("step", PENDING)
        result = doc.get("result")
        if step not in steps or (result is not None and result not in RESULTS):
            raise InputError(f"{STATE_FILE}: host {host}: unknown step {step!r} or result {result!r}")
        return cls(
            host=host,
            step=step,
            result=result,
            reason=str(doc.get("reason") or ""),
            before=doc.get("from"),
            after=doc.get("to"),
            node=doc.get("node"),
            was_cordoned=doc.get("was_cordoned"),
            cordoned_by_us=bool(doc.get("cordoned_by_us")),
            paused_labels=dict(doc.get("paused_labels") or {}),
            attempts=int(doc.get("attempts") or 0),
            started_at=doc.get("started_at"),
            finished_at=doc.get("finished_at"),
            duration_s=float(doc.get("duration_s") or 0.0),
            baseline=doc.get("before"),
            history=[list(x) for x in doc.get("history") or []],
        )


class RolloutState:
    """The run's state, shared by the worker threads; every change is saved before the call returns."""

    def __init__(
        self, path: Path, doc: dict[str, Any], hosts: dict[str, HostState], kind: ChangeKind
    ) -> None:
        self.path = path
        self.doc = doc
        self.hosts = hosts
        self.kind = kind
        self._lock = threading.RLock()

    # -- creation and loading

    @classmethod
    def create(
        cls,
        record: Path,
        kind: ChangeKind,
        *,
        inventory: str,
        options: dict[str, Any],
        plan: dict[str, Any],
        hosts: list[str],
    ) -> RolloutState:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "verb": kind.verb,
            "inventory": inventory,
            "record": str(record),
            "options": options,
            "plan": plan,
            "status": "running",
            "invocations": [],
        }
        state = cls(record / STATE_FILE, doc, {h: HostState(h) for h in hosts}, kind)
        state.save()
        return state

    @classmethod
    def load(cls, record: Path, kind: ChangeKind) -> RolloutState:
        path = record / STATE_FILE
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise InputError(f"{path}: no upgrade state in this run record") from exc
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: unreadable upgrade state: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("verb") != kind.verb:
            raise InputError(f"{path}: not a {kind.verb} state file of format {FORMAT}")
        hosts = {h: HostState.from_dict(h, d, kind.steps) for h, d in (doc.pop("hosts", None) or {}).items()}
        return cls(path, doc, hosts, kind)

    def save(self) -> None:
        with self._lock:
            doc = dict(self.doc)
            doc["hosts"] = {h: s.to_dict() for h, s in self.hosts.items()}
            records.write_json(self.path, doc)

    # -- the run

    @property
    def finished(self) -> bool:
        return all(s.done for s in self.hosts.values())

    def begin_invocation(self, resumed: bool) -> None:
        with self._lock:
            self.doc["status"] = "running"
            self.doc["invocations"].append(
                {"started_at": time.time(), "pid": os.getpid(), "resumed": resumed, "ended_at": None}
            )
            self.save()

    def end_invocation(self, status: str, why: str = "") -> None:
        with self._lock:
            self.doc["status"] = "finished" if self.finished and status == "finished" else status
            self.doc["stop_reason"] = why
            if self.doc["invocations"]:
                self.doc["invocations"][-1]["ended_at"] = time.time()
                self.doc["invocations"][-1]["status"] = self.doc["status"]
            self.save()

    # -- host steps

    def start(self, host: str) -> None:
        """A (new) attempt on the host: back to the probe, keeping what earlier attempts learnt."""
        with self._lock:
            s = self.hosts[host]
            s.attempts += 1
            s.step = PROBING
            s.result = None
            s.reason = ""
            s.started_at = time.time()
            s.finished_at = None
            s.history.append([PROBING, s.started_at])
            self.save()

    def reopen(self, host: str) -> None:
        """Resume: a host that did not finish well is worked on again (finished hosts stay as they are)."""
        with self._lock:
            s = self.hosts[host]
            if s.done or (s.result is None and s.step == PENDING):
                return
            s.history.append(["reopened", time.time(), s.result, s.reason])
            s.result = None
            s.step = PENDING
            self.save()

    def step(self, host: str, step: str) -> None:
        with self._lock:
            s = self.hosts[host]
            if s.result is not None:
                raise StateError(f"{host}: step {step} after the host ended ({s.result})")
            if step == s.step:
                return
            if step not in self.kind.next_steps.get(s.step, frozenset()):
                raise StateError(f"{host}: cannot go from {s.step} to {step}")
            s.step = step
            s.history.append([step, time.time()])
            self.save()

    def update(self, host: str, **fields: Any) -> None:
        with self._lock:
            s = self.hosts[host]
            for key, value in fields.items():
                if not hasattr(s, key) or key in ("step", "result", "history"):
                    raise StateError(f"{host}: {key} is not a host state field")
                setattr(s, key, value)
            self.save()

    def finish(self, host: str, result: str, reason: str = "") -> None:
        with self._lock:
            if result not in RESULTS:
                raise StateError(f"{host}: unknown result {result}")
            s = self.hosts[host]
            now = time.time()
            s.result = result
            s.reason = reason
            if s.started_at is not None and result != NOT_STARTED:
                s.finished_at = now
                s.duration_s += now - s.started_at
            s.history.append([result, now])
            self.save()


# ------------------------------------------------------------------------------------ finding runs


def run_records(verb: str) -> Iterator[Path]:
    base = records.runs_dir()
    if not base.is_dir():
        return
    yield from sorted((p for p in base.glob(f"*-{verb}*") if (p / STATE_FILE).is_file()), reverse=True)


def latest_for(inventory: str, verb: str) -> Path | None:
    """The newest record of this inventory's rolling runs of `verb` (finished or not)."""
    for path in run_records(verb):
        try:
            doc = json.loads((path / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("inventory") == inventory:
            return path
    return None


def resumable(inventory: str, kind: ChangeKind) -> Path:
    """The latest run of this kind on this inventory, which must be unfinished; InputError otherwise."""
    verb = kind.verb
    path = latest_for(inventory, verb)
    if path is None:
        raise InputError(f"--resume: no {verb} run recorded for {inventory}")
    if RolloutState.load(path, kind).finished:
        raise InputError(
            f"--resume: the latest {verb} run on {inventory} ({path}) finished; nothing to resume"
        )
    return path


# Every rolling change cordons and drains, so one lock per inventory covers them all; its file is named
# as it was when upgrade-driver was the only one, so that an older gpuprov still sees it.
_LOCK_NAME = "upgrade-driver"


@contextlib.contextmanager
def inventory_lock(inventory: str) -> Iterator[None]:
    """One rolling run at a time per inventory: a second one is refused before it touches anything."""
    locks = records.home() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(inventory.encode()).hexdigest()[:16]
    path = locks / f"{_LOCK_NAME}-{digest}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise InputError(
                f"another rolling run (upgrade-driver or mig apply, pid {holder}) is working on {inventory}; "
                "wait for it or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
