"""The orchestration: a plan run wave by wave against a fleet, every step recorded in the state.

Per wave: probe the hosts → each prepared in parallel (the client's `_prepare`: usually cordon and
drain) → the change on the hosts that are ready (`_change`) → probe again → each verified and put back
(`_complete`). Canaries first; no new wave starts once failures exceed --max-fail. The client decides
what a host goes through; the engine keeps the waves, the failure budget, --pause, Ctrl-C and the state.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from provisioner import records
from provisioner.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, GpuprovError
from provisioner.rollout.model import (
    OPERAND_LABEL_PREFIX,
    OPERANDS_LABEL,
    ChangeOutcome,
    Fleet,
    HostProbe,
    NodeInfo,
    ProgressFn,
    StepFailed,
    not_this_host,
)
from provisioner.rollout.plan import Plan
from provisioner.rollout.state import (
    CHANGED,
    CORDONING,
    DRAINING,
    FAILED,
    INTERRUPTED,
    NOT_STARTED,
    PENDING,
    REBOOT_PENDING,
    SKIPPED,
    UNCORDONING,
    VERIFYING,
    ChangeKind,
    HostState,
    RolloutState,
)


class Settings(Protocol):
    """The options the engine itself reads; each client's options have these among theirs."""

    pause: bool  # ask before each wave after the first
    max_fail: int
    drain: bool  # drain the node, or evict only the pods that use GPUs
    drain_timeout: float


@dataclass(frozen=True)
class NodeLookup:
    info: NodeInfo | None  # None: no such node, or the host ended
    name: str  # the name looked up
    ended: bool = False  # the host failed and has its result


@dataclass
class RolloutOutcome:
    status: str  # finished | stopped | interrupted | paused
    reason: str = ""


class _Interrupted(Exception):
    """Raised inside a host's work once the run is interrupted."""


FleetT = TypeVar("FleetT", bound=Fleet)
SettingsT = TypeVar("SettingsT", bound=Settings)


