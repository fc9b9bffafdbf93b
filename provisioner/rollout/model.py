"""What a rolling change needs from the world: the hosts (`Fleet`) and the cluster (`Kube`), as two small
interfaces, with what they return. The real cluster is kube.py's; each client brings its own fleet, and
the tests fakes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.errors import GpuprovError
from provisioner.hosttext import short_safe_text

# The GPU Operator deploys its operands (device plugin, DCGM exporter, validator, ...) on a node per
# `nvidia.com/gpu.deploy.<operand>` labels. `nvidia.com/gpu.deploy.operands=false` is its documented switch
# to take them all off a node; when it goes, the operator adds missing state labels as "true" and keeps
# the values it finds, so the labels recorded before are put back as they were.
OPERAND_LABEL_PREFIX = "nvidia.com/gpu.deploy."
OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
DEFAULT_DRAIN_TIMEOUT = 300.0


class StepFailed(GpuprovError):
    """A host action failed; `reason` says why in one line (it ends up in the summary and the state)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class HostProbe:
    """Who a host is, read before a node is touched: its node name, its /etc/machine-id and the address it
    was reached at. Each client's probe adds what its change needs to know; read-only."""

    host: str
    error: str | None = None  # why the host could not be probed
    node: str | None = None  # the host's Kubernetes node name (its hostname, as kubeadm registers it)
    # Why its hostname cannot name a node (host data is untrusted).
    node_error: str | None = None
    machine_id: str | None = None
    address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "error": self.error,
            "machine_id": self.machine_id,
            "address": self.address,
            "node_error": self.node_error,
        }


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
class ChangeOutcome:
    """How the change itself went on one host."""

    result: str  # "ok" | "failed" | "reboot-pending" | "interrupted"
    reason: str = ""


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

    def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None: ...  # None removes

    def taint(self, name: str, key: str, value: str | None, effect: str = "NoSchedule") -> None: ...

    def event(self, name: str, reason: str, message: str, warning: bool = False) -> None: ...


class Fleet(Protocol):
    """The hosts; a client's fleet adds the change itself."""

    @property
    def kube(self) -> Kube | None: ...  # None: no control plane in the inventory (hosts are not nodes)

    def probe(self, hosts: Sequence[str]) -> Mapping[str, HostProbe]: ...  # read-only, in parallel

    def interrupt(self) -> None: ...  # abort remote work in progress (Ctrl-C)

    def close(self) -> None: ...


ProgressFn = Callable[[str | None, str], None]
"""Progress reports: (host or None for the run, text). The CLI decides how they are shown."""
