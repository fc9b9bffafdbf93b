"""What the rollout needs from the world: the GPU hosts (`Fleet`) and the cluster (`Kube`), as two small
interfaces, with what they return. The real ones are in adapters.py; the tests use fakes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from provisioner.errors import GpuprovError
from provisioner.hosttext import short_safe_text
from provisioner.upgrade.plan import DriverTarget, HostProbe

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
        target: DriverTarget,
        *,
        reboot_allowed: bool,
        on_step: Callable[[str, str], None],
    ) -> dict[str, InstallOutcome]: ...

    def interrupt(self) -> None: ...  # abort remote work in progress (Ctrl-C)

    def close(self) -> None: ...


ProgressFn = Callable[[str | None, str], None]
"""Progress reports: (host or None for the run, text). The CLI decides how they are shown."""