class Rollout(ABC, Generic[FleetT, SettingsT]):
    """Runs a plan wave by wave against a fleet, recording every step in the state.

    A client subclasses it with the host steps of its change: `_prepare`, `_change` and `_complete`,
    built from the node handling here (cordon and drain, operands paused, the node put back or left
    cordoned with the reason)."""

    DONE: ClassVar[str]  # how the client's progress says a host got its change ("upgraded")
    PROBE: ClassVar[type[HostProbe]] = HostProbe  # the client's probe, for a host that could not be probed

    def __init__(
        self,
        fleet: FleetT,
        state: RolloutState,
        plan: Plan,
        options: SettingsT,
        progress: ProgressFn | None = None,
        confirm: Callable[[str], bool] | None = None,
    ) -> None:
        self.fleet = fleet
        self.state = state
        self.plan = plan
        self.opt = options
        self.progress = progress or (lambda host, text: None)
        self.confirm = confirm
        self.interrupted = threading.Event()

    # -- the client's host steps

    @abstractmethod
    def _prepare(self, host: str, probe: HostProbe) -> bool:
        """From the probe to ready for the change (True), or the host ended here."""

    @abstractmethod
    def _change(self, hosts: list[str]) -> Mapping[str, ChangeOutcome]:
        """The change itself on the wave's prepared hosts."""

    @abstractmethod
    def _complete(self, host: str, after: HostProbe) -> bool:
        """Verify the changed host from its new probe; put its node back, or leave it cordoned."""

    def _hold_before(self, wave: list[str]) -> str | None:
        """Why the next wave must not start (a client's circuit breaker), or None: it may."""
        return None

    # -- control

    def interrupt(self) -> None:
        """Ctrl-C: no new step starts; remote work in progress is aborted by the fleet."""
        if not self.interrupted.is_set():
            self.interrupted.set()
            self.progress(None, "interrupted: stopping after the steps in progress; state is recorded")
            with contextlib.suppress(Exception):
                self.fleet.interrupt()

    def _check(self) -> None:
        if self.interrupted.is_set():
            raise _Interrupted()

    # -- the run

    def run(self) -> RolloutOutcome:
        waves = self.plan.waves
        failures = 0
        outcome = RolloutOutcome("finished")
        started_waves = 0
        for index, wave in enumerate(waves):
            todo = [h for h in wave if not self.state.hosts[h].done]
            if not todo:
                continue
            label = self._label(index)
            if self.interrupted.is_set():
                outcome = RolloutOutcome("interrupted", "interrupted")
                break
            held = self._hold_before(todo)
            if held:
                outcome = RolloutOutcome("stopped", held)
                break
            if self.opt.pause and started_waves and self.confirm is not None:
                question = f"continue with {label} ({', '.join(todo)})?"
                if not self.confirm(question):
                    outcome = RolloutOutcome("paused", f"not confirmed before {label}")
                    break
            started_waves += 1
            self.progress(None, f"── {label}: {', '.join(todo)}")
            self._run_wave(todo)
            if self.interrupted.is_set():
                outcome = RolloutOutcome("interrupted", f"interrupted during {label}")
                break
            failed = [h for h in todo if self.state.hosts[h].result == FAILED]
            failures += len(failed)
            rest = any(not self.state.hosts[h].done for w in waves[index + 1 :] for h in w)
            if failed and self.plan.canary and index == 0:
                outcome = RolloutOutcome("stopped", f"canary failed: {', '.join(failed)}")
                break
            if failures > self.opt.max_fail and rest:
                outcome = RolloutOutcome(
                    "stopped", f"{failures} host(s) failed, more than --max-fail {self.opt.max_fail}"
                )
                break
        for host, s in self.state.hosts.items():
            if s.result is None:
                if s.step == PENDING:
                    self.state.finish(host, NOT_STARTED, f"not started: {outcome.reason}")
                else:  # cannot happen unless a wave ended early; recorded so that resume redoes it
                    self.state.finish(host, INTERRUPTED, f"stopped at {s.step}: {outcome.reason}")
        if outcome.status != "finished":
            self.progress(None, f"stopped: {outcome.reason}")
        return outcome

    def _label(self, index: int) -> str:
        if self.plan.canary:
            return "canary" if index == 0 else f"batch {index} of {len(self.plan.batches)}"
        return f"batch {index + 1} of {len(self.plan.batches)}"

    def _parallel(self, hosts: Sequence[str], work: Callable[[str], Any]) -> dict[str, Any]:
        """Run `work` per host on threads; the main thread keeps waking up so Ctrl-C is seen."""
        if len(hosts) == 1:
            return {hosts[0]: work(hosts[0])}
        with ThreadPoolExecutor(max_workers=min(len(hosts), 64), thread_name_prefix="gpuprov-wave") as pool:
            futures = {pool.submit(work, h): h for h in hosts}
            pending = set(futures)
            while pending:
                _, pending = wait_futures(pending, timeout=0.5)
            return {futures[f]: f.result() for f in futures}

    def _carry_on(self, hosts: list[str]) -> bool:
        """Whether the wave goes on to its next step with `hosts`: not with none, nor once the run is
        interrupted (they end as interrupted)."""
        if not hosts:
            return False
        if self.interrupted.is_set():
            for h in hosts:
                self._end_interrupted(h)
            return False
        return True

    def _run_wave(self, hosts: list[str]) -> None:
        for h in hosts:
            self.state.start(h)
            self.progress(h, "probing")
        probes = self._guard_probe(hosts)
        ready_flags = self._parallel(hosts, lambda h: self._guard(h, lambda: self._prepare(h, probes[h])))
        ready = [h for h in hosts if ready_flags.get(h)]
        if not self._carry_on(ready):
            return
        results = self._change(ready)
        verify: list[str] = []
        for h in ready:
            res = results.get(h) or ChangeOutcome("failed", "no result for this host")
            if res.result == "ok":
                verify.append(h)
            elif res.result == "interrupted":
                self.interrupted.set()
                self._end_interrupted(h)
            elif res.result == "reboot-pending":
                self._leave_cordoned(h, REBOOT_PENDING, res.reason)
            else:
                self._leave_cordoned(h, FAILED, res.reason)
        if not self._carry_on(verify):
            return
        for h in verify:
            self._step(h, VERIFYING)
        after = self._guard_probe(verify)
        self._parallel(verify, lambda h: self._guard(h, lambda: self._complete(h, after[h])))

    def _guard_probe(self, hosts: list[str]) -> dict[str, HostProbe]:
        try:
            probes = self.fleet.probe(hosts)
        except GpuprovError as exc:
            probes = {}
            reason = str(exc)
        else:
            reason = "no probe result"
        return {h: probes.get(h) or self.PROBE(h, error=reason) for h in hosts}

    def _guard(self, host: str, work: Callable[[], bool | None]) -> bool:
        """A host's work: an interruption or an unexpected error ends that host, never the run."""
        try:
            return bool(work())
        except _Interrupted:
            self._end_interrupted(host)
        except StepFailed as exc:  # a step without its own handling
            self._end(host, FAILED, exc.reason)
        except Exception as exc:
            if self.interrupted.is_set():
                self._end_interrupted(host)
            else:
                self._end(
                    host,
                    FAILED,
                    f"internal error at {self.state.hosts[host].step}: {type(exc).__name__}: {exc}",
                )
        return False

    # -- one host

    def _step(self, host: str, step: str) -> None:
        self.state.step(host, step)
        self.progress(host, step)

    def _on_step(self, host: str, step: str) -> None:
        """Steps the fleet reports while it makes the change (from a playbook's events, say)."""
        s = self.state.hosts.get(host)
        if s is None or s.result is not None or step == s.step:
            return
        try:
            self._step(host, step)
        except GpuprovError as exc:
            self.progress(host, f"(step {step} out of order: {exc})")

    def _end(self, host: str, result: str, reason: str = "") -> None:
        if self.state.hosts[host].result is not None:
            return
        self.state.finish(host, result, reason)
        s = self.state.hosts[host]
        what = {
            CHANGED: f"{self.DONE} {s.before or '?'} → {s.after or '?'}",
            SKIPPED: "skipped",
            FAILED: "FAILED",
            REBOOT_PENDING: "REBOOT PENDING",
            INTERRUPTED: f"interrupted at {s.step}",
        }.get(result, result)
        self.progress(host, f"{what}{': ' + reason if reason else ''} ({s.duration_s:.1f} s)")

    def _end_interrupted(self, host: str) -> None:
        s = self.state.hosts[host]
        note = "; node left cordoned" if s.cordoned_by_us else ""
        self._end(host, INTERRUPTED, f"interrupted at {s.step}{note}")

    def _keep_baseline(self, host: str, probe: HostProbe) -> None:
        """The first attempt's probe stays the reference for verification (what the host had before the
        change began), also in a resumed attempt after a reboot or a failed change."""
        if self.state.hosts[host].baseline is None:
            self.state.update(host, baseline=probe.to_dict())

    def _lookup_node(
        self, host: str, probe: HostProbe, untouched: str, default: str | None = None
    ) -> NodeLookup:
        """The host's node from the cluster, proven to be this host (`not_this_host`) and recorded in the
        state. `lookup.ended`: the host failed here, `untouched` saying what was not done to it;
        `lookup.info` None (not ended): the cluster has no node of that name. `default` names the node
        when the host's hostname cannot be read."""
        s = self.state.hosts[host]
        kube = self.fleet.kube
        assert kube is not None
        name = s.node or probe.node or default
        if name is None or (probe.node_error and not s.node):
            self._end(host, FAILED, f"{probe.node_error or 'no node name'}: {untouched}")
            return NodeLookup(None, name or host, ended=True)
        try:
            info = kube.node(name)
        except StepFailed as exc:
            self._check()
            self._end(host, FAILED, f"control plane: {exc.reason}")
            return NodeLookup(None, name, ended=True)
        if info is None:
            return NodeLookup(None, name)
        stranger = not_this_host(info, probe)
        if stranger:
            self._end(host, FAILED, f"node {info.name} {stranger}: {untouched}")
            return NodeLookup(None, name, ended=True)
        self.state.update(host, node=info.name)
        return NodeLookup(info, info.name)

    def _require_node(self, host: str, probe: HostProbe, untouched: str, needed: str) -> NodeInfo | None:
        """The host's node (`_lookup_node`) for a change that cannot go without one: None when the host
        ended here, `needed` saying why a node was needed when the cluster has none of that name."""
        found = self._lookup_node(host, probe, untouched)
        if not found.ended and found.info is None:
            self._end(host, FAILED, f"no Kubernetes node {found.name}: {needed}")
        return found.info

    def _cordon_and_drain(self, host: str, node: str, unschedulable: bool) -> bool:
        """Cordon (remembering whether someone else had), then drain or evict the GPU pods only. False: the
        host failed and the node is back as it was."""
        s = self.state.hosts[host]
        kube = self.fleet.kube
        assert kube is not None
        if s.was_cordoned is None:
            self.state.update(host, was_cordoned=unschedulable)
        self._step(host, CORDONING)
        try:
            kube.cordon(node)
        except StepFailed as exc:
            self._check()
            self._release(host, node, "cordon", exc.reason)
            return False
        self.state.update(host, cordoned_by_us=not s.was_cordoned)
        self._check()
        self._step(host, DRAINING)
        try:
            if self.opt.drain:
                kube.drain(node, self.opt.drain_timeout)
            else:
                kube.evict_gpu_pods(node, self.opt.drain_timeout)
        except StepFailed as exc:
            if self.interrupted.is_set():
                raise _Interrupted() from None
            self._release(host, node, "drain" if self.opt.drain else "GPU pod eviction", exc.reason)
            return False
        return True

    def _pause_operands(self, host: str, info: NodeInfo, timeout: float) -> bool:
        """Take the GPU Operator's operands off the node and wait for their pods to go. Their deploy labels
        are recorded first (None: the operands label was absent), so that the node gets them back as they
        were, also from a resumed run. False: the host failed and the node is back as it was."""
        s = self.state.hosts[host]
        kube = self.fleet.kube
        assert kube is not None
        deploy = {k: v for k, v in info.labels.items() if k.startswith(OPERAND_LABEL_PREFIX)}
        if deploy and deploy.get(OPERANDS_LABEL) != "false" and not s.paused_labels:
            self.state.update(host, paused_labels={OPERANDS_LABEL: None, **deploy})
        if not s.paused_labels:
            return True
        try:
            kube.set_labels(info.name, {OPERANDS_LABEL: "false"})
            self.progress(host, "GPU Operator operands taken off the node; waiting for their pods to go")
            kube.wait_operands_gone(info.name, timeout)
        except StepFailed as exc:
            if self.interrupted.is_set():
                raise _Interrupted() from None
            self._step(host, UNCORDONING)
            self._release(host, info.name, "stopping the GPU Operator's operands", exc.reason)
            return False
        return True

    def _release(self, host: str, node: str, what: str, why: str) -> None:
        """The host failed before anything on it changed: put the node back as it was, then fail it."""
        s = self.state.hosts[host]
        if s.step != UNCORDONING:
            self._step(host, UNCORDONING)
        problems = self._put_back(host, node)
        reason = f"{what}: {why}; the host was not touched"
        if problems:
            reason += f" ({'; '.join(problems)})"
        self._end(host, FAILED, reason)

    def _put_back(self, host: str, node: str, uncordon: bool = True) -> list[str]:
        """Restore the operand labels we paused and uncordon (when we cordoned): what did not work."""
        kube = self.fleet.kube
        assert kube is not None
        s = self.state.hosts[host]
        problems: list[str] = []
        if s.paused_labels:
            before = dict(s.paused_labels)
            try:
                # The operands switch first, then the state labels as recorded: the operator may add
                # defaults in between, and a value set afterwards is one it keeps.
                kube.set_labels(node, {OPERANDS_LABEL: before.pop(OPERANDS_LABEL, None)})
                kube.set_labels(node, before)
                self.state.update(host, paused_labels={})
            except StepFailed as exc:
                problems.append(f"operand labels not restored: {exc.reason}")
        if s.cordoned_by_us and uncordon:
            try:
                kube.uncordon(node)
                self.state.update(host, cordoned_by_us=False)
            except StepFailed as exc:
                problems.append(f"uncordon failed: {exc.reason}")
        with contextlib.suppress(StepFailed):
            kube.annotate(node, None)
        return problems

    def _leave_cordoned(self, host: str, result: str, reason: str) -> None:
        """The host was changed and is not right: it stays out of scheduling, annotated with why."""
        s = self.state.hosts[host]
        if s.node and self.fleet.kube is not None:
            with contextlib.suppress(StepFailed):
                self.fleet.kube.annotate(s.node, f"{result}: {reason}"[:250])
        self._end(host, result, reason)


