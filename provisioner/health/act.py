"""Remediation as a rolling change (provisioner.rollout): each host that needs an action is cordoned and
drained, repaired — GPU reset, else reboot, else left for service — re-certified and put back.

A host's steps: cordon → drain (pods, then the GPU Operator's operands) → the action, escalating:
  reset-gpu: `nvidia-smi -r -i N` on the GPUs that asked for it; evidence read again; still faulty →
  reboot: only with --allow-reboot (else service); wait for the new boot and the node Ready; evidence
  read again; still faulty →
  service: the node stays cordoned with the `gpuprov.io/needs-service:NoSchedule` taint and an annotation
  giving the reason. gpuprov never retries such a node by itself: an operator removes the taint.
A repaired host is certified at the chosen level before its node is uncordoned; a failed certification
is service too. Every step goes to the run's record and, as an Event, to the node.

The circuit breaker: at most --max-concurrent nodes out of work at once (nodes already left for service
count) and at most --budget N/PERIOD hosts drained per period (earlier runs on this inventory count).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import InputError
from provisioner.health.certify_run import LABEL as CERTIFIED_LABEL
from provisioner.health.decide import NONE, REBOOT, RESET_GPU, SERVICE, HostPlan
from provisioner.health.fleet import DEFAULT_REBOOT_TIMEOUT, SERVICE_TAINT, HealFleet, HealProbe
from provisioner.hosttext import short_safe_text
from provisioner.rollout.engine import Rollout
from provisioner.rollout.model import (
    DEFAULT_DRAIN_TIMEOUT,
    ChangeOutcome,
    HostProbe,
    StepFailed,
)
from provisioner.rollout.state import CHANGED, FAILED, SKIPPED, UNCORDONING, VERIFYING, ChangeKind

RESETTING = "resetting"
REBOOTING = "rebooting"
REMEDIATE = ChangeKind(
    "remediate",
    {RESETTING: frozenset({REBOOTING, VERIFYING}), REBOOTING: frozenset({VERIFYING})},
    # A host may need a reboot from the start, or nothing any more (taken over from an interrupted run).
    entries=frozenset({REBOOTING, VERIFYING}),
)
NODE_READY_WAIT = 300.0
ADVERTISE_WAIT = 300.0  # the device plugin back on the node and its GPUs allocatable again

# `--budget N/PERIOD`: PERIOD a number with a unit (s, m, h, d).
_BUDGET = re.compile(r"(?P<n>[0-9]{1,6})/(?P<p>[0-9]{1,6})(?P<u>[smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

Certifier = Callable[[str, str, str], tuple[bool, list[str]]]
"""(host, level, node) → (certified, reasons); it records the result on the node (label, annotation)."""


@dataclass(frozen=True)
class Budget:
    count: int
    period_s: int
    text: str

    def __str__(self) -> str:
        return self.text


def parse_budget(text: str | None) -> Budget | None:
    """`--budget 3/1h`: at most 3 hosts drained per hour. InputError on anything else."""
    if text is None:
        return None
    m = _BUDGET.fullmatch(text.strip())
    if not m or int(m.group("n")) < 1 or int(m.group("p")) < 1:
        raise InputError(
            f"--budget {short_safe_text(text, 40)!r}: expected HOSTS/PERIOD, a count of at least 1 and a "
            "period with its unit s, m, h or d (3/1h, 10/1d)"
        )
    return Budget(int(m.group("n")), int(m.group("p")) * _UNIT_S[m.group("u")], text.strip())


@dataclass
class HealOptions:
    allow_reboot: bool = False
    certify_level: str = "quick"
    max_concurrent: int = 1
    budget: Budget | None = None
    budget_used: int = 0  # hosts drained within the budget's period before this run
    out_before: int = 0  # nodes already out of work (left for service) when the run began
    reboot_timeout: float = DEFAULT_REBOOT_TIMEOUT
    # GPU resets made by this process (host → boot id, PCI device → uptime before the reset), kept from
    # one --watch cycle to the next. A later invocation does not know them (docs/health.md).
    resets: dict[str, tuple[str, dict[str, float]]] = field(default_factory=dict)
    # What the engine reads.
    pause: bool = False
    max_fail: int = 1_000_000  # the circuit breaker decides when to stop, not a failure count
    drain: bool = True
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT

    def to_dict(self) -> dict[str, Any]:
        return {
            "allow_reboot": self.allow_reboot,
            "certify_level": self.certify_level,
            "max_concurrent": self.max_concurrent,
            "budget": str(self.budget) if self.budget else None,
            "budget_used": self.budget_used,
            "out_before": self.out_before,
            "drain_timeout": self.drain_timeout,
            "reboot_timeout": self.reboot_timeout,
        }


def gpus_to_reset(plan: HostPlan) -> dict[int, str]:
    """The GPUs whose own evidence asks for a reset (index → PCI bus id)."""
    return {g.index: g.pci for g in plan.gpus if g.action == RESET_GPU and g.index is not None}


class HealRollout(Rollout[HealFleet, HealOptions]):
    """Remediation's host steps on the rollout's waves."""

    DONE = "repaired"
    PROBE = HealProbe

    def __init__(self, *args: Any, certifier: Certifier, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.certifier = certifier
        self.plans: dict[str, HostPlan] = {}

    # -- the circuit breaker

    def _drained(self) -> int:
        return sum(1 for s in self.state.hosts.values() if any(h[0] == "draining" for h in s.history))

    def _hold_before(self, wave: list[str]) -> str | None:
        out = self.opt.out_before + sum(
            1 for s in self.state.hosts.values() if s.result == FAILED and s.after == SERVICE
        )
        if out + len(wave) > self.opt.max_concurrent:
            return (
                f"circuit breaker: {out} node(s) out of work, {len(wave)} more would pass --max-concurrent "
                f"{self.opt.max_concurrent}"
            )
        budget = self.opt.budget
        if budget and self.opt.budget_used + self._drained() + len(wave) > budget.count:
            return (
                f"budget exhausted: {self.opt.budget_used + self._drained()} host(s) drained in the last "
                f"{budget.text.split('/')[1]}, --budget {budget}"
            )
        return None

    # -- the host steps

    def _event(self, node: str | None, reason: str, message: str, warning: bool = False) -> None:
        kube = self.fleet.kube
        if node and kube is not None:
            with contextlib.suppress(StepFailed):
                kube.event(node, reason, message, warning)

    def _prepare(self, host: str, probe: HostProbe) -> bool:
        s = self.state.hosts[host]
        self._check()
        if probe.error or not isinstance(probe, HealProbe) or probe.plan is None:
            self._end(host, FAILED, f"probe: {probe.error}")
            return False
        plan = probe.plan
        self.plans[host] = plan
        self._keep_baseline(host, probe)
        if s.before is None:
            self.state.update(host, before=plan.action)
        if plan.action == NONE and not s.cordoned_by_us:
            self._end(host, SKIPPED, "nothing to do: the evidence asks for no action now")
            return False
        if self.fleet.kube is None:
            self._end(host, FAILED, "no control plane: not drained, nothing changed")
            return False
        info = self._require_node(host, probe, "not cordoned or changed", "not drained, nothing changed")
        if info is None:
            return False
        self._event(info.name, "GpuprovRemediate", f"{plan.action}: {'; '.join(plan.reasons)[:800]}", True)
        if not self._cordon_and_drain(host, info.name, info.unschedulable):
            return False
        return self._pause_operands(host, info, self.opt.drain_timeout)

    def _change(self, hosts: list[str]) -> dict[str, ChangeOutcome]:
        if len(hosts) == 1:
            return {hosts[0]: self._repair(hosts[0])}
        with ThreadPoolExecutor(max_workers=min(len(hosts), 64), thread_name_prefix="gpuprov-heal") as pool:
            return dict(zip(hosts, pool.map(self._repair, hosts), strict=True))

    def _repair(self, host: str) -> ChangeOutcome:
        """The action, escalating: reset → reboot → service. "ok" when the evidence asks for nothing."""
        plan = self.plans[host]
        action = plan.action
        why: list[str] = []
        node = self.state.hosts[host].node
        if action == NONE:  # a resumed host whose GPUs are fine now: certify and put back
            return ChangeOutcome("ok")
        if action == RESET_GPU:
            self._step(host, RESETTING)
            gpus = gpus_to_reset(plan)
            if not gpus:
                why.append("reset-gpu asked for, but no GPU index to reset")
                action = REBOOT
            else:
                done = self.fleet.reset_gpus(host, gpus)
                self.progress(host, done.reason)
                self._event(node, "GpuprovGpuReset", done.reason, not done.ok)
                self.state.update(host, after=RESET_GPU)
                if not done.ok:
                    why.append(done.reason)
                    action = REBOOT
                else:
                    left = self._still(host)
                    if left is None:
                        return ChangeOutcome("ok")
                    why.append(f"after the reset: {left.action}: {'; '.join(left.reasons)[:300]}")
                    action = REBOOT if left.action in (RESET_GPU, REBOOT) else SERVICE
        if action == REBOOT:
            if not self.opt.allow_reboot:
                why.append("a reboot is needed and --allow-reboot was not given")
                return self._service(host, why)
            self._step(host, REBOOTING)
            self.state.update(host, after=REBOOT)
            self._event(node, "GpuprovReboot", "rebooting the host to recover its GPUs")
            try:
                boot = self.fleet.reboot(host, self.opt.reboot_timeout, self.interrupted.is_set)
            except StepFailed as exc:
                self._check()
                why.append(exc.reason)
                return self._service(host, why)
            self._check()
            if node and not self.fleet.wait_ready(node, NODE_READY_WAIT, self.interrupted.is_set, boot):
                self._check()
                why.append(
                    f"node {node} not Ready on its new boot within {NODE_READY_WAIT:g} s of the reboot"
                )
                return self._service(host, why)
            left = self._still(host)
            if left is None:
                return ChangeOutcome("ok")
            why.append(f"after the reboot: {left.action}: {'; '.join(left.reasons)[:300]}")
        return self._service(host, why or plan.reasons)

    def _still(self, host: str) -> HostPlan | None:
        """The evidence read again: None when it asks for nothing, else the plan it asks for."""
        probe = self.fleet.probe([host]).get(host)
        if not isinstance(probe, HealProbe) or probe.plan is None or probe.error:
            reason = probe.error if probe is not None else "no probe result"
            return HostPlan(host, SERVICE, True, [f"evidence unreadable after the repair: {reason}"], [])
        return None if probe.plan.action == NONE else probe.plan

    def _service(self, host: str, why: list[str]) -> ChangeOutcome:
        self.state.update(host, after=SERVICE)
        return ChangeOutcome("failed", "needs service: " + "; ".join(short_safe_text(w, 400) for w in why))

    def _complete(self, host: str, after: HostProbe) -> bool:
        self._check()
        s = self.state.hosts[host]
        assert s.node is not None
        if after.error or not isinstance(after, HealProbe) or after.plan is None:
            return self._needs_service(host, f"verify: host not readable: {after.error}")
        if after.plan.action != NONE:
            return self._needs_service(
                host, f"still {after.plan.action}: {'; '.join(after.plan.reasons)[:400]}"
            )
        # The device plugin and the other operands come back before the node is judged: a node that
        # advertises no GPU is not fit for work, and certification reads what it advertises.
        problems = self._put_back(host, s.node, uncordon=False)
        if problems:
            return self._needs_service(host, "; ".join(problems))
        self.progress(host, "operands back; waiting for the node to advertise its GPUs")
        if not self.fleet.wait_advertised(s.node, ADVERTISE_WAIT, self.interrupted.is_set):
            self._check()
            return self._needs_service(
                host, f"node {s.node} advertises no GPU {ADVERTISE_WAIT:g} s after the repair"
            )
        level = self.opt.certify_level
        self.progress(host, f"certifying ({level})")
        try:
            ok, reasons = self.certifier(host, level, s.node)
        except StepFailed as exc:
            ok, reasons = False, [exc.reason]
        if not ok:
            why = "; ".join(short_safe_text(r, 300) for r in reasons[:8])
            return self._needs_service(host, f"certify {level} failed: {why}")
        self._step(host, UNCORDONING)
        problems = self._put_back(host, s.node)
        if problems:
            self._leave_cordoned(host, FAILED, "repaired and certified, but " + "; ".join(problems))
            return False
        done = s.after or s.before or "nothing"
        self._event(s.node, "GpuprovRepaired", f"{done}; certified {level}; uncordoned")
        self._end(host, CHANGED, f"{done}, certified {level}, uncordoned")
        return True

    def _needs_service(self, host: str, why: str) -> bool:
        """The repaired host is not fit for work: left for service (False, for the engine's host step)."""
        self.state.update(host, after=SERVICE)
        self._leave_cordoned(host, FAILED, f"needs service: {why}")
        return False

    def _leave_cordoned(self, host: str, result: str, reason: str) -> None:
        """Left out of work: cordoned, tainted for service, the reason annotated, the operands back (their
        exporters report on the GPU). Never uncordoned or retried by gpuprov on its own."""
        s = self.state.hosts[host]
        kube = self.fleet.kube
        if s.node and kube is not None:
            problems = self._put_back(host, s.node, uncordon=False)
            try:  # not fit for work: no longer certified either
                kube.set_labels(s.node, {CERTIFIED_LABEL: None})
            except StepFailed as exc:
                problems.append(f"{CERTIFIED_LABEL} label not removed: {exc.reason}")
            try:
                kube.taint(s.node, SERVICE_TAINT, "true", "NoSchedule")
            except StepFailed as exc:
                problems.append(f"taint not set: {exc.reason}")
            with contextlib.suppress(StepFailed):
                kube.annotate(s.node, f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {reason}"[:1000])
            self._event(s.node, "GpuprovNeedsService", reason, True)
            if problems:
                reason += f" ({'; '.join(problems)})"
            # The node stays cordoned on purpose: not ours to uncordon any more.
            self.state.update(host, cordoned_by_us=False)
        self._end(host, result, reason)
