"""A fake fleet for the rolling-upgrade tests: GPU hosts and a cluster held in memory.

It behaves like the lab: a driver install can be made to fail (`install-fail`), a drain to time out
(`drain-block`), a host to drop off (`unreachable`); modules that are in use cannot be unloaded, so
the new driver only loads after a reboot. Every host-facing call is logged, so tests can tell what
was touched and in which order. The tests at the bottom pin the fake's own behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from provisioner.rollout.model import ChangeOutcome, NodeInfo, StepFailed
from provisioner.upgrade.plan import DriverProbe, DriverTarget
from provisioner.upgrade.rollout import StepFn

OPERAND_LABELS = {
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.dcgm-exporter": "true",
    "nvidia.com/gpu.deploy.driver": "pre-installed",
}


@dataclass
class FakeHost:
    name: str
    version: str | None = "570.195.03"
    gpus: int = 1
    faults: set[str] = field(default_factory=set)
    xids: list[str] = field(default_factory=list)
    # the cluster's view of the node
    node: bool = True
    unschedulable: bool = False
    labels: dict[str, str] = field(default_factory=lambda: dict(OPERAND_LABELS))
    annotations: dict[str, str] = field(default_factory=dict)
    installed: str | None = None  # package version on disk, when it differs from the loaded module
    lost: int = 0  # GPUs the driver no longer sees
    # /etc/machine-id as the host reports it; the node's machineID is the same unless a test says not
    machine_id: str = ""
    node_machine_id: str | None = None
    node_error: str | None = None  # what the real fleet says of a hostname that is no node name
    # MIG: the devices the layout gives (GPU index → profile → count) and those present now; a driver
    # reload destroys them, and the MIG manager makes them again when the operands come back
    # (`mig-reapply-fails`: it reports failed instead).
    mig_layout: dict[int, dict[str, int]] = field(default_factory=dict)
    mig_now: dict[int, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import hashlib

        self.machine_id = self.machine_id or hashlib.md5(self.name.encode()).hexdigest()


class FakeKube:
    def __init__(self, fleet: FakeFleet) -> None:
        self.fleet = fleet

    def _host(self, name: str) -> FakeHost:
        host = self.fleet.hosts.get(name)
        if host is None or not host.node:
            raise StepFailed(f'nodes "{name}" not found')
        return host

    def node(self, name: str) -> NodeInfo | None:
        self.fleet.log("node", name)
        host = self.fleet.hosts.get(name)
        if host is None or not host.node:
            return None
        mid = host.machine_id if host.node_machine_id is None else host.node_machine_id
        return NodeInfo(name, host.unschedulable, dict(host.labels), machine_id=mid)

    def cordon(self, name: str) -> None:
        self.fleet.log("cordon", name)
        self._host(name).unschedulable = True

    def uncordon(self, name: str) -> None:
        self.fleet.log("uncordon", name)
        self._host(name).unschedulable = False

    def drain(self, name: str, timeout: float) -> None:
        self.fleet.log("drain", name)
        if "drain-block" in self._host(name).faults:
            raise StepFailed(f"drain did not complete within {timeout:g}s: cannot evict pod default/blocker")

    def evict_gpu_pods(self, name: str, timeout: float) -> None:
        self.fleet.log("evict", name)
        if "drain-block" in self._host(name).faults:
            raise StepFailed(f"GPU pods not evicted within {timeout:g}s")

    def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        self.fleet.log("label", name, dict(labels))
        host = self._host(name)
        operands_back = labels.get("nvidia.com/gpu.deploy.operands", "") != "false" and (
            host.labels.get("nvidia.com/gpu.deploy.operands") == "false"
        )
        if operands_back and host.mig_layout:
            # the MIG manager pod starts again and applies the node's layout label
            failed = "mig-reapply-fails" in host.faults
            host.labels["nvidia.com/mig.config.state"] = "failed" if failed else "success"
            if not failed:
                host.mig_now = {i: dict(c) for i, c in host.mig_layout.items()}
        for k, v in labels.items():
            if v is None:
                host.labels.pop(k, None)
            else:
                host.labels[k] = v
        if host.labels.get("nvidia.com/gpu.deploy.operands") == "false":
            # as the GPU Operator does: with operands off, the node loses its state labels
            for k in [
                k
                for k in host.labels
                if k.startswith("nvidia.com/gpu.deploy.") and not k.endswith(".operands")
            ]:
                del host.labels[k]

    def wait_operands_gone(self, name: str, timeout: float) -> None:
        self.fleet.log("wait-operands", name)

    def annotate(self, name: str, text: str | None) -> None:
        self.fleet.log("annotate", name, text)
        host = self._host(name)
        if text is None:
            host.annotations.pop("gpuprov.io/driver-upgrade", None)
        else:
            host.annotations["gpuprov.io/driver-upgrade"] = text


class FakeFleet:
    """In-memory GPU hosts; `kube=False` makes a fleet without a control plane."""

    def __init__(
        self,
        hosts: Sequence[FakeHost],
        *,
        kube: bool = True,
        available: Sequence[str] = ("570.195.03", "580.95.05", "580.159.04"),
    ) -> None:
        self.hosts = {h.name: h for h in hosts}
        self.kube = FakeKube(self) if kube else None
        self.available = list(available)
        self.calls: list[tuple[object, ...]] = []
        self.upgrade_calls: list[list[str]] = []
        self.closed = False
        self.interrupts = 0
        # called with the host name when its install starts (tests interrupt or crash from here)
        self.on_install: Callable[[str], None] | None = None
        self._lock = threading.Lock()

    def log(self, *call: object) -> None:
        with self._lock:
            self.calls.append(call)

    def touched(self, host: str) -> list[str]:
        """Operations on the host that change something."""
        return [str(c[0]) for c in self.calls if c[1] == host and c[0] not in ("probe", "node")]

    def probe(self, hosts: Sequence[str]) -> dict[str, DriverProbe]:
        out = {}
        for name in hosts:
            self.log("probe", name)
            h = self.hosts[name]
            if "unreachable" in h.faults:
                out[name] = DriverProbe(name, error="connection to 192.0.2.1:22 timed out after 10 s")
                continue
            loaded = h.version
            out[name] = DriverProbe(
                name,
                loaded=loaded,
                gpus_pci=h.gpus,
                gpus_driver=h.gpus - h.lost if loaded else None,
                xids=tuple(h.xids),
                node=name,
                driver_ok=loaded is not None,
                driver_detail="" if loaded else "NVIDIA kernel module not loaded",
                machine_id=h.machine_id,
                node_error=h.node_error,
                mig_devices={i: dict(c) for i, c in h.mig_now.items()} if loaded else None,
            )
        return out

    def _resolve(self, target: DriverTarget) -> str | None:
        matches = [v for v in self.available if target.matches(v)]
        return matches[-1] if matches else None

    def upgrade(
        self, hosts: Sequence[str], target: DriverTarget, *, reboot_allowed: bool, on_step: StepFn
    ) -> dict[str, ChangeOutcome]:
        self.upgrade_calls.append(list(hosts))
        out: dict[str, ChangeOutcome] = {}
        for name in hosts:
            h = self.hosts[name]
            self.log("upgrade", name)
            on_step(name, "stopping")
            busy = "unload-busy" in h.faults
            on_step(name, "installing")
            if self.on_install is not None:
                self.on_install(name)
            if "interrupt-here" in h.faults:
                out[name] = ChangeOutcome("interrupted", "canceled")
                continue
            version = self._resolve(target)
            if "install-fail" in h.faults or version is None:
                out[name] = ChangeOutcome(
                    "failed", f"nvidia_driver: Install the driver packages: dpkg: error processing {name}"
                )
                continue
            h.installed = version
            if busy:
                if reboot_allowed:
                    on_step(name, "rebooting")
                    h.version = version
                    h.installed = None
                    out[name] = ChangeOutcome("ok")
                else:
                    out[name] = ChangeOutcome("reboot-pending", "nvidia is in use; reboot to load " + version)
                continue
            on_step(name, "reloading")
            h.version = version
            h.installed = None
            h.mig_now = {}  # the module unload destroyed the GPU instances
            if "lose-gpu" in h.faults:
                h.lost = 1
            if "xid-after" in h.faults:
                h.xids.append("[ 99.1] NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.")
            out[name] = ChangeOutcome("ok")
        return out

    def interrupt(self) -> None:
        self.interrupts += 1

    def close(self) -> None:
        self.closed = True


def fleet_of(n: int, **kw: object) -> FakeFleet:
    return FakeFleet([FakeHost(f"gpu{i}") for i in range(1, n + 1)], **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ the fake's own rules


def test_fake_drain_block_raises_and_install_fail_fails() -> None:
    fleet = FakeFleet([FakeHost("gpu1", faults={"drain-block", "install-fail"})])
    assert fleet.kube is not None
    with pytest.raises(StepFailed, match="drain did not complete"):
        fleet.kube.drain("gpu1", 5)
    res = fleet.upgrade(["gpu1"], DriverTarget("580"), reboot_allowed=False, on_step=lambda h, s: None)
    assert res["gpu1"].result == "failed"
    assert fleet.hosts["gpu1"].version == "570.195.03"


def test_fake_busy_modules_need_a_reboot() -> None:
    fleet = FakeFleet([FakeHost("gpu1", faults={"unload-busy"})])
    res = fleet.upgrade(["gpu1"], DriverTarget("580"), reboot_allowed=False, on_step=lambda h, s: None)
    assert res["gpu1"].result == "reboot-pending"
    assert fleet.hosts["gpu1"].version == "570.195.03"
    assert fleet.hosts["gpu1"].installed == "580.159.04"