@contextlib.contextmanager
def sigint_to(rollout: Rollout[Any, Any]) -> Iterator[None]:
    """First Ctrl-C: stop cleanly (state recorded, exit 3). A second one: stop at once.

    SIGTERM (a service manager, `timeout`) is taken as Ctrl-C, so that it too cancels a wave's playbook
    run (whose runner listens for SIGINT) instead of leaving ansible-playbook behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if rollout.interrupted.is_set():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        rollout.interrupt()

    def on_term(signum: int, frame: Any) -> None:
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, handler)
    previous_term = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


# ------------------------------------------------------------------------------ a run, start to end


def begin_new_run(
    record_dir: Path,
    kind: ChangeKind,
    *,
    inventory: str,
    limit: str | None,
    options: Mapping[str, Any],
    plan: Plan,
    hosts: Sequence[str],
    skipped: Mapping[str, Mapping[str, Any]],
    progress: ProgressFn,
) -> RolloutState:
    """A new run's record: what was asked (command.json), its state file, its skipped hosts."""
    hosts = list(hosts)
    records.write_json(
        record_dir / "command.json",
        {"verb": kind.verb, "inventory": inventory, "limit": limit, "options": dict(options), "hosts": hosts},
    )
    state = RolloutState.create(
        record_dir, kind, inventory=inventory, options=dict(options), plan=plan.to_dict(), hosts=hosts
    )
    start_or_resume(state, plan, skipped, progress)
    progress(None, f"record {record_dir}")
    return state


