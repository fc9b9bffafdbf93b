"""The real fleet behind `gpuprov upgrade-driver`: hosts over SSH, the cluster through kubectl on the
first control-plane host, and the driver change through playbooks/upgrade_driver.yml (the nvidia_driver
role, the same code bootstrap runs).

- Probes are the verification probes (one read-only script per host over paramiko), parsed by the same
  parsers and the driver.loaded check, so "loaded driver", "GPUs seen" and "Xid" mean here exactly what
  they mean in `gpuprov verify`.
- kubectl runs on the control plane with /etc/kubernetes/admin.conf, as an administrator would; any
  failure becomes StepFailed with kubectl's own first line of error.
- One ansible-runner run per batch (the batch's hosts as --limit): the playbook sets the fact
  gpuprov_upgrade_step as each step starts, which becomes the host's step in the state file as it happens.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner.checks import PASS, HostFacts, evaluate
from provisioner.checks.driver import installed_version
from provisioner.checks.model import Unavailable
from provisioner.content import PLAYBOOKS_DIR
from provisioner.errors import GpuprovError
from provisioner.executors import (
    CommandResult,
    CommandTimeout,
    ExecutorError,
    OpenConnections,
    SshExecutor,
    SshTarget,
)
from provisioner.expectations import Expectations
from provisioner.hosttext import last_line, short_safe_text
from provisioner.inventory import needs_become
from provisioner.mig import parse_mig_devices
from provisioner.probes import kernel_log, smi
from provisioner.probes.base import ProbeResult
from provisioner.probes.host import HOST_FACTS, pci_gpus
from provisioner.probes.kernel_log import KERNEL_LOG
from provisioner.probes.smi import SMI_XML
from provisioner.upgrade.model import ANNOTATION, InstallOutcome, NodeInfo, StepFailed
from provisioner.upgrade.plan import DriverTarget, HostProbe, valid_node_name

PLAYBOOK = PLAYBOOKS_DIR / "upgrade_driver.yml"
# The playbook reports its progress through these facts (a step name, a reboot's reason).
STEP_FACT = "gpuprov_upgrade_step"
NOTE_FACT = "gpuprov_upgrade_note"
STEPS = ("stopping", "installing", "reloading", "rebooting")
KUBECONFIG = "/etc/kubernetes/admin.conf"
EVICT_LABEL = "gpuprov.io/evict-for-driver-upgrade"  # marks the GPU pods `--no-drain` evicts
# What the probe reads: the loaded driver, the GPUs on the bus and seen by the driver, the kernel log.
PROBES = (HOST_FACTS, SMI_XML, KERNEL_LOG)
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
NOTES = {
    "reload-impossible": "the old driver's modules could not be unloaded (still in use)",
    "kernel-changed": "the running kernel is not the one the new modules were built for",
}


# ------------------------------------------------------------------------------------------ probing

# /etc/machine-id: 32 lower-case hex digits (systemd's machine-id(5)).
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")


def probe_from_results(host: str, results: Mapping[str, ProbeResult], node: str | None) -> HostProbe:
    """A HostProbe from raw probe results (pure: tested on recorded hosts)."""
    facts = HostFacts(host, results)
    try:
        loaded: str | None = installed_version(facts)
    except Unavailable:
        loaded = None
    try:
        pci = len(pci_gpus(facts))
    except Unavailable:
        pci = 0
    try:
        driver: int | None = len(smi.smi_log(facts).gpus)
    except Unavailable:
        driver = None
    try:
        xids = tuple(e.line for e in kernel_log.xids(facts))
    except Unavailable:
        xids = ()
    loaded_check = evaluate(facts, Expectations(), ["driver.loaded"])[0]
    return HostProbe(
        host=host,
        loaded=loaded,
        gpus_pci=pci,
        gpus_driver=driver,
        xids=xids,
        node=node,
        driver_ok=loaded_check.status == PASS,
        driver_detail=loaded_check.detail,
    )


# ------------------------------------------------------------------------------------------ kubectl


class KubectlOverSsh:
    """kubectl on the first control-plane host, over one SSH connection shared by the batch's threads."""

    def __init__(
        self,
        spec: Any,
        live: OpenConnections,
        connect_timeout: float = 10.0,
        poll_s: float = 1.0,
        executor: SshExecutor | None = None,
        annotation: str = ANNOTATION,
    ) -> None:
        self.spec = spec
        self.annotation = annotation  # the node annotation that says why a node was left cordoned
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
            # failure (else a host would be upgraded without being drained).
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


# -------------------------------------------------------------------------------------------- fleet


