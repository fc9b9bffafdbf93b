"""The MIG change as a rolling change (provisioner.rollout): its step, options and the host steps of a
layout change (cordon → evict GPU pods → label → MIG manager → verify → uncordon)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from provisioner.hosttext import short_safe_text
from provisioner.mig import MigEntry, wanted_devices
from provisioner.migapply.fleet import (
    CONFIG_LABEL,
    KUBELET_SERVICE,
    NODE_READY_WAIT,
    PAUSED,
    STATE_LABEL,
    MigFleet,
    MigProbe,
    allocatable,
)
from provisioner.rollout.engine import Rollout
from provisioner.rollout.model import (
    DEFAULT_DRAIN_TIMEOUT,
    OPERAND_LABEL_PREFIX,
    ChangeOutcome,
    HostProbe,
    StepFailed,
)
from provisioner.rollout.plan import BatchSize
from provisioner.rollout.state import CHANGED, FAILED, SKIPPED, UNCORDONING, VERIFYING, ChangeKind

# The layout change's one step: the label set and the MIG manager at work. Its records and progress have
# called it "installing" since it first ran on the driver upgrade's steps.
APPLYING = "installing"
MIG = ChangeKind("mig-apply", {APPLYING: frozenset({VERIFYING})})
DEFAULT_STATE_TIMEOUT = 600.0
# After the MIG manager's success, the device plugin comes back (the manager restores its label) and the
# node advertises the layout's resources: how long that may take.
DEFAULT_ADVERTISE_TIMEOUT = 120.0


@dataclass
class MigOptions:
    batch: BatchSize
    strategy: str
    layouts: dict[str, str]  # host → layout name
    canary: int = 0
    max_fail: int = 0
    pause: bool = False
    drain: bool = False  # only GPU pods are evicted; the MIG manager takes the operands off itself
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    state_timeout: float = DEFAULT_STATE_TIMEOUT
    advertise_timeout: float = DEFAULT_ADVERTISE_TIMEOUT
    configs: Mapping[str, list[MigEntry]] = field(default_factory=dict)
    host_services: tuple[str, ...] = (KUBELET_SERVICE,)  # what the MIG manager may stop on a host

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": str(self.batch),
            "strategy": self.strategy,
            "layouts": dict(self.layouts),
            "canary": self.canary,
            "max_fail": self.max_fail,
            "pause": self.pause,
            "drain_timeout": self.drain_timeout,
            "state_timeout": self.state_timeout,
            "advertise_timeout": self.advertise_timeout,
        }


def expected_resources(
    wanted: Mapping[int, dict[str, int] | None], gpu_count: int, strategy: str
) -> dict[str, int]:
    """What the device plugin advertises for a layout: under mixed, nvidia.com/mig-<profile> per profile
    and nvidia.com/gpu for the GPUs left whole; under single, every MIG device as nvidia.com/gpu
    (NVIDIA k8s-device-plugin, MIG strategies)."""
    whole = gpu_count - sum(1 for counts in wanted.values() if counts is not None)
    if strategy == "single":
        devices = sum(n for counts in wanted.values() if counts for n in counts.values())
        return {"nvidia.com/gpu": devices + whole}
    out: dict[str, int] = {"nvidia.com/gpu": whole}
    for counts in wanted.values():
        for profile, n in (counts or {}).items():
            if n:
                out[f"nvidia.com/mig-{profile}"] = out.get(f"nvidia.com/mig-{profile}", 0) + n
    return out


def devices_problem(probe: MigProbe, wanted: Mapping[int, dict[str, int] | None]) -> str | None:
    """How the host's MIG mode and devices differ from the layout (None: they match)."""
    for gpu in probe.gpus:
        want = wanted.get(gpu.index)
        have = {p: n for p, n in (probe.mig_devices or {}).get(gpu.index, {}).items() if n}
        if want is None:
            if gpu.mig_mode == "Enabled":
                return f"GPU {gpu.index}: MIG mode is Enabled, the layout leaves it off"
            continue
        if gpu.mig_mode != "Enabled":
            return f"GPU {gpu.index}: MIG mode is {short_safe_text(gpu.mig_mode)}, the layout enables it"
        want = {p: n for p, n in want.items() if n}
        if have != want:
            return f"GPU {gpu.index}: MIG devices {have or 'none'}, the layout asks for {want}"
    return None


