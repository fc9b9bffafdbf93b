"""`gpuprov upgrade-driver`: a rolling upgrade of the host-installed NVIDIA driver across a fleet.

Per host: probe (skip when already at the target) → cordon → drain (or evict GPU pods) → pause the GPU
Operator's operands → stop GPU services and unload the modules → unhold, install, hold (the
nvidia_driver role, the same code bootstrap runs) → reload the modules, or reboot when that is
impossible and allowed → verify → restore the operands → uncordon. Canaries first, then batches of
hosts in parallel; no new batch starts once failures exceed --max-fail. Every step is recorded in the
run's state file, so `--resume` carries on after a crash or Ctrl-C.

What touches hosts sits behind two small interfaces, `Fleet` and `Kube` (upgrade_fleet.py has the real
ones, over SSH and ansible-runner); the orchestration here is tested against a fake fleet.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from provisioner import records
from provisioner.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, GpuprovError, InputError
from provisioner.hosttext import safe_text, short_safe_text
from provisioner.upgrade_plan import (
    BatchSize,
    HostProbe,
    Plan,
    Target,
    build_plan,
    check_count,
    check_limit_names,
    judge,
    parse_batch,
    parse_target,
    render_plan,
)
from provisioner.upgrade_state import (
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
    VERB,
    VERIFYING,
    UpgradeState,
    inventory_lock,
    resumable,
)

# The GPU Operator deploys its operands (device plugin, DCGM exporter, validator, ...) on a node per
# `nvidia.com/gpu.deploy.<operand>` labels. `nvidia.com/gpu.deploy.operands=false` is its documented switch
# to take them all off a node; when it goes, the operator adds missing state labels as "true" and keeps
# the values it finds, so the labels recorded before are put back as they were.
OPERAND_LABEL_PREFIX = "nvidia.com/gpu.deploy."
OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
ANNOTATION = "gpuprov.io/driver-upgrade"  # on a node left cordoned: why
DEFAULT_DRAIN_TIMEOUT = 300.0
DEFAULT_OPERAND_TIMEOUT = 300.0


# ------------------------------------------------------------------------------ host-facing actions


class StepFailed(GpuprovError):
    """A host action failed; `reason` says why in one line (it ends up in the summary and the state)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class NodeInfo:
    name: str
    unschedulable: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    machine_id: str = ""  # status.nodeInfo.machineID (the kubelet reads the node's /etc/machine-id)
    addresses: tuple[str, ...] = ()  # status.addresses of type InternalIP


def not_this_host(info: NodeInfo, probe: HostProbe) -> str | None:
    """Why the node cannot be proven to be the probed host (None: it is). A host names its own node
    through its hostname, which it controls: a host calling itself gpu7 must not get gpu7 drained. The
    node is this host when its machine ID is the host's /etc/machine-id, or one of its InternalIPs is
    the address the host was reached at."""
    if probe.machine_id and info.machine_id == probe.machine_id:
        return None
    if probe.address and probe.address in info.addresses:
        return None
    ips = ", ".join(short_safe_text(a) for a in info.addresses) or "none"
    theirs = f"machine ID {short_safe_text(info.machine_id) or 'none'}, InternalIP {ips}"
    ours = f"machine ID {probe.machine_id or 'unknown'}, address {probe.address or 'unknown'}"
    return f"is not this host ({theirs}; the host has {ours})"


@dataclass(frozen=True)
class InstallOutcome:
    """How stop → unload → install → reload (or reboot) went on one host."""

    result: str  # "ok" | "failed" | "reboot-pending" | "interrupted"
    reason: str = ""
    rebooted: bool = False


class Kube(Protocol):
    """The cluster, through the first control-plane host. Failures raise StepFailed."""

    def node(self, name: str) -> NodeInfo | None: ...  # None: no such node

    def cordon(self, name: str) -> None: ...

    def uncordon(self, name: str) -> None: ...

    def drain(self, name: str, timeout: float) -> None: ...  # DaemonSet pods stay

    def evict_gpu_pods(self, name: str, timeout: float) -> None: ...  # only pods that use GPUs

    def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None: ...  # None removes

    def wait_operands_gone(self, name: str, timeout: float) -> None: ...

    def annotate(self, name: str, text: str | None) -> None: ...  # None removes the annotation


class Fleet(Protocol):
    """The GPU hosts."""

    kube: Kube | None  # None: no control plane in the inventory (hosts are not Kubernetes nodes)

    def probe(self, hosts: Sequence[str]) -> dict[str, HostProbe]: ...  # read-only, hosts in parallel

    def upgrade(
        self,
        hosts: Sequence[str],
        target: Target,
        *,
        reboot_allowed: bool,
        on_step: Callable[[str, str], None],
    ) -> dict[str, InstallOutcome]: ...

    def interrupt(self) -> None: ...  # abort remote work in progress (Ctrl-C)

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------- progress


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