def start_or_resume(
    state: RolloutState,
    plan: Plan,
    skipped: Mapping[str, Mapping[str, Any]] | None,
    progress: ProgressFn,
) -> None:
    """A new run records its skipped hosts (`skipped`: host → the state fields it had); a resumed one
    (`skipped` None) reopens every host that did not finish well."""
    if skipped is None:
        for name in state.hosts:
            state.reopen(name)
        return
    for name, fields in skipped.items():
        reason = plan.hosts[name].reason
        state.start(name)
        state.update(name, **fields)
        state.finish(name, SKIPPED, reason)
        progress(name, f"skipped: {reason}")


def execute(rollout: Rollout[Any, Any], resumed: bool) -> RolloutOutcome:
    """Run the rollout as one invocation of its record, Ctrl-C and SIGTERM taken as a clean stop."""
    rollout.state.begin_invocation(resumed=resumed)
    with sigint_to(rollout):
        outcome = rollout.run()
    rollout.state.end_invocation(outcome.status, outcome.reason)
    return outcome


def host_row(
    name: str, s: HostState, *, result: str | None, to: str | None, cordoned: bool
) -> dict[str, Any]:
    """A host's line of the summary."""
    return {
        "host": name,
        "from": s.before,
        "to": to,
        "result": result,
        "reason": s.reason,
        "duration_s": round(s.duration_s, 1),
        "step": s.step,
        "node": s.node,
        "cordoned": cordoned,
        "attempts": s.attempts,
    }


def summary(
    state: RolloutState, outcome: RolloutOutcome, target: str, said: Callable[[HostState], Mapping[str, Any]]
) -> dict[str, Any]:
    """The run's summary (stdout and summary.json): its hosts' rows, totals by result, how it ended. A
    host's row is its state's, with what the verb `said` of it: its result, `to` and `cordoned`."""
    hosts = [host_row(name, s, **said(s)) for name, s in state.hosts.items()]
    totals: dict[str, int] = {}
    for h in hosts:
        totals[str(h["result"])] = totals.get(str(h["result"]), 0) + 1
    return {
        "verb": state.kind.verb,
        "inventory": state.doc["inventory"],
        "record": str(state.path.parent),
        "target": target,
        "status": "finished" if outcome.status == "finished" and state.finished else outcome.status,
        "stop_reason": outcome.reason,
        "resumable": not state.finished,
        "hosts": hosts,
        "totals": dict(sorted(totals.items())),
    }


def exit_code(state: RolloutState, outcome: RolloutOutcome) -> int:
    if outcome.status in ("interrupted", "paused"):
        return EXIT_INTERRUPTED
    return EXIT_OK if state.finished else EXIT_FAILED
