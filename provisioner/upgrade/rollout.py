"""The orchestration: a plan run wave by wave against a fleet, every step recorded in the state."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from provisioner.errors import GpuprovError
from provisioner.mig import CONFIG_LABEL, MIG_OFF, STATE_LABEL
from provisioner.upgrade.model import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_OPERAND_TIMEOUT,
    OPERAND_LABEL_PREFIX,
    OPERANDS_LABEL,
    Fleet,
    InstallOutcome,
    ProgressFn,
    StepFailed,
    not_this_host,
)
from provisioner.upgrade.plan import (
    BatchSize,
    DriverTarget,
    HostProbe,
    Plan,
    judge,
    parse_batch,
    parse_target,
)
from provisioner.upgrade.state import (
    CORDONING,
    DRAINING,
    FAILED,
    INTERRUPTED,
    NOT_STARTED,
    REBOOT_PENDING,
    SKIPPED,
    STOPPING,
    UNCORDONING,
    UPGRADED,
    VERIFYING,
    UpgradeState,
)


@dataclass
class Options:
    target: DriverTarget
    batch: BatchSize
    canary: int = 0
    max_fail: int = 0
    pause: bool = False
    drain: bool = True
    reboot_allowed: bool = False
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    operand_timeout: float = DEFAULT_OPERAND_TIMEOUT
    install_version: str = ""  # the exact version installed (the target, or the pin it resolves to)

    def to_dict(self) -> dict[str, Any]:
        return {
            "to": self.target.text,
            "install_version": self.install_version,
            "batch": str(self.batch),
            "canary": self.canary,
            "max_fail": self.max_fail,
            "pause": self.pause,
            "drain": self.drain,
            "reboot_allowed": self.reboot_allowed,
            "drain_timeout": self.drain_timeout,
            "operand_timeout": self.operand_timeout,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Options:
        return cls(
            target=parse_target(str(doc["to"])),
            batch=parse_batch(str(doc["batch"])),
            canary=int(doc.get("canary") or 0),
            max_fail=int(doc.get("max_fail") or 0),
            pause=bool(doc.get("pause")),
            drain=bool(doc.get("drain", True)),
            reboot_allowed=bool(doc.get("reboot_allowed")),
            drain_timeout=float(doc.get("drain_timeout") or DEFAULT_DRAIN_TIMEOUT),
            operand_timeout=float(doc.get("operand_timeout") or DEFAULT_OPERAND_TIMEOUT),
            install_version=str(doc.get("install_version") or ""),
        )


@dataclass
class RolloutOutcome:
    status: str  # finished | stopped | interrupted | paused
    reason: str = ""


class _Interrupted(Exception):
    """Raised inside a host's work once the run is interrupted."""