ProgressFn = Callable[[str | None, str], None]


# ----------------------------------------------------------------------------------------- rollout


@dataclass
class Options:
    target: Target
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
    """Runs a plan wave by wave against a fleet, recording every step in the state."""

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
        try:
            results = self.fleet.upgrade(
                ready, self.opt.target, reboot_allowed=self.opt.reboot_allowed, on_step=self._on_step
            )
        except GpuprovError as exc:
            results = {h: InstallOutcome("failed", f"install: {exc}") for h in ready}
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
            UPGRADED: f"upgraded {s.from_version or '?'} → {s.to_version or '?'}",
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
        if s.was_cordoned is None:
            self.state.update(host, was_cordoned=info.unschedulable)
        self._step(host, CORDONING)
        try:
            kube.cordon(info.name)
        except StepFailed as exc:
            self._check()
            self._release(host, info.name, "cordon", exc.reason)
            return False
        self.state.update(host, cordoned_by_us=not s.was_cordoned)
        self._check()
        self._step(host, DRAINING)
        try:
            if self.opt.drain:
                kube.drain(info.name, self.opt.drain_timeout)
            else:
                kube.evict_gpu_pods(info.name, self.opt.drain_timeout)
        except StepFailed as exc:
            if self.interrupted.is_set():
                raise _Interrupted() from None
            self._release(host, info.name, "drain" if self.opt.drain else "GPU pod eviction", exc.reason)
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

    def _put_back(self, host: str, node: str) -> list[str]:
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
        if s.cordoned_by_us:
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
        if s.node and self.fleet.kube is not None and (s.cordoned_by_us or s.paused_labels):
            self._step(host, UNCORDONING)
            problems = self._put_back(host, s.node)
            if problems:
                self._leave_cordoned(host, FAILED, f"upgraded to {after.loaded}, but " + "; ".join(problems))
                return False
        self._end(host, UPGRADED)
        return True


# ------------------------------------------------------------------------------------------ the verb


@contextlib.contextmanager
def _sigint_to(rollout: Rollout) -> Iterator[None]:
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


def _confirm(question: str) -> bool:
    import typer

    return bool(typer.confirm(question, default=False))


def _resume_options(recorded: Mapping[str, Any], given: dict[str, Any]) -> Options:
    """The recorded options; plan-shaping ones may be repeated but not changed, the rest may change."""
    for key, flag in (("to", "--to"), ("batch", "--batch"), ("canary", "--canary")):
        value = given.get(key)
        if value is not None and str(value) != str(recorded.get(key)):
            raise InputError(
                f"--resume continues the recorded plan ({flag} {recorded.get(key)}); {flag} {value} differs"
            )
    merged = dict(recorded)
    for key in ("max_fail", "pause", "drain", "reboot_allowed", "drain_timeout"):
        if given.get(key) is not None:
            merged[key] = given[key]
    return Options.from_dict(merged)


_FULL_VERSION = re.compile(r"\d{3}\.\d+\.\d+")


def _role_default(knob: str) -> Any:
    import yaml

    from provisioner.content import ROLES_DIR

    path = ROLES_DIR / "nvidia_driver" / "defaults" / "main.yml"
    try:
        return (yaml.safe_load(path.read_text()) or {}).get(knob)
    except (OSError, yaml.YAMLError):
        return None


def resolve_install_version(target: Target, hosts: Sequence[Any]) -> str:
    """The exact driver version to install for `target`.

    The nvidia_driver role installs exact, pinned versions. A full version is used as given; a branch
    (or 580.159) resolves to the pinned version it matches: the hosts' nvidia_driver_version from the
    inventory, else the role's default. Anything else is bad input, before any host is touched.
    """
    if _FULL_VERSION.fullmatch(target.text):
        return target.text
    pins: set[str] = set()
    for h in hosts:
        value = (getattr(h, "vars", None) or {}).get("nvidia_driver_version")
        if value is not None and "{{" not in str(value):
            pins.add(str(value))
    default = _role_default("nvidia_driver_version")
    if default is not None and "{{" not in str(default):
        pins.add(str(default))
    matching = sorted(v for v in pins if target.matches(v) and _FULL_VERSION.fullmatch(v))
    if len(matching) == 1:
        return matching[0]
    if len(matching) > 1:
        raise InputError(
            f"--to {target}: the inventory pins several versions of it ({', '.join(matching)}); "
            "give the exact version"
        )
    known = ", ".join(sorted(pins)) or "none"
    raise InputError(
        f"--to {target}: no pinned {target}.x version to install (inventory nvidia_driver_version or the "
        f"nvidia_driver role default; pinned: {known}); give the exact version, like {target.branch}.159.04"
    )


