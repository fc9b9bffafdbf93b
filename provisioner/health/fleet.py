"""The hosts and the cluster behind `gpuprov remediate`: who each host is and what its GPUs show (read
over SSH with verify's probes), and the repairs themselves — a GPU reset, a reboot — over SSH as root.

A GPU reset (`nvidia-smi -r -i N`) needs the GPU free. NVIDIA's nvidia-smi documentation for -r/--gpu-reset
says so: no process may hold the device, the persistence daemon and DCGM's host engine included, so the
host services that hold GPUs while nothing runs on them are stopped around the reset and started again
after it, whatever its outcome. The pods that use GPUs are gone (drained) and the GPU Operator's operands
taken off the node (the rollout engine) before this is reached. A compute process still on the GPU
after that is named and the reset is not tried.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.checks import HostFacts, probes_for
from provisioner.executors import ExecutorError, SshExecutor
from provisioner.health.decide import HostPlan, plan_host
from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.hosttext import last_line, short_safe_text
from provisioner.migapply.fleet import allocatable
from provisioner.probes.dcgm import DCGM_UNITS
from provisioner.probes.kernel_log import pci_device
from provisioner.rollout.hosts import SshFleet, read_identity
from provisioner.rollout.model import HostProbe, StepFailed
from provisioner.verification import collect

# The annotation that says why remediation left a node out, and the taint that keeps work off it until
# an operator has looked (never removed by gpuprov on its own).
ANNOTATION = "gpuprov.io/needs-service"
SERVICE_TAINT = "gpuprov.io/needs-service"
EVIDENCE_CHECKS = ("gpu.xid",)  # kernel log, PCI list, nvidia-smi -q -x
# Host services that hold /dev/nvidia* while no workload runs: stopped around a GPU reset when active.
# How often a node under repair is asked again (back from its reboot, Ready, advertising its GPUs): one
# kubectl call or SSH connection each, for at most --max-concurrent nodes at once.
POLL_SECONDS = 2.0
RESET_HOLDER_SERVICES = ("nvidia-persistenced.service", *DCGM_UNITS)
DEFAULT_REBOOT_TIMEOUT = 900.0
DEFAULT_PROBE_TIMEOUT = 180.0

_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_APP_ROW = re.compile(
    r"^\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]),\s*([0-9]{1,10}),\s*(.*)$"
)
_QUERY_APPS = [
    "nvidia-smi",
    "--query-compute-apps=gpu_bus_id,pid,process_name",
    "--format=csv,noheader",
]


@dataclass
class HealProbe(HostProbe):
    """Who the host is, its boot, and what its GPUs show now (the plan decided from that evidence)."""

    boot_id: str | None = None
    uptime: float | None = None  # seconds since boot when read
    plan: HostPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "boot_id": self.boot_id,
            "plan": self.plan.to_json() if self.plan is not None else None,
        }


@dataclass
class ResetOutcome:
    ok: bool
    reason: str
    uptime: float | None = None  # the host's uptime just before the reset
    services: list[str] = field(default_factory=list)  # holder services stopped and started again


def _first_lines(text: str, n: int = 2) -> str:
    """nvidia-smi's first lines, joined: what it says of each GPU comes before its advice."""
    return " ".join([line.strip() for line in text.splitlines() if line.strip()][:n])


def parse_uptime(text: str) -> float | None:
    """/proc/uptime's first field; None when it is not one."""
    first = text.split()[0] if text.split() else ""
    if not re.fullmatch(r"[0-9]{1,10}(\.[0-9]{1,3})?", first):
        return None
    return float(first)


def parse_compute_apps(text: str) -> list[tuple[str, int, str]]:
    """`nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name --format=csv,noheader`: (bus id, pid,
    name) rows; lines that are no row (a "No running processes found" note) are left out."""
    rows = []
    for line in text.splitlines():
        m = _APP_ROW.match(line)
        if not m:
            continue
        try:
            pid = parse_int(m.group(2), lo=0, hi=4_194_304, what="pid")
        except HostNumberError:
            continue
        rows.append((m.group(1).lower(), pid, short_safe_text(m.group(3).strip(), 60)))
    return rows