class Rollout:
    """Runs a plan wave by wave against a fleet, recording every step in the state.

    The driver upgrade is the change made here; another rolling change (a MIG layout) subclasses it and
    replaces the host steps (_prepare, _install, _complete), keeping the waves, canary, failure budget,
    pause, Ctrl-C handling and the state file."""

    DONE = "upgraded"  # how a host that got the change is reported

    def __init__(
        self,
        fleet: Fleet,
        state: UpgradeState,
        plan: Plan,
        options: Options,
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
        self.before: dict[str, HostProbe] = {}

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
                if s.step == "pending":
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
        with ThreadPoolExecutor(max_workers=min(len(hosts), 64), thread_name_prefix="gpuprov-upg") as pool:
            futures = {pool.submit(work, h): h for h in hosts}
            pending = set(futures)
            while pending:
                _, pending = wait_futures(pending, timeout=0.5)
            return {futures[f]: f.result() for f in futures}

    def _run_wave(self, hosts: list[str]) -> None:
        for h in hosts:
            self.state.start(h)
            self.progress(h, "probing")
        probes = self._guard_probe(hosts)
        ready_flags = self._parallel(hosts, lambda h: self._guard(h, lambda: self._prepare(h, probes[h])))
        ready = [h for h in hosts if ready_flags.get(h)]
        if not ready:
            return
        if self.interrupted.is_set():
            for h in ready:
                self._end_interrupted(h)
            return
        results = self._install(ready)
        verify: list[str] = []
        for h in ready:
            res = results.get(h) or InstallOutcome("failed", "install: no result for this host")
            if res.result == "ok":
                verify.append(h)
            elif res.result == "interrupted":
                self.interrupted.set()
                self._end_interrupted(h)
            elif res.result == "reboot-pending":
                self._leave_cordoned(h, REBOOT_PENDING, res.reason or "the new driver needs a reboot")
            else:
                self._leave_cordoned(h, FAILED, res.reason or "install failed")
        if not verify:
            return
        if self.interrupted.is_set():
            for h in verify:
                self._end_interrupted(h)
            return
        for h in verify:
            self._step(h, VERIFYING)
        after = self._guard_probe(verify)
        self._parallel(verify, lambda h: self._guard(h, lambda: self._complete(h, after[h])))

    def _install(self, hosts: list[str]) -> dict[str, InstallOutcome]:
        """The change itself on the wave's prepared hosts (here: the driver, through the fleet)."""
        try:
            return self.fleet.upgrade(
                hosts, self.opt.target, reboot_allowed=self.opt.reboot_allowed, on_step=self._on_step
            )
        except GpuprovError as exc:
            return {h: InstallOutcome("failed", f"install: {exc}") for h in hosts}

    def _guard_probe(self, hosts: list[str]) -> dict[str, HostProbe]:
        try:
            probes = self.fleet.probe(hosts)
        except GpuprovError as exc:
            probes = {}
            reason = str(exc)
        else:
            reason = "no probe result"
        return {h: probes.get(h) or HostProbe(h, error=reason) for h in hosts}

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
        """Steps reported by the fleet while it installs (from the playbook's events)."""
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
            UPGRADED: f"{self.DONE} {s.from_version or '?'} → {s.to_version or '?'}",
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

    def _prepare(self, host: str, probe: HostProbe) -> bool:
        """Probe → cordon → drain → pause operands. True: the host is ready for the install."""
        s = self.state.hosts[host]
        self._check()  # a probe cut short by Ctrl-C is an interruption, not a failure
        if probe.error:
            self._end(host, FAILED, f"probe: {probe.error}")
            return False
        target = self.opt.target
        # The first attempt's probe stays the reference: GPUs seen and Xids logged before the upgrade
        # began, even when this is a resumed attempt after a reboot or a failed install.
        if s.before is None:
            self.state.update(host, before=probe.to_dict())
        self.before[host] = HostProbe.from_dict(host, s.before or probe.to_dict())
        self.state.update(host, from_version=s.from_version or probe.loaded, to_version=target.text)
        if target.matches(probe.loaded):
            if s.cordoned_by_us or s.paused_labels:
                # An earlier attempt got this far (a reboot, or an interruption after the install):
                # verify and put the node back.
                self.progress(host, f"{probe.loaded} already loaded; verifying and putting the node back")
                self._step(host, VERIFYING)
                self._complete(host, probe)
            else:
                self.state.update(host, to_version=probe.loaded)
                self._end(host, SKIPPED, f"already at {target}: {probe.loaded} loaded")
            return False
        self._check()
        kube = self.fleet.kube
        if kube is None:
            self.progress(host, "no kube_control_plane host in the inventory: not cordoned or drained")
            self._step(host, STOPPING)
            return True
        if probe.node_error and not s.node:
            self._end(host, FAILED, f"{probe.node_error}: not cordoned, drained or upgraded")
            return False
        node_name = s.node or probe.node or host
        try:
            info = kube.node(node_name)
        except StepFailed as exc:
            self._check()
            self._end(host, FAILED, f"control plane: {exc.reason}")
            return False
        if info is None:
            self.progress(host, f"not a Kubernetes node ({node_name} not found): not cordoned or drained")
            self.state.update(host, node=None)
            self._step(host, STOPPING)
            return True
        stranger = not_this_host(info, probe)
        if stranger:
            self._end(host, FAILED, f"node {info.name} {stranger}: not cordoned, drained or upgraded")
            return False
        self.state.update(host, node=info.name)
        if not self._cordon_and_drain(host, info.name, info.unschedulable):
            return False
        self._check()
        self._step(host, STOPPING)
        deploy = {k: v for k, v in info.labels.items() if k.startswith(OPERAND_LABEL_PREFIX)}
        if deploy and deploy.get(OPERANDS_LABEL) != "false" and not s.paused_labels:
            # Recorded before the change (None: the operands label was absent), so that the node gets its
            # labels back as they were, also from a resumed run.
            self.state.update(host, paused_labels={OPERANDS_LABEL: None, **deploy})
        if s.paused_labels:
            try:
                kube.set_labels(info.name, {OPERANDS_LABEL: "false"})
                self.progress(host, "GPU Operator operands taken off the node; waiting for their pods to go")
                kube.wait_operands_gone(info.name, self.opt.operand_timeout)
            except StepFailed as exc:
                if self.interrupted.is_set():
                    raise _Interrupted() from None
                self._step(host, UNCORDONING)
                self._release(host, info.name, "stopping the GPU Operator's operands", exc.reason)
                return False
        return True

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

    def _mig_back(self, host: str, node: str, before: HostProbe) -> bool:
        """A node with a MIG layout lost its GPU instances when the modules were unloaded. Its MIG manager
        comes back with the operands and applies the layout again: wait for it to report success and for
        the host's MIG devices to be what they were before the upgrade, before the node is uncordoned."""
        kube = self.fleet.kube
        assert kube is not None
        had = {i: c for i, c in (before.mig_devices or {}).items() if c}
        try:
            info = kube.node(node)
        except StepFailed as exc:
            self._leave_cordoned(host, FAILED, f"verify: mig.config: {exc.reason}")
            return False
        layout = (info.labels if info else {}).get(CONFIG_LABEL)
        if not had and (layout is None or layout == MIG_OFF):
            return True
        s = self.state.hosts[host]
        if s.paused_labels:
            problems = self._put_back(host, node, uncordon=False)
            if problems:
                self._leave_cordoned(host, FAILED, "verify: mig.config: " + "; ".join(problems))
                return False
        self.progress(host, f"MIG layout {layout or '?'}: waiting for the MIG manager to apply it again")
        deadline = time.monotonic() + self.opt.operand_timeout
        state, devices = "", None
        while True:
            self._check()
            try:
                info = kube.node(node)
            except StepFailed as exc:
                self._leave_cordoned(host, FAILED, f"verify: mig.config: {exc.reason}")
                return False
            state = (info.labels if info else {}).get(STATE_LABEL, "")
            if state == "success":
                after = self._guard_probe([host])[host]
                devices = {i: c for i, c in (after.mig_devices or {}).items() if c}
                if devices == had:
                    return True
            if state == "failed" or time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.5, self.opt.operand_timeout / 60)))
        why = (
            f"the MIG manager reported {STATE_LABEL}={state or 'nothing'}"
            if state != "success"
            else f"MIG devices {devices or 'none'}, before the upgrade {had}"
        )
        self._leave_cordoned(host, FAILED, f"verify: mig.config: {layout}: {why}")
        return False

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
        """The driver was touched and the host is not right: it stays out of scheduling, annotated."""
        s = self.state.hosts[host]
        if s.node and self.fleet.kube is not None:
            with contextlib.suppress(StepFailed):
                self.fleet.kube.annotate(s.node, f"{result}: {reason}"[:250])
        self._end(host, result, reason)

    def _complete(self, host: str, after: HostProbe) -> bool:
        """Verify the upgraded host; on success restore operands and uncordon."""
        self._check()
        before = self.before.get(host) or HostProbe.from_dict(host, self.state.hosts[host].before or {})
        problems = judge(before, after, self.opt.target)
        if problems:
            self._leave_cordoned(host, FAILED, "verify: " + "; ".join(problems))
            return False
        s = self.state.hosts[host]
        self.state.update(host, to_version=after.loaded)
        if s.node and self.fleet.kube is not None and not self._mig_back(host, s.node, before):
            return False
        if s.node and self.fleet.kube is not None and (s.cordoned_by_us or s.paused_labels):
            self._step(host, UNCORDONING)
            problems = self._put_back(host, s.node)
            if problems:
                self._leave_cordoned(host, FAILED, f"upgraded to {after.loaded}, but " + "; ".join(problems))
                return False
        self._end(host, UPGRADED)
        return True


@contextlib.contextmanager
def sigint_to(rollout: Rollout) -> Iterator[None]:
    """First Ctrl-C: stop cleanly (state recorded, exit 3). A second one: stop at once.

    SIGTERM (a service manager, `timeout`) is taken as Ctrl-C, so that it too cancels a batch's playbook
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
