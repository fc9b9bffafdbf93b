"""The hosts and the cluster behind `gpuprov mig apply`.

Hosts are read over SSH (read-only: the GPUs with their PCI device ids and MIG mode, the MIG devices
`nvidia-smi -L` lists, who the host is). The cluster is driven through kubectl on the first control-plane
host (provisioner.rollout.kube), where the GPU Operator's MIG manager is told what to do by the node
label protocol of NVIDIA mig-parted's k8s-mig-manager:

- gpuprov sets `nvidia.com/mig.config=<layout>`; the manager takes the GPU operands off the node (their
  `nvidia.com/gpu.deploy.<operand>` labels become `paused-for-mig-change`), stops the host's GPU clients,
  applies the layout with nvidia-mig-parted, restarts the clients, puts the operand labels back and
  reports through `nvidia.com/mig.config.state`: pending, rebooting, success or failed.
- The manager acts on label changes only: writing the same value again does nothing (NVIDIA
  gpu-operator#2833). It reads the label when it starts, so a new manager pod retries a layout.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import InputError
from provisioner.executors import ExecutorError
from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.hosttext import last_line, short_safe_text
from provisioner.mig import CONFIG_LABEL, STATE_LABEL, parse_mig_devices
from provisioner.rollout.hosts import SshFleet, read_identity
from provisioner.rollout.kube import KubectlOverSsh, valid_node_name
from provisioner.rollout.model import HostProbe, StepFailed
from provisioner.yamlfile import load_strict

PAUSED = "paused-for-mig-change"
ANNOTATION = "gpuprov.io/mig-apply"  # on a node left cordoned: why
MANAGER_APP = "nvidia-mig-manager"
# The chart's defaults when the ClusterPolicy leaves them out (gpu-operator v25.10.0 api/nvidia/v1
# clusterpolicy_types.go: MIGStrategy single; the MIG manager's default config map).
DEFAULT_STRATEGY = "single"
DEFAULT_CONFIG_MAP = "default-mig-parted-config"
# The host services the MIG manager stops around a change when the driver is the host's: its kubelet
# (HOST_KUBELET_SYSTEMD_SERVICE's default, mig-parted v0.15.0 cmd/nvidia-mig-manager/main.go) and the
# gpu-clients ConfigMap's `systemd-services` (gpu-operator v26.7.0
# assets/state-mig-manager/0410_configmap.yaml; the ClusterPolicy names it: migManager.gpuClientsConfig).
KUBELET_SERVICE = "kubelet.service"
DEFAULT_CLIENTS_MAP = "default-gpu-clients"
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9@._-]{0,126}\.service")
NODE_READY_WAIT = 180.0  # seconds for a restarted kubelet to report its node Ready

_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,pci.device_id,driver_version,mig.mode.current",
    "--format=csv,noheader",
]
# index, pci.device_id, driver_version, mig.mode.current; the index and version in ASCII digits of the
# length nvidia-smi prints.
_ROW = re.compile(
    r"^\s*([0-9]{1,4}),\s*0x([0-9A-Fa-f]{4})([0-9A-Fa-f]{4}),\s*([0-9]{1,4}(?:\.[0-9]{1,4}){1,3}),\s*(.+?)\s*$"
)


@dataclass
class GpuRow:
    index: int
    device_id: int
    mig_mode: str  # Enabled | Disabled | [N/A]


@dataclass
class MigProbe(HostProbe):
    """What `mig apply` reads from a host: its driver version, GPUs and MIG devices, besides who it is."""

    loaded: str | None = None  # the driver version nvidia-smi reports
    gpus: list[GpuRow] = field(default_factory=list)
    mig_devices: dict[int, dict[str, int]] | None = None  # GPU index → MIG profile → devices

    @property
    def device_ids(self) -> dict[int, int]:
        return {g.index: g.device_id for g in self.gpus}

    def to_dict(self) -> dict[str, Any]:
        return {
            "loaded": self.loaded,
            **super().to_dict(),
            "mig_devices": None
            if self.mig_devices is None
            else {str(i): dict(c) for i, c in self.mig_devices.items()},
            "gpus": [[g.index, f"0x{g.device_id:04x}", g.mig_mode] for g in self.gpus],
        }


def parse_gpu_rows(text: str) -> list[GpuRow]:
    """`nvidia-smi --query-gpu=index,pci.device_id,driver_version,mig.mode.current` (pci.device_id reads
    like 0x233510DE: device, then vendor); ValueError on anything else."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _ROW.match(line)
        if not m or m.group(3).upper() != "10DE":
            raise ValueError(f"unexpected nvidia-smi line: {short_safe_text(line)!r}")
        rows.append(GpuRow(int(m.group(1)), int(m.group(2), 16), m.group(5)))
    return rows


