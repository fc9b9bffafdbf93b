"""The GPU Operator's MIG manager (the nvidia-mig-manager container), SIMULATED (gpuprov lab).

It follows NVIDIA/mig-parted v0.15.0: cmd/nvidia-mig-manager/main.go (the label watch, the GPU clients
file, setupMigConfig) and pkg/mig/reconfigure/reconfigure.go (Run: the reconfiguration steps, the
labels and their values), with the GPU Operator v25.10.0 assets/state-mig-manager entrypoint
(WITH_SHUTDOWN_HOST_GPU_CLIENTS=$IS_HOST_DRIVER from the driver validation's status file).

- The manager acts when the node label nvidia.com/mig.config CHANGES: its informer calls Set() on the
  node's first sight (AddFunc) and on an update only when the value differs (UpdateFunc); Get() waits
  while the value equals the last one read. Setting the same value again does nothing.
- Run: assert the selected config exists in CONFIG_FILE ("selected mig-config not present"), skip
  when it is already applied (state success), else state=pending; the operand labels
  nvidia.com/gpu.deploy.{device-plugin,gpu-feature-discovery,dcgm-exporter,dcgm,nvsm} become
  "paused-for-mig-change" (a "false" stays false); wait until their pods are gone from the node;
  stop the host's systemd GPU clients (GPU_CLIENTS_FILE); change the MIG mode, apply the MIG devices;
  restart the clients; delete the validator pod; put the operand labels back to "true"; state=success.
- On a failure setState(failed) puts the operand labels back to "true" as well, unless this manager
  process already ran restartKubernetesGPUClients once (the package variable
  NoRestartK8sDaemonsetsOnExit stays true for the life of the process): then a later failure leaves
  them "paused-for-mig-change". A failure while waiting for the operands' pods returns without
  setState at all (state pending, labels paused). A failed mode change is only logged when the node
  may not reboot (WITH_REBOOT unset); the MIG config apply that follows fails on it.

SIMULATED parts: nvidia-mig-parted's apply (NVML calls) is done with nvidia-smi's MIG commands on the
host (`nvidia-smi -i N -mig 1|0`, `nvidia-smi mig -i N -dci`, `-dgi`, `-cgi <profiles> -C`); the host's
kubelet.service, which the real manager also stops across a MIG mode change, is not stopped (the lab's
manager runs inside the kubelet's process); the manager's log is written where containerd keeps
container logs (/var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import kube_util as u
from .kube_host import Host

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PAUSED = "paused-for-mig-change"
# reconfigure.go: the operands paused across a change, and the pods waited for (waitForPodsToBeDeleted).
OPERAND_LABELS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.nvsm",
)
OPERAND_PODS = (
    ("device-plugin", "app=nvidia-device-plugin-daemonset"),
    ("gpu-feature-discovery", "app=gpu-feature-discovery"),
    ("dcgm-exporter", "app=nvidia-dcgm-exporter"),
    ("dcgm", "app=nvidia-dcgm"),
)
POD_WAIT_S = 300.0  # waitForPodDeletion's timeout (5 minutes)

# GPU instance profiles: PCI device id → profile → (instances per GPU, memory slices of 8). NVIDIA
# Multi-Instance GPU User Guide, "Supported MIG Profiles" (A100 80GB, H100 80GB, H200 141GB).


def _a100_like(unit: int) -> dict[str, tuple[int, int]]:
    return {
        f"1g.{unit}gb": (7, 1), f"1g.{unit}gb+me": (1, 1), f"1g.{unit * 2}gb": (4, 2),
        f"2g.{unit * 2}gb": (3, 2), f"3g.{unit * 4}gb": (2, 4), f"4g.{unit * 4}gb": (1, 4),
        f"7g.{unit * 8}gb": (1, 8),
    }  # fmt: skip


PROFILES: dict[int, dict[str, tuple[int, int]]] = {
    0x20B0: _a100_like(5),
    0x20B2: _a100_like(10),
    0x2330: _a100_like(10),
    0x2335: {
        "1g.18gb": (7, 1),
        "1g.18gb+me": (1, 1),
        "1g.35gb": (4, 2),
        "2g.35gb": (3, 2),
        "3g.71gb": (2, 4),
        "4g.71gb": (1, 4),
        "7g.141gb": (1, 8),
    },
}
MEMORY_SLICES = 8


# ------------------------------------------------------------------------------ mig-parted's config
@dataclass(frozen=True)
class Entry:
    devices: str | tuple[int, ...]  # "all" or GPU indices
    enabled: bool
    mig_devices: dict[str, int]
    device_ids: tuple[int, ...]  # device-filter as PCI device ids; empty: every GPU


class ConfigError(Exception):
    pass


def parse_config(text: str) -> dict[str, list[Entry]]:
    """A mig-parted `version: v1` file: config name → entries (pkg/config/v1)."""
    try:
        doc = u.yaml_load(text)
    except Exception as exc:  # yaml's errors, as the real parser reports them
        raise ConfigError(f"error parsing config file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != "v1":
        raise ConfigError("error parsing config file: unknown version")
    out: dict[str, list[Entry]] = {}
    for name, entries in (doc.get("mig-configs") or {}).items():
        parsed = []
        for e in entries or []:
            if not isinstance(e, dict):
                raise ConfigError(f"error parsing config file: invalid entry in {name}")
            devices = e.get("devices")
            picked: str | tuple[int, ...] = (
                "all" if devices == "all" else tuple(int(d) for d in devices or [])
            )
            filters = e.get("device-filter") or []
            filters = [filters] if isinstance(filters, str) else filters
            ids = tuple(int(str(f)[2:6], 16) for f in filters if re.fullmatch(r"0x[0-9A-Fa-f]{8}", str(f)))
            mig_devices = {str(k): int(v) for k, v in (e.get("mig-devices") or {}).items()}
            parsed.append(Entry(picked, bool(e.get("mig-enabled")), mig_devices, ids))
        out[str(name)] = parsed
    return out


def wanted(entries: list[Entry], gpus: dict[int, int]) -> dict[int, dict[str, int] | None]:
    """GPU index → the MIG devices the entries ask of it (None: MIG off). Entries apply in order, as
    mig-parted applies them; a GPU no entry selects is left as it is (absent)."""
    out: dict[int, dict[str, int] | None] = {}
    for e in entries:
        for index, device_id in gpus.items():
            if e.devices != "all" and index not in e.devices:
                continue
            if e.device_ids and device_id not in e.device_ids:
                continue
            out[index] = {p: n for p, n in e.mig_devices.items() if n} if e.enabled else None
    return out


_L_GPU = re.compile(r"^GPU (?P<index>\d+): ")
_L_MIG = re.compile(r"^\s+MIG (?P<profile>\d+g\.\d+gb(?:\+\w+)?)\s+Device\s+(?P<dev>\d+): ")


def parse_listing(listing: str) -> dict[int, dict[str, int]]:
    """GPU index → MIG profile → devices, from `nvidia-smi -L`."""
    out: dict[int, dict[str, int]] = {}
    current: int | None = None
    for line in listing.splitlines():
        m = _L_GPU.match(line)
        if m:
            current = int(m["index"])
            out[current] = {}
            continue
        m = _L_MIG.match(line)
        if m and current is not None:
            out[current][m["profile"]] = out[current].get(m["profile"], 0) + 1
    return out


def parse_clients(text: str | None) -> list[str]:
    """GPU_CLIENTS_FILE (parseGPUCLientsFile): `version: v1` and `systemd-services`."""
    if not text:
        return []
    doc = u.yaml_load(text) or {}
    return [str(s) for s in (doc.get("systemd-services") or [])] if isinstance(doc, dict) else []


# ----------------------------------------------------------------------------------------- the log
def logrus(level: str, msg: str) -> str:
    """A line as logrus's text formatter writes it (no terminal)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f'time="{stamp}" level={level} msg={json.dumps(msg)}'