def make_fleet(
    inventory: Any,
    hosts: list[Any],
    control_plane: Any | None,
    options: Options,
    record: Path | None,
    inventory_path: Path,
    progress: ProgressFn,
) -> Fleet:
    """The real fleet (SSH + ansible-runner); imported here so that planning stays light."""
    from provisioner.upgrade_fleet import RealFleet

    return RealFleet(
        hosts=hosts,
        control_plane=control_plane,
        inventory_path=inventory_path,
        record=record,
        install_version=options.install_version,
        progress=progress,
    )


def run_upgrade(
    *,
    inventory: Path | None,
    to: str | None,
    batch: str | None = None,
    canary: int | None = None,
    max_fail: int | None = None,
    pause: bool | None = None,
    drain: bool | None = None,
    reboot_allowed: bool | None = None,
    resume: bool = False,
    dry_run: bool = False,
    output_format: str = "table",
    limit: str | None = None,
    drain_timeout: float | None = None,
    fleet_factory: Callable[..., Fleet] = make_fleet,
    stdin_isatty: Callable[[], bool] | None = None,
) -> int:
    """The verb. Input is checked first (exit 2, nothing touched); returns the exit code."""
    from provisioner.config import validate_inventory_settings
    from provisioner.inventory import load_inventory

    if inventory is None:
        raise InputError("-i/--inventory is required (try: gpuprov lab inventory)")
    if resume and dry_run:
        raise InputError("--resume and --dry-run together: a resumed run continues its recorded plan")
    if resume and limit:
        raise InputError("--resume continues the recorded plan's hosts; leave out --limit")
    given = {
        "to": parse_target(to).text if to is not None else None,
        "batch": str(parse_batch(batch)) if batch is not None else None,
        "canary": check_count("--canary", canary) if canary is not None else None,
        "max_fail": check_count("--max-fail", max_fail) if max_fail is not None else None,
        "pause": pause,
        "drain": drain,
        "reboot_allowed": reboot_allowed,
        "drain_timeout": drain_timeout,
    }
    if drain_timeout is not None and not (0 < drain_timeout < math.inf):
        raise InputError(f"--drain-timeout {drain_timeout:g}: must be a number of seconds more than 0")
    if not resume and given["to"] is None:
        parse_target(None)  # raises: --to is required
    isatty = stdin_isatty or sys.stdin.isatty

    inv = load_inventory(inventory)
    inv_key = str(Path(inventory).resolve())
    check_limit_names(limit, inv.host_names(), inv.group_names)
    progress = Progress()

    with inventory_lock(inv_key):
        state: UpgradeState | None = None
        if resume:
            record = resumable(inv_key)
            state = UpgradeState.load(record)
            options = _resume_options(state.doc["options"], given)
            plan = Plan.from_dict(state.doc["plan"])
            names = list(state.hosts)
            known = set(inv.host_names())
            missing = [h for h in names if h not in known]
            if missing:
                raise InputError(
                    f"--resume: host(s) {', '.join(missing)} of {record} are no longer in {inventory}"
                )
            selected = [h for h in inv.select(None) if h.name in set(names)]
        else:
            options = Options(
                target=parse_target(given["to"]),
                batch=parse_batch(given["batch"]),
                canary=given["canary"] or 0,
                max_fail=given["max_fail"] or 0,
                pause=bool(pause),
                drain=drain is not False,
                reboot_allowed=bool(reboot_allowed),
                drain_timeout=drain_timeout or DEFAULT_DRAIN_TIMEOUT,
            )
            selected = [h for h in inv.select(limit) if "gpu_nodes" in h.groups]
            if not selected:
                by = f" by --limit {limit}" if limit else ""
                raise InputError(f"{inventory}: no host of group gpu_nodes selected{by}")
        if not options.install_version:
            options.install_version = resolve_install_version(options.target, selected)
        if options.pause and not dry_run and not isatty():
            raise InputError("--pause asks before each batch: standard input must be a terminal")
        validate_inventory_settings(inv, selected)
        control = inv.select("kube_control_plane") if "kube_control_plane" in inv.group_names else []

        record_dir = None if dry_run else (state.path.parent if state else records.new_record(VERB))
        fleet = fleet_factory(
            inv, selected, control[0] if control else None, options, record_dir, Path(inventory), progress
        )
        try:
            if state is None:
                names = [h.name for h in selected]
                progress(None, f"upgrade-driver: probing {len(names)} GPU host(s)")
                probes = fleet.probe(names)
                plan = build_plan(
                    names, probes, options.target, options.batch, options.canary, kube=fleet.kube is not None
                )
                if dry_run:
                    return _render_dry_run(plan, options, output_format)
                assert record_dir is not None
                records.write_json(
                    record_dir / "command.json",
                    {
                        "verb": VERB,
                        "inventory": inv_key,
                        "limit": limit,
                        "options": options.to_dict(),
                        "hosts": names,
                    },
                )
                state = UpgradeState.create(
                    record_dir, inventory=inv_key, options=options.to_dict(), plan=plan.to_dict(), hosts=names
                )
                for name in plan.skipped:
                    state.start(name)
                    p = probes[name]
                    state.update(
                        name, from_version=p.loaded, to_version=p.loaded, before=p.to_dict(), node=p.node
                    )
                    state.finish(name, SKIPPED, plan.hosts[name].reason)
                    progress(name, f"skipped: {plan.hosts[name].reason}")
                progress(None, f"record {record_dir}")
            else:
                progress(None, f"upgrade-driver: resuming {state.path.parent}")
                for name in state.hosts:
                    state.reopen(name)
            state.begin_invocation(resumed=resume)
            rollout = Rollout(fleet, state, plan, options, progress, confirm=_confirm)
            with _sigint_to(rollout):
                outcome = rollout.run()
            state.end_invocation(outcome.status, outcome.reason)
        finally:
            fleet.close()

    summary = _summary(state, plan, options, outcome)
    summary["notes"] = pin_notes(selected, state, options.install_version)
    for note in summary["notes"]:
        progress(None, f"note: {note}")
    records.write_json(state.path.parent / "summary.json", summary)
    _render(summary, output_format)
    if outcome.status in ("interrupted", "paused"):
        return EXIT_INTERRUPTED
    return EXIT_OK if all(s.done for s in state.hosts.values()) else EXIT_FAILED