@dataclass(frozen=True)
class ClusterMig:
    """The GPU Operator's MIG settings as the cluster has them."""

    strategy: str
    manager_enabled: bool
    config_map: str
    config_text: str  # config.yaml of that ConfigMap
    host_services: tuple[str, ...] = (KUBELET_SERVICE,)  # what the manager may stop on a host


def parse_gpu_clients(text: str) -> tuple[str, ...]:
    """The `systemd-services` of a gpu-clients clients.yaml, kubelet first; names that are not plain
    systemd service names are dropped (they come from the cluster and become host command arguments)."""
    try:
        doc = load_strict(text, "clients.yaml")
    except InputError:
        return (KUBELET_SERVICE,)
    listed = doc.get("systemd-services") if isinstance(doc, dict) else None
    names = [KUBELET_SERVICE]
    for name in listed if isinstance(listed, list) else []:
        if isinstance(name, str) and _SERVICE.fullmatch(name) and name not in names:
            names.append(name)
    return tuple(names[:64])


class MigFleet(SshFleet[MigProbe]):
    """GPU hosts over SSH; the cluster through kubectl on the first control-plane host."""

    kube: KubectlOverSsh  # mig apply needs a control plane: the verb refuses an inventory without one
    probe_threads = "gpuprov-mig"

    def __init__(
        self, *, hosts: Sequence[Any], control_plane: Any, namespace: str, poll_s: float = 2.0
    ) -> None:
        super().__init__(hosts, control_plane, annotation=ANNOTATION)
        self.namespace = namespace
        self.poll_s = poll_s

    # -- hosts

    def _probe_one(self, name: str) -> MigProbe:
        try:
            with self._session(name) as (ex, sudo):
                who = read_identity(ex)
                query = ex.run([*sudo, *_QUERY], 60)
                listing = ex.run([*sudo, "nvidia-smi", "-L"], 60)
        except ExecutorError as exc:
            return MigProbe(name, error=exc.reason)
        probe = MigProbe(name, **who)
        if query.rc != 0:
            probe.error = f"nvidia-smi: {last_line(query.stdout + query.stderr) or f'exit {query.rc}'}"
            return probe
        try:
            probe.gpus = parse_gpu_rows(query.stdout)
        except ValueError as exc:
            probe.error = str(exc)
            return probe
        probe.loaded = query.stdout.split(",")[2].strip() if probe.gpus else None
        try:
            probe.mig_devices = parse_mig_devices(listing.stdout) if listing.rc == 0 else None
        except ValueError as exc:
            probe.error = str(exc)
        return probe

    # -- the cluster

    def _json(self, what: str, *args: str) -> dict[str, Any]:
        res = self.kube.kubectl(*args)
        if res.rc != 0:
            raise StepFailed(f"kubectl {what}: {last_line(res.stderr) or f'exit {res.rc}'}")
        try:
            doc = json.loads(res.stdout)
        except ValueError as exc:
            raise StepFailed(f"kubectl {what}: not JSON: {last_line(res.stdout)}") from exc
        if not isinstance(doc, dict):
            raise StepFailed(f"kubectl {what}: not a JSON object")
        return doc

    def cluster_mig(self) -> ClusterMig:
        """The ClusterPolicy's MIG strategy and MIG manager config, and that config's text."""
        items = self._json("get clusterpolicies", "get", "clusterpolicies.nvidia.com", "-o", "json")
        policies = items.get("items") or []
        if len(policies) != 1:
            raise StepFailed(f"expected one GPU Operator ClusterPolicy, found {len(policies)}")
        spec = policies[0].get("spec") or {}
        manager = spec.get("migManager") or {}
        name = str((manager.get("config") or {}).get("name") or DEFAULT_CONFIG_MAP)
        cm = self._json(
            f"get configmap {self.namespace}/{name}",
            "get",
            "configmap",
            "-n",
            self.namespace,
            "-o",
            "json",
            "--",
            name,
        )
        text = (cm.get("data") or {}).get("config.yaml")
        if not isinstance(text, str):
            raise StepFailed(f"configmap {self.namespace}/{name} has no config.yaml")
        return ClusterMig(
            strategy=str((spec.get("mig") or {}).get("strategy") or DEFAULT_STRATEGY),
            manager_enabled=manager.get("enabled", True) is not False,
            config_map=name,
            config_text=text,
            host_services=self._gpu_clients(manager),
        )

    def _gpu_clients(self, manager: Mapping[str, Any]) -> tuple[str, ...]:
        name = str((manager.get("gpuClientsConfig") or {}).get("name") or DEFAULT_CLIENTS_MAP)
        try:
            cm = self._json(
                f"get configmap {self.namespace}/{name}",
                "get", "configmap", "-n", self.namespace, "-o", "json", "--", name,
            )  # fmt: skip
        except StepFailed:
            return (KUBELET_SERVICE,)  # the kubelet is stopped whatever the list says
        text = (cm.get("data") or {}).get("clients.yaml")
        return parse_gpu_clients(text) if isinstance(text, str) else (KUBELET_SERVICE,)

    def node_doc(self, node: str) -> dict[str, Any]:
        if not valid_node_name(node):
            raise StepFailed(f"{short_safe_text(node)!r} is not a valid Kubernetes node name")
        return self._json(f"get node {node}", "get", "node", "-o", "json", "--", node)

    def labels(self, node: str) -> dict[str, str]:
        meta = self.node_doc(node).get("metadata") or {}
        return {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}

    def restart_manager(self, node: str) -> None:
        """Delete the node's MIG manager pod: its DaemonSet starts a new one, which applies the label."""
        res = self.kube.kubectl(
            "delete", "pod", "-n", self.namespace, "-l", f"app={MANAGER_APP}",
            "--field-selector", f"spec.nodeName={node}", "--wait=false",
        )  # fmt: skip
        if res.rc != 0:
            raise StepFailed(f"kubectl delete the MIG manager pod on {node}: {last_line(res.stderr)}")

    def manager_log(self, node: str, lines: int = 5) -> str:
        """The last lines of the node's MIG manager log (best effort: what it said about a failure).
        `kubectl logs` takes a pod, not a field selector: the node's manager pod is looked up first."""
        found = self.kube.kubectl(
            "get", "pods", "-n", self.namespace, "-l", f"app={MANAGER_APP}",
            "--field-selector", f"spec.nodeName={node}", "-o", "jsonpath={.items[*].metadata.name}",
        )  # fmt: skip
        pods = found.stdout.split() if found.rc == 0 else []
        if not pods or not valid_node_name(pods[0]):
            return ""
        res = self.kube.kubectl(
            "logs", "-n", self.namespace, "-c", MANAGER_APP, f"--tail={lines}", "--", pods[0]
        )  # fmt: skip
        return res.stdout.strip() if res.rc == 0 else ""

    def wait_state(self, node: str, layout: str, timeout: float) -> tuple[str, dict[str, str]]:
        """Wait until the MIG manager reports success or failed for `layout`: (state, labels);
        ("timeout", labels) when it did not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            labels = self.labels(node)
            state = labels.get(STATE_LABEL, "")
            if labels.get(CONFIG_LABEL) != layout:
                raise StepFailed(
                    f"{CONFIG_LABEL} changed to {short_safe_text(labels.get(CONFIG_LABEL, 'nothing'))!r} "
                    "while gpuprov waited: someone else is changing this node's layout"
                )
            if state in ("success", "failed"):
                return state, labels
            if time.monotonic() >= deadline:
                return "timeout", labels
            time.sleep(self.poll_s)

    def start_stopped_services(self, host: str, services: Sequence[str]) -> list[str]:
        """Start each of `services` that is enabled on `host` but not running; the names started.
        StepFailed when the host cannot be reached or a start fails."""
        started = []
        try:
            with self._session(host) as (ex, sudo):
                for name in services:
                    if not _SERVICE.fullmatch(name):
                        continue
                    if ex.run(["systemctl", "-q", "is-active", "--", name], 30).rc == 0:
                        continue
                    if ex.run(["systemctl", "-q", "is-enabled", "--", name], 30).rc != 0:
                        continue  # absent or disabled: not something the manager stopped
                    res = ex.run([*sudo, "systemctl", "start", "--", name], 120)
                    if res.rc != 0:
                        why = last_line(res.stderr) or f"exit {res.rc}"
                        raise StepFailed(f"systemctl start {name}: {why}")
                    started.append(name)
        except ExecutorError as exc:
            raise StepFailed(f"host {host}: {exc.reason}") from exc
        return started

    def node_ready(self, node: str) -> bool:
        conditions = (self.node_doc(node).get("status") or {}).get("conditions") or []
        return any(
            isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        )


def allocatable(node_doc: Mapping[str, Any]) -> dict[str, int]:
    """The node's allocatable NVIDIA resources (nvidia.com/gpu, nvidia.com/mig-<profile>) as integers."""
    out: dict[str, int] = {}
    for key, value in ((node_doc.get("status") or {}).get("allocatable") or {}).items():
        if str(key).startswith("nvidia.com/"):
            try:
                out[str(key)] = parse_int(str(value), hi=1_000_000, what=str(key))
            except HostNumberError:
                continue
    return out
