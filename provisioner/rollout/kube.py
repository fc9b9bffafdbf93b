"""The real cluster behind a rolling change: kubectl on the first control-plane host, with
/etc/kubernetes/admin.conf, as an administrator would run it; any failure becomes StepFailed with
kubectl's own first line of error."""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from provisioner.executors import (
    CommandResult,
    CommandTimeout,
    ExecutorError,
    OpenConnections,
    SshExecutor,
    SshTarget,
)
from provisioner.hosttext import last_line, short_safe_text
from provisioner.inventory import needs_become
from provisioner.rollout.model import NodeInfo, StepFailed

KUBECONFIG = "/etc/kubernetes/admin.conf"
EVENT_SOURCE = "gpuprov"
# Marks the GPU pods to evict instead of a drain (named when the driver upgrade was the only rolling change).
EVICT_LABEL = "gpuprov.io/evict-for-driver-upgrade"
# GPU Operator operand pods (label app=...) that keep the GPU open; they leave once the node's operands
# are switched off (nvidia.com/gpu.deploy.operands=false).
OPERAND_APPS = (
    "nvidia-operator-validator",
    "nvidia-container-toolkit-daemonset",
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
    "nvidia-mig-manager",
)

# A Kubernetes node name: an RFC 1123 DNS subdomain (lower case letters, digits, '-' and '.', at most 253
# characters, each dot-separated label 1-63 characters starting and ending with a letter or digit).
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def valid_node_name(name: str) -> bool:
    return 0 < len(name) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in name.split("."))