class Failed(Exception):
    """A step of Run failed; ``set_state`` says whether Run calls setState(failed)."""

    def __init__(self, message: str, set_state: bool = True) -> None:
        super().__init__(message)
        self.set_state = set_state


@dataclass
class Settings:
    node: str
    namespace: str
    pod: str
    uid: str
    config_file: tuple[str, str] | None  # CONFIG_FILE: (ConfigMap, key) of its volume
    clients_file: tuple[str, str] | None  # GPU_CLIENTS_FILE: (ConfigMap, key)
    shutdown_host_clients: bool
    with_reboot: bool
    log_path: str


class MigManager:
    """One nvidia-mig-manager process: a thread that watches its node's label and reconfigures."""

    def __init__(self, host: Host, client_factory: Callable[[], Any], s: Settings) -> None:
        self.host = host
        self.client_factory = client_factory
        self.s = s
        self.stop = threading.Event()
        self.current: str | None = None  # SyncableMigConfig.current
        self.last_read = ""  # SyncableMigConfig.lastRead
        self.seen = False
        self.restarted_k8s_clients = False  # NoRestartK8sDaemonsetsOnExit
        self.thread = threading.Thread(target=self._main, name=f"mig-manager-{s.pod}", daemon=True)
        self.client: Any = None
        self.res: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------- plumbing
    def log(self, level: str, msg: str) -> None:
        line = logrus(level, msg)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
        old = self.host.read(self.s.log_path, "") or ""
        self.host.write(self.s.log_path, old + f"{stamp} stderr F {line}\n")

    def R(self, name: str) -> Any:
        if name not in self.res:
            self.res[name] = self.client.resource(name)
        return self.res[name]

    def node_labels(self) -> dict[str, str]:
        node = self.client.get(self.R("nodes"), "", self.s.node)
        return dict(u.dig(node, "metadata", "labels") or {})

    def set_labels(self, labels: dict[str, str]) -> None:
        self.client.patch(self.R("nodes"), "", self.s.node, {"metadata": {"labels": labels}})

    def read_file(self, ref: tuple[str, str] | None) -> str | None:
        """A file of a ConfigMap volume, as the kubelet keeps it current in the container."""
        if ref is None:
            return None
        cm = self.client.find(self.R("configmaps"), self.s.namespace, ref[0])
        return None if cm is None else (cm.get("data") or {}).get(ref[1])

    def pods(self, selector: str) -> list[Any]:
        return list(
            self.client.list(self.R("pods"), self.s.namespace, selector, f"spec.nodeName={self.s.node}")
        )

    def smi(self, *args: str) -> tuple[int, str]:
        res = self.host.run(["nvidia-smi", *args], timeout=120)
        return res.returncode, (res.stdout + res.stderr).strip()

    def systemctl(self, *args: str) -> int:
        return int(self.host.run(["systemctl", *args], timeout=90).returncode)

    # ------------------------------------------------------------------------------------- the loop
    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def _watch(self) -> None:
        """The informer: AddFunc on first sight, UpdateFunc when the value changed."""
        value = self.node_labels().get(CONFIG_LABEL, "")
        if not self.seen:
            self.seen = True
            self.current = value
        elif value != self._observed:
            self.current = value
        self._observed = value

    def _main(self) -> None:
        self._observed = ""
        while not self.stop.is_set():
            try:
                if self.client is None:
                    self.client = self.client_factory()
                if self.client.find(self.R("pods"), self.s.namespace, self.s.pod) is None:
                    return  # the pod is gone: the container was killed
                self._watch()
            except Exception:  # the API server is away: the informer retries
                self.client = None
                self.res = {}
                self.stop.wait(1.0)
                continue
            if self.current is None or self.current == self.last_read:
                if not getattr(self, "_waiting", False):
                    self.log("info", f"Waiting for change to '{CONFIG_LABEL}' label")
                    self._waiting = True
                self.stop.wait(0.3)
                continue
            self._waiting = False
            value = self.last_read = self.current
            self.log("info", f"Updating to MIG config: {value}")
            try:
                self.reconfigure(value)
                self.log("info", f"Successfully updated to MIG config: {value}")
            except Failed as exc:
                self.log("error", f"Error: {exc}")
            except Exception as exc:  # the API server went away mid-run
                self.log("error", f"Error: {exc}")
                self.client = None
                self.res = {}

    # --------------------------------------------------------------------------------- Reconfigure
    def reconfigure(self, selected: str) -> None:
        labels = self.node_labels()
        deployed = {k: labels.get(k, "") for k in OPERAND_LABELS}
        for k, v in deployed.items():
            self.log("info", f"Current value of '{k}={v}'")
        self.log("info", f"Current value of '{STATE_LABEL}={labels.get(STATE_LABEL, '')}'")
        try:
            self._run(selected, deployed)
        except Failed as exc:
            if exc.set_state:
                self._set_state("failed", deployed)
            raise

    def _set_state(self, state: str, deployed: dict[str, str]) -> None:
        """setState: restart the host clients and the operands (unless already done), then the state."""
        if self.s.shutdown_host_clients and getattr(self, "_stopped", None):
            self.log(
                "info",
                "Restarting any GPU clients previously shutdown on the host by restarting their systemd "
                "services",
            )
            self._start_clients()
        if not self.restarted_k8s_clients:
            self.log(
                "info",
                "Restarting any GPU clients previously shutdown in Kubernetes by reenabling their "
                "component-specific nodeSelector labels",
            )
            self.set_labels({k: "false" if v == "false" else "true" for k, v in deployed.items()})
        self.log("info", f"Changing the '{STATE_LABEL}' node label to '{state}'")
        self.set_labels({STATE_LABEL: state})

    def _gpus(self) -> dict[int, tuple[int, bool]]:
        """GPU index → (PCI device id, MIG mode on)."""
        rc, out = self.smi("--query-gpu=index,pci.device_id,mig.mode.current", "--format=csv,noheader")
        if rc != 0:
            raise Failed(f"failed to apply MIG configuration: {out.splitlines()[-1] if out else rc}")
        gpus = {}
        for line in out.splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) >= 3 and cols[0].isdigit() and cols[1].lower().startswith("0x"):
                gpus[int(cols[0])] = (int(cols[1][2:6], 16), cols[2] == "Enabled")
        return gpus

    def _plan(self, selected: str) -> tuple[dict[int, dict[str, int] | None], dict[int, tuple[int, bool]]]:
        text = self.read_file(self.s.config_file)
        if text is None:
            raise Failed(
                "failed to validate MIG configuration: open /mig-parted-config/config.yaml: no such file"
            )
        self.log("info", "Asserting that the requested configuration is present in the configuration file")
        try:
            configs = parse_config(text)
        except ConfigError as exc:
            self.log("fatal", f"Error parsing config file: {exc}")
            raise Failed("failed to validate MIG configuration: exit status 1") from None
        if selected not in configs:
            self.log("fatal", f"Error selecting MIG config: selected mig-config not present: {selected}")
            raise Failed("failed to validate MIG configuration: exit status 1")
        self.log("info", "Selected MIG configuration is valid")
        gpus = self._gpus()
        return wanted(configs[selected], {i: d for i, (d, _on) in gpus.items()}), gpus

    def _applied(self, plan: dict[int, dict[str, int] | None], gpus: dict[int, tuple[int, bool]]) -> bool:
        rc, listing = self.smi("-L")
        have = parse_listing(listing) if rc == 0 else {}
        for index, want in plan.items():
            on = gpus.get(index, (0, False))[1]
            if want is None and on:
                return False
            if want is not None and (not on or have.get(index, {}) != want):
                return False
        return True

    def _run(self, selected: str, deployed: dict[str, str]) -> None:
        plan, gpus = self._plan(selected)
        self.log("info", "Checking if the selected MIG config is currently applied or not")
        if self._applied(plan, gpus):
            self.log("info", "Selected MIG config is already applied")
            self._set_state("success", deployed)
            return
        self.log(
            "info", "Checking if the MIG mode setting in the selected config is currently applied or not"
        )
        mode_change = any((want is not None) != gpus.get(i, (0, False))[1] for i, want in plan.items())
        self.set_labels({STATE_LABEL: "pending"})
        self.log(
            "info",
            "Shutting down all GPU clients in Kubernetes by disabling their component-specific "
            "nodeSelector labels",
        )
        self.set_labels({k: "false" if v == "false" else PAUSED for k, v in deployed.items()})
        for what, selector in OPERAND_PODS:
            self.log("info", f"Waiting for {what} to shutdown")
            deadline = time.monotonic() + POD_WAIT_S
            while self.pods(selector):
                if time.monotonic() > deadline or self.stop.is_set():
                    # waitForPodsToBeDeleted returns without setState: state stays pending.
                    raise Failed(
                        f"failed to wait for pods to be deleted: {what} pod did not shutdown: "
                        "context deadline exceeded",
                        set_state=False,
                    )
                self.stop.wait(0.3)
        for selector in ("app=nvidia-cuda-validator", "app=nvidia-device-plugin-validator"):
            for pod in self.pods(selector):
                self.client.delete(self.R("pods"), self.s.namespace, pod["metadata"]["name"])
        if self.s.shutdown_host_clients:
            self.log("info", "Shutting down all GPU clients on the host by stopping their systemd services")
            self._stopped = []
            for unit in parse_clients(self.read_file(self.s.clients_file)):
                if self.systemctl("is-active", "--quiet", unit) == 0:
                    if self.systemctl("stop", unit) != 0:
                        raise Failed(f"failed to shutdown host GPU clients: failed to stop {unit}")
                    self._stopped.append(unit)
            if mode_change:
                self.log(
                    "info",
                    "SIMULATED (gpuprov lab): kubelet.service is not stopped across the MIG mode change",
                )
        self.log(
            "info",
            "Applying the MIG mode change from the selected config to the node (and double checking it "
            "took effect)",
        )
        mode_error = self._apply_mode(plan, gpus)
        if mode_error:
            self.log("error", mode_error)
            if self.s.with_reboot:
                self.set_labels({STATE_LABEL: "rebooting"})
                self.log("info", "SIMULATED (gpuprov lab): the node is not rebooted")
                return
        self.log("info", "Applying the selected MIG config to the node")
        error = self._apply_mode(plan, self._gpus()) or self._apply_devices(plan)
        if error:
            self.log("error", error)
            raise Failed("failed to apply MIG configuration: exit status 1")
        if self.s.shutdown_host_clients:
            self.log(
                "info",
                "Restarting all GPU clients previously shutdown on the host by restarting their systemd "
                "services",
            )
            self._start_clients()
        self.log("info", "Restarting validator pod to re-run all validations")
        for pod in self.pods("app=nvidia-operator-validator"):
            self.client.delete(self.R("pods"), self.s.namespace, pod["metadata"]["name"])
        self.log(
            "info",
            "Restarting all GPU clients previously shutdown in Kubernetes by reenabling their "
            "component-specific nodeSelector labels",
        )
        self.set_labels({k: "false" if v == "false" else "true" for k, v in deployed.items()})
        self.restarted_k8s_clients = True
        self._set_state("success", deployed)

    def _start_clients(self) -> None:
        for unit in getattr(self, "_stopped", None) or []:
            self.systemctl("start", unit)
        self._stopped = []

    def _apply_mode(self, plan: dict[int, dict[str, int] | None], gpus: dict[int, tuple[int, bool]]) -> str:
        """`nvidia-mig-parted apply --mode-only`: MIG mode per GPU; the first error, or ""."""
        for index, want in sorted(plan.items()):
            on = gpus.get(index, (0, False))[1]
            if (want is not None) == on:
                continue
            if on:  # MIG off: its instances go first
                self._destroy(index)
            rc, out = self.smi("-i", str(index), "-mig", "1" if want is not None else "0")
            if rc != 0:
                return out.splitlines()[0] if out else f"nvidia-smi -mig exited {rc}"
        return ""

    def _destroy(self, index: int) -> str:
        rc, listing = self.smi("-L")
        if rc == 0 and parse_listing(listing).get(index):
            for flag in ("-dci", "-dgi"):
                rc, out = self.smi("mig", "-i", str(index), flag)
                if rc != 0:
                    return out.splitlines()[0] if out else f"nvidia-smi mig {flag} exited {rc}"
        return ""

    def _apply_devices(self, plan: dict[int, dict[str, int] | None]) -> str:
        """`nvidia-mig-parted apply`: every MIG-enabled GPU's instances rebuilt as the config says, the
        larger profiles first (their placements are the scarcer)."""
        rc, listing = self.smi("-L")
        have = parse_listing(listing) if rc == 0 else {}
        for index, want in sorted(plan.items()):
            if want is None or have.get(index, {}) == want:
                continue
            error = self._destroy(index)
            if error:
                return error
            profiles = sorted(want, key=lambda p: (-int(p.split("g.", 1)[0]), p))
            names = [p for p in profiles for _ in range(want[p])]
            if names:
                rc, out = self.smi("mig", "-i", str(index), "-cgi", ",".join(names), "-C")
                if rc != 0:
                    return out.splitlines()[-1] if out else f"nvidia-smi mig -cgi exited {rc}"
        return ""


# SIMULATED: the manager processes of this kubelet process, by (host root, pod uid).
_RUNNING: dict[tuple[str, str], MigManager] = {}
_LOCK = threading.Lock()


def ensure_running(host: Host, uid: str, make: Callable[[], MigManager]) -> MigManager:
    key = (str(host.root), uid)
    with _LOCK:
        m = _RUNNING.get(key)
        if m is None or not m.alive():
            m = make()
            _RUNNING[key] = m
            m.start()
        return m


def stop_all() -> None:
    """Stop every manager thread (tests' cleanup)."""
    with _LOCK:
        managers = list(_RUNNING.values())
        _RUNNING.clear()
    for m in managers:
        m.stop.set()
