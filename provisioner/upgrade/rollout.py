"""upgrade-driver as a rolling change (provisioner.rollout): its steps, options, the fleet it needs, and
a host's way through a driver upgrade.

Per host: probe (skip when already at the target) → cordon → drain (or evict GPU pods) → pause the GPU
Operator's operands → stop GPU services and unload the modules → unhold, install, hold → reload the
modules, or reboot when that is impossible and allowed → verify (and wait for a MIG layout to be back)
→ restore the operands → uncordon.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from provisioner.errors import GpuprovError
from provisioner.mig import CONFIG_LABEL, MIG_OFF, STATE_LABEL
from provisioner.rollout.engine import Rollout
from provisioner.rollout.model import (
    DEFAULT_DRAIN_TIMEOUT,
    ChangeOutcome,
    Fleet,
    HostProbe,
    StepFailed,
)
from provisioner.rollout.plan import BatchSize, parse_batch
from provisioner.rollout.state import (
    CHANGED,
    FAILED,
    SKIPPED,
    UNCORDONING,
    VERIFYING,
    ChangeKind,
)
from provisioner.upgrade.plan import DriverProbe, DriverTarget, judge, parse_target

# The driver change's own steps; the playbook reports them as it goes (adapters.STEP_FACT).
STOPPING = "stopping"
INSTALLING = "installing"
RELOADING = "reloading"
REBOOTING = "rebooting"
DRIVER = ChangeKind(
    "upgrade-driver",
    {
        # Stopping follows the pause of the operands: if that fails, the node is put back.
        STOPPING: frozenset({INSTALLING, UNCORDONING}),
        INSTALLING: frozenset({RELOADING, REBOOTING, VERIFYING}),
        RELOADING: frozenset({VERIFYING, REBOOTING}),
        REBOOTING: frozenset({VERIFYING}),
    },
)
ANNOTATION = "gpuprov.io/driver-upgrade"  # on a node left cordoned: why
DEFAULT_OPERAND_TIMEOUT = 300.0  # for the operands to leave, and for a MIG layout to come back


StepFn = Callable[[str, str], None]
"""A host's driver change reaching a step: (host, step), the step stopping, installing, reloading or
rebooting."""


class DriverFleet(Fleet, Protocol):
    """The GPU hosts, probed for their driver, and the driver change on a batch of them."""

    def upgrade(
        self, hosts: Sequence[str], target: DriverTarget, *, reboot_allowed: bool, on_step: StepFn
    ) -> dict[str, ChangeOutcome]: ...


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


class DriverRollout(Rollout[DriverFleet, Options]):
    """The driver upgrade's host steps on the rollout's waves."""

    DONE = "upgraded"
    PROBE = DriverProbe

    def _prepare(self, host: str, probe: HostProbe) -> bool:
        """Probe → cordon → drain → pause operands. True: the host is ready for the install."""
        s = self.state.hosts[host]
        self._check()  # a probe cut short by Ctrl-C is an interruption, not a failure
        if probe.error or not isinstance(probe, DriverProbe):
            self._end(host, FAILED, f"probe: {probe.error}")
            return False
        target = self.opt.target
        self._keep_baseline(host, probe)
        self.state.update(host, before=s.before or probe.loaded, after=target.text)
        if target.matches(probe.loaded):
            if s.cordoned_by_us or s.paused_labels:
                # An earlier attempt got this far (a reboot, or an interruption after the install):
                # verify and put the node back.
                self.progress(host, f"{probe.loaded} already loaded; verifying and putting the node back")
                self._step(host, VERIFYING)
                self._complete(host, probe)
            else:
                self.state.update(host, after=probe.loaded)
                self._end(host, SKIPPED, f"already at {target}: {probe.loaded} loaded")
            return False
        self._check()
        kube = self.fleet.kube
        if kube is None:
            self.progress(host, "no kube_control_plane host in the inventory: not cordoned or drained")
            self._step(host, STOPPING)
            return True
        found = self._lookup_node(host, probe, "not cordoned, drained or upgraded", default=host)
        if found.ended:
            return False
        info = found.info
        if info is None:
            self.progress(host, f"not a Kubernetes node ({found.name} not found): not cordoned or drained")
            self.state.update(host, node=None)
            self._step(host, STOPPING)
            return True
        if not self._cordon_and_drain(host, info.name, info.unschedulable):
            return False
        self._check()
        self._step(host, STOPPING)
        return self._pause_operands(host, info, self.opt.operand_timeout)

    def _change(self, hosts: list[str]) -> dict[str, ChangeOutcome]:
        """The driver, through the fleet; every host gets an outcome with its reason."""
        try:
            results = self.fleet.upgrade(
                hosts, self.opt.target, reboot_allowed=self.opt.reboot_allowed, on_step=self._on_step
            )
        except GpuprovError as exc:
            return {h: ChangeOutcome("failed", f"install: {exc}") for h in hosts}
        out: dict[str, ChangeOutcome] = {}
        for h in hosts:
            res = results.get(h) or ChangeOutcome("failed", "install: no result for this host")
            if res.result == "reboot-pending" and not res.reason:
                res = ChangeOutcome(res.result, "the new driver needs a reboot")
            elif res.result == "failed" and not res.reason:
                res = ChangeOutcome(res.result, "install failed")
            out[h] = res
        return out

    def _complete(self, host: str, after: HostProbe) -> bool:
        """Verify the upgraded host; on success restore operands and uncordon."""
        self._check()
        s = self.state.hosts[host]
        before = DriverProbe.from_dict(host, s.baseline or {})
        problems = judge(before, after, self.opt.target)
        if problems or not isinstance(after, DriverProbe):
            self._leave_cordoned(host, FAILED, "verify: " + "; ".join(problems))
            return False
        self.state.update(host, after=after.loaded)
        if s.node and self.fleet.kube is not None and not self._mig_back(host, s.node, before):
            return False
        if s.node and self.fleet.kube is not None and (s.cordoned_by_us or s.paused_labels):
            self._step(host, UNCORDONING)
            problems = self._put_back(host, s.node)
            if problems:
                self._leave_cordoned(host, FAILED, f"upgraded to {after.loaded}, but " + "; ".join(problems))
                return False
        self._end(host, CHANGED)
        return True

    def _mig_back(self, host: str, node: str, before: DriverProbe) -> bool:
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
                mig = after.mig_devices if isinstance(after, DriverProbe) else None
                devices = {i: c for i, c in (mig or {}).items() if c}
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