class RealFleet:
    """GPU hosts over SSH and ansible-runner; the cluster through kubectl on the control plane."""

    def __init__(
        self,
        *,
        hosts: Sequence[Any],
        control_plane: Any | None,
        inventory_path: Path,
        record: Path | None,
        install_version: str,
        progress: Callable[[str | None, str], None],
        connect_timeout: float = 10.0,
        probe_timeout: float = 180.0,
    ) -> None:
        self.specs = {h.name: h for h in hosts}
        self.inventory_path = inventory_path
        self.record = record
        self.install_version = install_version
        self.progress = progress
        self.connect_timeout = connect_timeout
        self.probe_timeout = probe_timeout
        self._live = OpenConnections()
        self.kube: KubectlOverSsh | None = (
            KubectlOverSsh(control_plane, self._live, connect_timeout) if control_plane is not None else None
        )
        self._installs = 0

    # -- probes

    def _probe_one(self, name: str) -> HostProbe:
        spec = self.specs[name]
        ex = SshExecutor(SshTarget.from_host(spec), connect_timeout=self.connect_timeout)
        self._live.add(ex)
        try:
            from provisioner.verification import collect

            results = collect(ex, PROBES, self.probe_timeout, become=needs_become(spec))
            res = ex.run(["cat", "/proc/sys/kernel/hostname"], 15)
            hostname = res.stdout.strip().lower() if res.rc == 0 else ""
            res = ex.run(["cat", "/etc/machine-id"], 15)
            machine_id = res.stdout.strip() if res.rc == 0 else ""
            # The MIG devices: a driver reload destroys them; the MIG manager must bring them back.
            listing = ex.run([*(["sudo", "-n", "--"] if needs_become(spec) else []), "nvidia-smi", "-L"], 60)
        except ExecutorError as exc:
            return HostProbe(name, error=exc.reason)
        finally:
            self._live.discard(ex)
            ex.close()
        try:
            mig_devices = parse_mig_devices(listing.stdout) if listing.rc == 0 else None
        except ValueError as exc:
            # Unknown MIG devices would let the upgrade skip waiting for them to come back.
            return HostProbe(name, error=str(exc))
        return replace(
            probe_from_results(name, results, hostname if valid_node_name(hostname) else None),
            machine_id=machine_id if _MACHINE_ID.fullmatch(machine_id) else None,
            address=ex.target.address,
            mig_devices=mig_devices,
            node_error=None
            if not hostname or valid_node_name(hostname)
            else f"the host's hostname {short_safe_text(hostname)!r} is not a valid Kubernetes node name",
        )

    def probe(self, hosts: Sequence[str]) -> dict[str, HostProbe]:
        if len(hosts) == 1:
            return {hosts[0]: self._probe_one(hosts[0])}
        with ThreadPoolExecutor(max_workers=min(len(hosts), 50), thread_name_prefix="gpuprov-probe") as pool:
            return dict(zip(hosts, pool.map(self._probe_one, hosts), strict=True))

    # -- the driver change

    def extravars(self, target: DriverTarget, reboot_allowed: bool) -> dict[str, Any]:
        """Run-scoped values for the playbook: the target, and who reloads or reboots."""
        return {
            "nvidia_driver_branch": self.install_version.split(".", 1)[0],
            "nvidia_driver_version": self.install_version,
            # The playbook unloads before and loads after the install; the role must not do it itself.
            "nvidia_driver_reload_modules": False,
            "nvidia_driver_reboot_allowed": False,
            "gpuprov_upgrade_reboot_allowed": bool(reboot_allowed),
        }

    def upgrade(
        self,
        hosts: Sequence[str],
        target: DriverTarget,
        *,
        reboot_allowed: bool,
        on_step: Callable[[str, str], None],
    ) -> dict[str, InstallOutcome]:
        from provisioner.runner import Event, run_playbook

        if self.record is None:
            raise GpuprovError("upgrade without a run record")
        if not PLAYBOOK.is_file():
            raise GpuprovError(f"{PLAYBOOK}: playbook missing from this installation")
        self._installs += 1
        where = self.record / f"install-{self._installs:02d}"
        notes: dict[str, str] = {}
        rebooted: set[str] = set()

        def on_event(ev: Event) -> None:
            if ev.host is None or ev.kind != "runner_on_ok":
                return
            step = ev.facts.get(STEP_FACT)
            if isinstance(step, str) and step in STEPS:
                if step == "rebooting":
                    rebooted.add(ev.host)
                on_step(ev.host, step)
            note = ev.facts.get(NOTE_FACT)
            if isinstance(note, str) and note in NOTES:
                notes[ev.host] = NOTES[note]

        result = run_playbook(
            PLAYBOOK,
            self.inventory_path,
            record_dir=where,
            hosts=list(hosts),
            forks=max(1, len(hosts)),
            extravars=self.extravars(target, reboot_allowed),
            on_event=on_event,
        )
        out: dict[str, InstallOutcome] = {}
        for h in hosts:
            stats = result.stats.get(h)
            # A failure that a block rescued (the unload of modules in use) is not the host's failure: the
            # final stats say whether the host failed; the last failure event says why.
            failures = [f for f in result.failures if f.host == h]
            failed = stats is not None and (stats.failed > 0 or stats.unreachable > 0)
            if failed or (stats is None and failures and not result.interrupted):
                f = failures[-1] if failures else None
                what = "unreachable" if f and f.unreachable else ((f.stage if f else None) or "upgrade")
                why = f"{f.task}: {f.message}" if f else f"the playbook failed ({result.status})"
                out[h] = InstallOutcome("failed", f"{what}: {why}".strip())
            elif h in result.reboot_pending:
                why = notes.get(h, "the new driver needs a reboot")
                out[h] = InstallOutcome(
                    "reboot-pending",
                    f"{why}; {self.install_version} is installed and loads at the next boot "
                    "(reboot the host, then --resume; or run with --reboot-allowed)",
                )
            elif result.interrupted:
                out[h] = InstallOutcome("interrupted", "canceled")
            elif h in result.stats:
                out[h] = InstallOutcome("ok", rebooted=h in rebooted)
            else:
                out[h] = InstallOutcome(
                    "failed", f"upgrade: the playbook did not run on {h} ({result.status})"
                )
        return out

    def interrupt(self) -> None:
        self._live.close_all()

    def close(self) -> None:
        self._live.close_all()
        if self.kube is not None:
            self.kube.close()