class MigRollout(Rollout[MigFleet, MigOptions]):
    """A layout change's host steps on the rollout's waves."""

    DONE = "applied"
    PROBE = MigProbe

    def _wanted(self, host: str, probe: MigProbe) -> dict[int, dict[str, int] | None]:
        layout = self.opt.layouts[host]
        return wanted_devices(self.opt.configs.get(layout, []), probe.device_ids)

    def _prepare(self, host: str, probe: HostProbe) -> bool:
        s = self.state.hosts[host]
        self._check()
        if probe.error or not isinstance(probe, MigProbe):
            self._end(host, FAILED, f"probe: {probe.error}")
            return False
        layout = self.opt.layouts[host]
        self._keep_baseline(host, probe)
        info = self._require_node(
            host, probe, "not cordoned or changed", "the MIG manager runs on nodes only"
        )
        if info is None:
            return False
        current = info.labels.get(CONFIG_LABEL)
        self.state.update(host, before=s.before or current or "unset", after=layout)
        done = (
            current == layout
            and info.labels.get(STATE_LABEL) == "success"
            and devices_problem(probe, self._wanted(host, probe)) is None
        )
        if done and not (s.cordoned_by_us or s.paused_labels):
            self._end(host, SKIPPED, f"{layout} already applied")
            return False
        if not self._cordon_and_drain(host, info.name, info.unschedulable):  # opt.drain False: GPU pods only
            return False
        if not s.paused_labels:
            # The operand labels as they are now: what a failed MIG manager run must leave them as.
            deploy = {
                k: v for k, v in info.labels.items() if k.startswith(OPERAND_LABEL_PREFIX) and v != PAUSED
            }
            self.state.update(host, paused_labels=deploy)
        return True

    def _change(self, hosts: list[str]) -> dict[str, ChangeOutcome]:
        if len(hosts) == 1:
            return {hosts[0]: self._apply_one(hosts[0])}
        with ThreadPoolExecutor(max_workers=min(len(hosts), 64), thread_name_prefix="gpuprov-mig") as pool:
            return dict(zip(hosts, pool.map(self._apply_one, hosts), strict=True))

    def _apply_one(self, host: str) -> ChangeOutcome:
        s = self.state.hosts[host]
        node = s.node
        assert node is not None
        layout = self.opt.layouts[host]
        try:
            self._step(host, APPLYING)
            labels = self.fleet.labels(node)
            if labels.get(CONFIG_LABEL) == layout and labels.get(STATE_LABEL) != "success":
                # The label already names the layout (an earlier attempt failed or timed out): the manager
                # ignores the same value written again, but a new manager pod reads it when it starts.
                self.fleet.kube.set_labels(node, {STATE_LABEL: None})
                self.fleet.restart_manager(node)
                self.progress(
                    host, f"{CONFIG_LABEL}={layout} already set: MIG manager pod restarted to retry"
                )
            else:
                # The old state label goes with the change, so that a stale "success" is never read as ours.
                self.fleet.kube.set_labels(node, {CONFIG_LABEL: layout, STATE_LABEL: None})
                self.progress(host, f"{CONFIG_LABEL}={layout}: waiting for the MIG manager")
            state, _labels = self.fleet.wait_state(node, layout, self.opt.state_timeout)
        except StepFailed as exc:
            return self._failed(host, node, exc.reason)
        if state == "success":
            return ChangeOutcome("ok")
        if state == "failed":
            log = self.fleet.manager_log(node)
            tail = f"; its log ends: {short_safe_text(log.splitlines()[-1])}" if log else ""
            why = f"the MIG manager reported {STATE_LABEL}=failed{tail}"
            return self._failed(host, node, why + self._host_services_back(host, node))
        return self._failed(
            host, node, f"the MIG manager did not report within {self.opt.state_timeout:g} s (state {state})"
        )

    def _failed(self, host: str, node: str, why: str) -> ChangeOutcome:
        """The layout was not applied: put back the operand labels the MIG manager paused (it leaves them
        paused on failure), so the node's device plugin and exporters come back; the node stays cordoned."""
        s = self.state.hosts[host]
        restored = ""
        try:
            labels = self.fleet.labels(node)
            back = {k: v for k, v in s.paused_labels.items() if labels.get(k) == PAUSED}
            if back:
                self.fleet.kube.set_labels(node, back)
                names = ", ".join(k.removeprefix(OPERAND_LABEL_PREFIX) for k in sorted(back))
                restored = f"; operand labels restored ({names})"
            self.state.update(host, paused_labels={})
        except StepFailed as exc:
            restored = f"; operand labels NOT restored: {exc.reason}"
        retry = " (gpuprov mig apply --resume restarts the node's MIG manager to retry)"
        return ChangeOutcome("failed", f"{why}{restored}; node left cordoned{retry}")

    def _host_services_back(self, host: str, node: str) -> str:
        """The manager has finished with a failure: start the host services it stopped and left stopped.
        It restarts them on failure only until its first success: mig-parted v0.15.0
        pkg/mig/reconfigure/reconfigure.go sets NoRestartHostSystemdServicesOnExit for good in
        restartHostGPUClients, so a later failure in the same pod leaves the kubelet stopped and the node
        NotReady. What this did, as the end of the host's reason."""
        try:
            started = self.fleet.start_stopped_services(host, self.opt.host_services)
        except StepFailed as exc:
            return f"; host services the MIG manager stopped NOT started again: {exc.reason}"
        if not started:
            return ""
        names = ", ".join(started)
        deadline = time.monotonic() + NODE_READY_WAIT
        while True:
            try:
                if self.fleet.node_ready(node):
                    return f"; {names} left stopped by the MIG manager: started again, node {node} Ready"
            except StepFailed:
                pass
            if time.monotonic() >= deadline or self.interrupted.is_set():
                return f"; {names} left stopped by the MIG manager: started again, but node {node} not Ready"
            time.sleep(max(self.fleet.poll_s, 0.05))

    def _complete(self, host: str, after: HostProbe) -> bool:
        self._check()
        if after.error or not isinstance(after, MigProbe):
            self._leave_cordoned(host, FAILED, f"verify: host not readable: {after.error}")
            return False
        s = self.state.hosts[host]
        assert s.node is not None
        wanted = self._wanted(host, after)
        problem = devices_problem(after, wanted)
        if problem:
            self._leave_cordoned(host, FAILED, f"verify: the MIG manager said success, but {problem}")
            return False
        expected = expected_resources(wanted, len(after.gpus), self.opt.strategy)
        # Other MIG resources the node still advertises count as wrong too (a profile the layout dropped).
        expected.update(
            {k: 0 for k in self._advertised(s.node) if k.startswith("nvidia.com/mig-") and k not in expected}
        )
        try:
            end = time.monotonic() + self.opt.advertise_timeout
            while True:
                got = self._advertised(s.node)
                wrong = [
                    f"{k}={got.get(k, 0)} (expected {v})"
                    for k, v in sorted(expected.items())
                    if got.get(k, 0) != v
                ]
                if not wrong:
                    break
                if time.monotonic() >= end:
                    self._leave_cordoned(host, FAILED, f"verify: node {s.node} advertises {', '.join(wrong)}")
                    return False
                self._check()
                time.sleep(self.fleet.poll_s)
        except StepFailed as exc:
            self._leave_cordoned(host, FAILED, f"verify: {exc.reason}")
            return False
        self._step(host, UNCORDONING)
        problems = self._put_back(host, s.node)
        if problems:
            self._leave_cordoned(
                host, FAILED, f"{self.opt.layouts[host]} applied, but " + "; ".join(problems)
            )
            return False
        shown = ", ".join(f"{k}={v}" for k, v in sorted(expected.items()) if v)
        self._end(host, CHANGED, f"advertises {shown or 'no GPU'}")
        return True

    def _advertised(self, node: str) -> dict[str, int]:
        try:
            return allocatable(self.fleet.node_doc(node))
        except StepFailed:
            return {}