class KubectlOverSsh:
    """kubectl on the first control-plane host, over one SSH connection shared by the batch's threads.
    `annotation` is the node annotation that says why a client left a node cordoned."""

    def __init__(
        self,
        spec: Any,
        live: OpenConnections,
        connect_timeout: float = 10.0,
        poll_s: float = 1.0,
        executor: SshExecutor | None = None,
        *,
        annotation: str,
    ) -> None:
        self.spec = spec
        self.annotation = annotation
        self.host = spec.name
        self.become = needs_become(spec)
        self.poll_s = poll_s
        self._executor = executor or SshExecutor(SshTarget.from_host(spec), connect_timeout=connect_timeout)
        self._lock = threading.Lock()
        self._live = live

    def close(self) -> None:
        self._executor.close()

    def _exec(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        with self._lock:
            try:
                self._executor.connect()
            except ExecutorError as exc:
                raise StepFailed(f"control plane {self.host}: {exc.reason}") from exc
            self._live.add(self._executor)
        try:
            return self._executor.run(command, timeout)
        except CommandTimeout as exc:
            raise StepFailed(f"kubectl on {self.host} did not answer within {timeout:g} s") from exc
        except ExecutorError as exc:
            raise StepFailed(f"control plane {self.host}: {exc.reason}") from exc

    def _argv(self, args: Sequence[str]) -> list[str]:
        argv = ["kubectl", "--kubeconfig", KUBECONFIG, "--request-timeout=30s", *args]
        return ["sudo", "-n", "--", *argv] if self.become else argv

    def kubectl(self, *args: str, timeout: float = 60.0) -> CommandResult:
        return self._exec(self._argv(args), timeout)

    def _ok(self, what: str, res: CommandResult) -> CommandResult:
        if res.rc != 0:
            raise StepFailed(f"kubectl {what}: {last_line(res.stderr) or f'exit {res.rc}'}")
        return res

    # -- Kube interface

    def node(self, name: str) -> NodeInfo | None:
        if not valid_node_name(name):
            raise StepFailed(f"{short_safe_text(name)!r} is not a valid Kubernetes node name")
        res = self.kubectl("get", "node", "-o", "json", "--", name)
        if res.rc != 0:
            # Only the API server's answer means "no such node"; kubectl missing or the API down is a
            # failure (else a host would be changed without being drained).
            if res.rc != 127 and re.search(
                rf'\(NotFound\).*nodes? "{re.escape(name)}" not found', res.stderr
            ):
                return None
            if res.rc == 127:
                raise StepFailed(f"kubectl not found on {self.host}: {last_line(res.stderr)}")
            self._ok(f"get node {name}", res)
        try:
            doc = json.loads(res.stdout)
        except ValueError as exc:
            raise StepFailed(f"kubectl get node {name}: not JSON: {last_line(res.stdout)}") from exc
        meta = doc.get("metadata") or {}
        status = doc.get("status") or {}
        return NodeInfo(
            name=str(meta.get("name") or name),
            unschedulable=bool((doc.get("spec") or {}).get("unschedulable")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            machine_id=str((status.get("nodeInfo") or {}).get("machineID") or ""),
            addresses=tuple(
                str(a.get("address"))
                for a in status.get("addresses") or []
                if isinstance(a, dict) and a.get("type") == "InternalIP"
            ),
        )

    def cordon(self, name: str) -> None:
        self._ok(f"cordon {name}", self.kubectl("cordon", "--", name))

    def uncordon(self, name: str) -> None:
        self._ok(f"uncordon {name}", self.kubectl("uncordon", "--", name))

    def drain(self, name: str, timeout: float) -> None:
        res = self.kubectl(
            "drain", "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={int(timeout)}s",
            "--", name, timeout=timeout + 60,
        )  # fmt: skip
        if res.rc != 0:
            raise StepFailed(f"kubectl drain (timeout {int(timeout)}s): {last_line(res.stderr) or res.rc}")

    def _pods_on(self, name: str, selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={name}", "-o", "json"]
        if selector:
            args += ["-l", selector]
        res = self._ok(f"get pods on {name}", self.kubectl(*args))
        try:
            return list(json.loads(res.stdout).get("items") or [])
        except ValueError as exc:
            raise StepFailed(f"kubectl get pods: not JSON: {last_line(res.stdout)}") from exc

    def evict_gpu_pods(self, name: str, timeout: float) -> None:
        """Evict only the pods on the node that use GPUs (PodDisruptionBudgets honoured) and wait for them.

        They are marked with a label and drained by that selector: kubectl drain's own eviction, retry and
        wait logic, restricted to those pods (kubectl has no other way to evict a pod).
        """
        pods = [p for p in self._pods_on(name) if uses_gpu(p) and not _daemonset_pod(p)]
        if not pods:
            return
        by_ns: dict[str, list[str]] = {}
        for p in pods:
            by_ns.setdefault(p["metadata"]["namespace"], []).append(p["metadata"]["name"])
        mark = f"{EVICT_LABEL}={name}"
        for ns, names in sorted(by_ns.items()):
            self._ok(
                f"label pods in {ns}",
                self.kubectl("label", "-n", ns, "--overwrite", "--", "pods", *sorted(names), mark),
            )
        res = self.kubectl(
            "drain", "--pod-selector", mark, "--ignore-daemonsets", "--delete-emptydir-data",
            f"--timeout={int(timeout)}s", "--", name, timeout=timeout + 60,
        )  # fmt: skip
        if res.rc != 0:
            which = ", ".join(f"{ns}/{n}" for ns, names in sorted(by_ns.items()) for n in sorted(names))
            why = last_line(res.stderr) or f"exit {res.rc}"
            raise StepFailed(f"GPU pods not evicted ({which}; timeout {int(timeout)}s): {why}")

    def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        if labels:
            changes = [f"{k}-" if v is None else f"{k}={v}" for k, v in sorted(labels.items())]
            res = self.kubectl("label", "--overwrite", "--", "node", name, *changes)
            # Removing a label that is not there is not an error worth failing a host for.
            if res.rc != 0 and not (all(v is None for v in labels.values()) and "not found" in res.stderr):
                self._ok(f"label node {name}", res)

    def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set (or, for None, remove) node annotations in one kubectl call."""
        if annotations:
            changes = [f"{k}-" if v is None else f"{k}={v}" for k, v in sorted(annotations.items())]
            res = self.kubectl("annotate", "--overwrite", "--", "node", name, *changes)
            # Removing an annotation that is not there is not an error worth failing a host for.
            if res.rc != 0 and not (
                all(v is None for v in annotations.values()) and "not found" in res.stderr
            ):
                self._ok(f"annotate node {name}", res)

    def wait_operands_gone(self, name: str, timeout: float) -> None:
        selector = f"app in ({','.join(OPERAND_APPS)})"
        deadline = time.monotonic() + timeout
        while True:
            pods = self._pods_on(name, selector)
            if not pods:
                return
            if time.monotonic() >= deadline:
                which = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods)
                raise StepFailed(f"GPU Operator pods still on the node after {int(timeout)}s: {which}")
            time.sleep(self.poll_s)

    def annotate(self, name: str, text: str | None) -> None:
        value = f"{self.annotation}-" if text is None else f"{self.annotation}={text}"
        res = self.kubectl("annotate", "--overwrite", "--", "node", name, value)
        if text is not None:
            self._ok(f"annotate node {name}", res)

    def taint(self, name: str, key: str, value: str | None, effect: str = "NoSchedule") -> None:
        """Set the taint `key=value:effect` on the node, or remove it (value None; absent is fine)."""
        if value is None:
            res = self.kubectl("taint", "nodes", "--", name, f"{key}:{effect}-")
            if res.rc != 0 and "not found" not in res.stderr:
                self._ok(f"untaint node {name}", res)
            return
        self._ok(f"taint node {name}", self.kubectl("taint", "nodes", "--overwrite", "--", name,
                                                    f"{key}={value}:{effect}"))  # fmt: skip

    def event(self, name: str, reason: str, message: str, warning: bool = False) -> None:
        """A Kubernetes Event on the node (what `kubectl describe node` and `kubectl events` show).
        Events on a node name it as its own UID, as the kubelet's do. The object reaches kubectl on its
        stdin through a quoted shell word: host text in the message never becomes shell syntax."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        doc = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.gpuprov-", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        text = json.dumps(doc, ensure_ascii=True)
        command = " ".join(shlex.quote(a) for a in self._argv(["create", "-f", "-", "-o", "name"]))
        res = self._exec(f"printf '%s' {shlex.quote(text)} | {command}", 60)
        self._ok(f"create event on node {name}", res)


def _daemonset_pod(pod: Mapping[str, Any]) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("kind") == "DaemonSet" for r in refs)


def uses_gpu(pod: Mapping[str, Any]) -> bool:
    """A pod that asks for GPUs (nvidia.com/gpu or MIG slices), mirror pods and finished pods aside."""
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        res = c.get("resources") or {}
        for kind in ("limits", "requests"):
            for key in res.get(kind) or {}:
                if key == "nvidia.com/gpu" or key.startswith("nvidia.com/mig-"):
                    return True
    return False