class HealFleet(SshFleet[HealProbe]):
    """GPU hosts over SSH; the cluster through kubectl on the first control-plane host."""

    probe_threads = "gpuprov-heal"

    def __init__(
        self,
        *,
        hosts: Sequence[Any],
        control_plane: Any | None,
        connect_timeout: float = 10.0,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        poll_s: float = POLL_SECONDS,
    ) -> None:
        super().__init__(hosts, control_plane, annotation=ANNOTATION, connect_timeout=connect_timeout)
        self.probe_timeout = probe_timeout
        self.poll_s = poll_s
        # Per host: the boot id, and the GPUs (PCI domain:bus:device) reset in that boot → the host's
        # uptime just before the reset.
        self.reset_at: dict[str, tuple[str, dict[str, float]]] = {}
        self.last_boot: dict[str, str | None] = {}  # the boot id each host's last probe read

    def reset_marks(self, host: str) -> dict[str, float]:
        """The GPUs reset in the host's current boot (as its last probe read it) → the uptime just before
        each reset; none after another boot, whose kernel log starts afresh."""
        boot, marks = self.reset_at.get(host, ("", {}))
        return dict(marks) if boot and boot == self.last_boot.get(host) else {}

    # -- reading

    def _probe_one(self, name: str) -> HealProbe:
        try:
            with self._session(name) as (ex, sudo):
                who = read_identity(ex)
                boot_id = ex.run(["cat", "/proc/sys/kernel/random/boot_id"], 15).stdout.strip()
                uptime = parse_uptime(ex.run(["cat", "/proc/uptime"], 15).stdout)
                results = collect(ex, probes_for(EVIDENCE_CHECKS), self.probe_timeout, None, bool(sudo))
        except ExecutorError as exc:
            return HealProbe(name, error=exc.reason)
        probe = HealProbe(
            name, **who, boot_id=boot_id if _BOOT_ID.fullmatch(boot_id) else None, uptime=uptime
        )
        self.last_boot[name] = probe.boot_id
        probe.plan = plan_host(HostFacts(name, results), reset_at=self.reset_marks(name))
        if probe.plan.error:
            probe.error = f"evidence unreadable: {probe.plan.error}"
        return probe

    # -- repairing

    def reset_gpus(self, host: str, gpus: Mapping[int, str]) -> ResetOutcome:
        """`nvidia-smi -r -i N` for each GPU (index → PCI bus id), with the holder services stopped around
        it. Not tried when a compute process still holds one of them (named in the reason)."""
        try:
            with self._session(host) as (ex, sudo):
                apps = ex.run([*sudo, *_QUERY_APPS], 60)
                held = [
                    (bus, pid, prog)
                    for bus, pid, prog in parse_compute_apps(apps.stdout if apps.rc == 0 else "")
                    if pci_device(bus) in {pci_device(b) for b in gpus.values()}
                ]
                if held:
                    who = ", ".join(f"pid {pid} ({prog}) on {bus}" for bus, pid, prog in held[:5])
                    return ResetOutcome(False, f"GPU reset not tried: a process holds the GPU: {who}")
                stopped = []
                for unit in RESET_HOLDER_SERVICES:
                    if ex.run(["systemctl", "-q", "is-active", "--", unit], 30).rc == 0:
                        res = ex.run([*sudo, "systemctl", "stop", "--", unit], 120)
                        if res.rc != 0:
                            self._start(ex, sudo, stopped)
                            why = last_line(res.stderr) or f"exit {res.rc}"
                            return ResetOutcome(False, f"GPU reset not tried: systemctl stop {unit}: {why}")
                        stopped.append(unit)
                try:
                    uptime = parse_uptime(ex.run(["cat", "/proc/uptime"], 15).stdout)
                    boot = ex.run(["cat", "/proc/sys/kernel/random/boot_id"], 15).stdout.strip()
                    said: list[str] = []
                    failed = False
                    for index in sorted(gpus):
                        res = ex.run([*sudo, "nvidia-smi", "-r", "-i", str(index)], 300)
                        said.append(
                            f"GPU {index}: {_first_lines(res.stdout + res.stderr) or f'exit {res.rc}'}"
                        )
                        if res.rc != 0:
                            failed = True
                            break
                        if uptime is not None:
                            known, marks = self.reset_at.get(host, (boot, {}))
                            marks = marks if known == boot else {}
                            marks[pci_device(gpus[index])] = uptime
                            self.reset_at[host] = (boot, marks)
                finally:
                    problems = self._start(ex, sudo, stopped)
        except ExecutorError as exc:
            return ResetOutcome(False, f"GPU reset: host {host}: {exc.reason}")
        text = "; ".join(short_safe_text(s, 200) for s in said)
        if problems:
            text += f"; {'; '.join(problems)}"
        if failed:
            return ResetOutcome(False, f"GPU reset failed: {text}", uptime, stopped)
        return ResetOutcome(not problems, f"GPU reset: {text}", uptime, stopped)

    @staticmethod
    def _start(ex: SshExecutor, sudo: list[str], units: list[str]) -> list[str]:
        problems = []
        for unit in units:
            res = ex.run([*sudo, "systemctl", "start", "--", unit], 120)
            if res.rc != 0:
                problems.append(f"{unit} not started again: {last_line(res.stderr) or f'exit {res.rc}'}")
        return problems

    def reboot(self, host: str, timeout: float, stop: Callable[[], bool]) -> str:
        """Reboot the host and wait until it answers with a new boot id; StepFailed otherwise."""
        try:
            with self._session(host) as (ex, sudo):
                before = ex.run(["cat", "/proc/sys/kernel/random/boot_id"], 15).stdout.strip()
                # The connection may end before systemctl answers: the new boot id is the proof.
                with contextlib.suppress(ExecutorError):
                    ex.run([*sudo, "systemctl", "reboot"], 30)
        except ExecutorError as exc:
            raise StepFailed(f"reboot: host {host}: {exc.reason}") from exc
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline and not stop():
            time.sleep(self.poll_s)
            try:
                with self._session(host) as (ex, _sudo):
                    now = ex.run(["cat", "/proc/sys/kernel/random/boot_id"], 15).stdout.strip()
            except ExecutorError as exc:
                last = exc.reason
                continue
            if now and now != before:
                self.reset_at.pop(host, None)
                return now
            last = "same boot id: not rebooted yet"
        raise StepFailed(f"reboot: {host} not back within {timeout:g} s ({last})")

    # -- the cluster

    def node_ready(self, node: str, boot_id: str | None = None) -> bool:
        """The node is Ready — and, given `boot_id`, its kubelet reports that boot (status.nodeInfo.bootID):
        right after a reboot the API server may still show the node Ready from before it."""
        if self.kube is None:
            return True
        res = self.kube.kubectl(
            "get", "node", "-o",
            'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.nodeInfo.bootID}', "--", node,
        )  # fmt: skip
        if res.rc != 0:
            return False
        ready, _, booted = res.stdout.strip().partition(" ")
        return ready == "True" and (boot_id is None or booted.strip() == boot_id)

    def wait_advertised(self, node: str, timeout: float, stop: Callable[[], bool]) -> bool:
        """Wait until the node's allocatable NVIDIA resources are more than none (the device plugin is
        back); True when they are. Without a cluster there is nothing to wait for."""
        if self.kube is None:
            return True
        deadline = time.monotonic() + timeout
        while not stop():
            res = self.kube.kubectl("get", "node", "-o", "json", "--", node)
            with contextlib.suppress(ValueError, AttributeError):
                if res.rc == 0 and any(allocatable(json.loads(res.stdout)).values()):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return False

    def wait_ready(
        self, node: str, timeout: float, stop: Callable[[], bool], boot_id: str | None = None
    ) -> bool:
        deadline = time.monotonic() + timeout
        while not stop():
            with contextlib.suppress(StepFailed):
                if self.node_ready(node, boot_id):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return False