# ----------------------------------------------------------------------------------------- output


def pin_notes(hosts: Sequence[Any], state: UpgradeState, installed: str) -> list[str]:
    """Upgraded hosts whose inventory (or the role's default) pins another version: the next bootstrap
    would move them back, so say so."""
    default = _role_default("nvidia_driver_version")
    by_pin: dict[str, list[str]] = {}
    for h in hosts:
        s = state.hosts.get(h.name)
        if s is None or s.result != UPGRADED:
            continue
        pin = (getattr(h, "vars", None) or {}).get("nvidia_driver_version", default)
        if pin is not None and "{{" not in str(pin) and str(pin) != installed:
            by_pin.setdefault(str(pin), []).append(h.name)
    return [
        f"nvidia_driver_version is {pin} for {', '.join(names)} (inventory or role default): set it to "
        f"{installed}, or the next gpuprov bootstrap installs {pin} again"
        for pin, names in sorted(by_pin.items())
    ]


def _summary(state: UpgradeState, plan: Plan, options: Options, outcome: RolloutOutcome) -> dict[str, Any]:
    hosts = []
    for name, s in state.hosts.items():
        hosts.append(
            {
                "host": name,
                "from": s.from_version,
                "to": s.to_version or options.target.text,
                "result": s.result,
                "reason": s.reason,
                "duration_s": round(s.duration_s, 1),
                "step": s.step,
                "node": s.node,
                "cordoned": s.cordoned_by_us,
                "attempts": s.attempts,
            }
        )
    totals: dict[str, int] = {}
    for h in hosts:
        totals[h["result"]] = totals.get(h["result"], 0) + 1
    return {
        "verb": VERB,
        "inventory": state.doc["inventory"],
        "record": str(state.path.parent),
        "target": options.target.text,
        "status": "finished" if outcome.status == "finished" and state.finished else outcome.status,
        "stop_reason": outcome.reason,
        "resumable": not state.finished,
        "hosts": hosts,
        "totals": dict(sorted(totals.items())),
    }


def _render(summary: dict[str, Any], output_format: str) -> None:
    import json

    if output_format == "json":
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False, width=max(100, Console().width))
    table = Table(title=f"upgrade-driver → {summary['target']}")
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


def _render_dry_run(plan: Plan, options: Options, output_format: str) -> int:
    import json

    if output_format == "json":
        doc = plan.to_dict()
        doc["dry_run"] = True
        doc["options"] = options.to_dict()
        doc["waves"] = plan.waves
        for name, p in plan.hosts.items():
            doc["hosts"][name]["needs"] = p.needs(options.drain, options.reboot_allowed)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(
            render_plan(
                plan,
                drain=options.drain,
                reboot_allowed=options.reboot_allowed,
                max_fail=options.max_fail,
                install_version=options.install_version,
            )
        )
    unprobed = sorted(name for name, p in plan.hosts.items() if p.probe_error)
    if unprobed:
        # A plan for hosts nobody could look at is a guess: say so, and do not report success.
        sys.stderr.write(
            f"upgrade-driver: {len(unprobed)} of {len(plan.hosts)} host(s) could not be probed "
            f"({', '.join(unprobed[:10])}{', ...' if len(unprobed) > 10 else ''}): the plan is incomplete\n"
        )
        return EXIT_FAILED
    return EXIT_OK
