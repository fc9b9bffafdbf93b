"""Run the SIMULATED Kubernetes off-host: each node is a temporary root with its own ports on loopback, an
in-process service manager (kubelet and the API server run as threads, containerd is a switch) and the
host commands the tools call (nvidia-smi, containerd, kubelet --version) answered by fakes. kubeadm,
kubectl and helm then run exactly their on-host code paths. Used by tests/unit/test_sim_kube*.py.

Not shipped to lab hosts.
"""

from __future__ import annotations

import io
import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import kube_adm, kube_api, kube_ctl, kube_helm, kube_let
from .kube_host import CONTAINERD_SOCK, Host

Command = Callable[[list[str]], tuple[int, str, str]]
API_UNIT = kube_let.API_UNIT
WELL_KNOWN_PORTS = (10248, 10250, 10255, 10257, 10259, 2379, 2380, 9400)  # 9400: dcgm-exporter
CONTAINERD_OK = """\
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""
NVIDIA_RUNTIME = """
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
    SystemdCgroup = true
"""
TOOLS = ("ip", "iptables", "mount", "nsenter", "ebtables", "ethtool", "socat", "tc", "touch")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Services:
    """systemctl for one simulated node: containerd is a switch, kubelet and the API server are threads."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.enabled: set[str] = {"kubelet"}
        self.containerd = False
        self.kubelet: tuple[threading.Thread, threading.Event] | None = None
        self.kubelet_wanted = False
        self.kubelet_running = threading.Event()
        self.api: kube_api.ApiServer | None = None
        self.lock = threading.RLock()

    # -- containerd
    def set_containerd(self, on: bool) -> None:
        self.containerd = on
        sock = self.host.p(CONTAINERD_SOCK)
        if on:
            sock.parent.mkdir(parents=True, exist_ok=True)
            sock.touch()
        else:
            sock.unlink(missing_ok=True)

    # -- kubelet
    def _kubelet_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            argv = kube_let.unit_argv(self.host)
            err = io.StringIO()
            try:
                k = kube_let.Kubelet(self.host, argv, stop)
                k.check_start()
                k.serve()
                k.healthy = True
                self.kubelet_running.set()
                while not stop.is_set():
                    try:
                        k.sync()
                    except Exception as exc:  # the real kubelet logs and keeps going
                        err.write(f"{exc!r}\n")
                        self.host.log.append(f"kubelet: {exc!r}")
                    stop.wait(self.host.sync_period)
                for srv in k.servers:
                    srv.shutdown()
                    srv.server_close()
                if k.client is not None:
                    k.client.close()
            except kube_let.KubeletExit as exc:
                self.host.log.append(f"kubelet exited: {exc}")
            except Exception as exc:
                self.host.log.append(f"kubelet crashed: {exc!r}")
            finally:
                self.kubelet_running.clear()
            stop.wait(self.host.restart_delay)

    def start_kubelet(self) -> None:
        with self.lock:
            if self.kubelet is not None:
                return
            stop = threading.Event()
            t = threading.Thread(
                target=self._kubelet_loop, args=(stop,), name=f"kubelet-{self.host.name}", daemon=True
            )
            self.kubelet = (t, stop)
            t.start()

    def stop_kubelet(self) -> None:
        with self.lock:
            if self.kubelet is None:
                return
            t, stop = self.kubelet
            self.kubelet = None
        stop.set()
        t.join(timeout=15)

    # -- API server
    def start_api(self) -> None:
        with self.lock:
            if self.api is not None:
                return
            use_vendor_artifacts()
            api = kube_api.ApiServer(self.host)
            api.start()
            self.api = api

    def stop_api(self) -> None:
        with self.lock:
            api, self.api = self.api, None
        if api is not None:
            api.stop()

    def active(self, unit: str) -> bool:
        unit = unit.removesuffix(".service")
        if unit == "containerd":
            return self.containerd
        if unit == "kubelet":
            return self.kubelet is not None and self.kubelet_running.is_set()
        if unit == API_UNIT.removesuffix(".service"):
            return self.api is not None
        return False

    def systemctl(self, args: list[str]) -> tuple[int, str, str]:
        args = [a for a in args if a not in ("--quiet", "-q", "--no-block", "--system")]
        if not args:
            return 1, "", "systemctl: no verb"
        verb, units = args[0], [u.removesuffix(".service") for u in args[1:] if not u.startswith("-")]
        now = "--now" in args
        if verb == "is-active":
            ok = all(self.active(u) for u in units)
            return (0 if ok else 3), ("active\n" if ok else "inactive\n"), ""
        if verb == "is-enabled":
            ok = all(u in self.enabled for u in units)
            return (0 if ok else 1), ("enabled\n" if ok else "disabled\n"), ""
        if verb == "daemon-reload":
            return 0, "", ""
        for unit in units:
            if verb in ("enable", "disable"):
                (self.enabled.add if verb == "enable" else self.enabled.discard)(unit)
                if not now:
                    continue
                verb_now = "start" if verb == "enable" else "stop"
            else:
                verb_now = verb
            if unit == "kubelet":
                if verb_now in ("stop", "restart"):
                    self.stop_kubelet()
                if verb_now in ("start", "restart"):
                    self.start_kubelet()
            elif unit == API_UNIT.removesuffix(".service"):
                if verb_now in ("stop", "restart"):
                    self.stop_api()
                if verb_now in ("start", "restart"):
                    if not self.host.exists("/etc/kubernetes/manifests/kube-apiserver.yaml"):
                        continue  # ConditionPathExists
                    self.start_api()
            elif unit == "containerd":
                if verb_now == "stop":
                    self.set_containerd(False)
                elif verb_now in ("start", "restart"):
                    self.set_containerd(True)
            else:
                return 5, "", f"Failed to {verb_now} {unit}.service: Unit {unit}.service not found.\n"
        return 0, "", ""

    def shutdown(self) -> None:
        self.stop_kubelet()
        self.stop_api()


@dataclass(eq=False)
class SimHost(Host):
    """One simulated node (a temporary root) on loopback."""

    ports: dict[int, int] = field(default_factory=dict)
    commands: dict[str, Command] = field(default_factory=dict)
    sync_period: float = 0.3
    restart_delay: float = 0.5
    log: list[str] = field(default_factory=list)
    services: Services | None = None
    gpus: list[str] = field(default_factory=list)
    driver_ok: bool = True
    key_pool: list[str] = field(default_factory=list)
    mig: FakeMig = field(default_factory=lambda: FakeMig())
    smi_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.services = Services(self)
        for p in WELL_KNOWN_PORTS:
            self.ports.setdefault(p, free_port())
        self.commands.setdefault("systemctl", self.services.systemctl)
        self.commands.setdefault(
            "containerd",
            lambda a: (0, "containerd github.com/containerd/containerd 1.6.20 1.6.20~ds1-1+b1\n", ""),
        )
        self.commands.setdefault("kubelet", self._kubelet_cmd)
        self.commands.setdefault("nvidia-smi", self._nvidia_smi)
        self.env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(self.root / "root")}

    def port(self, port: int) -> int:
        return self.ports.get(port, port)

    def bind_address(self, address: str) -> str:
        return "127.0.0.1"

    def which(self, name: str) -> str | None:
        if name in self.commands:
            return f"/usr/bin/{name}"
        for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
            if self.p(f"{d}/{name}").exists():
                return f"{d}/{name}"
        return None

    def run(self, argv: list[str], input: str | None = None, timeout: float = 60, env: Any = None) -> Any:
        fn = self.commands.get(argv[0].rsplit("/", 1)[-1])
        if fn is not None:
            rc, out, err = fn(list(argv[1:]))
            return subprocess.CompletedProcess(argv, rc, out, err)
        return super().run(argv, input=input, timeout=timeout, env=env)

    def _kubelet_cmd(self, args: list[str]) -> tuple[int, str, str]:
        return 0, f"Kubernetes {kube_let.VERSION}\n", ""

    def _nvidia_smi(self, args: list[str]) -> tuple[int, str, str]:
        if not self.gpus or not self.driver_ok:
            return (
                9,
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                "that "
                "the latest NVIDIA driver is installed and running.\n",
                "",
            )
        with self.smi_lock:
            return self.mig.answer(self.gpus, args)


# PCI device ids (mig-parted's device-filter and `--query-gpu=pci.device_id`) of the GPUs tests use.
DEVICE_IDS = {"NVIDIA H200": 0x2335, "NVIDIA H100 80GB HBM3": 0x2330, "NVIDIA A100-SXM4-80GB": 0x20B2}


@dataclass
class FakeMig:
    """A small fake of the nvidia-smi MIG commands, for in-process tests (the lab's hosts answer them
    with their own emulation): `-L` with MIG devices under their GPU, `--query-gpu` (name,
    memory.total, driver_version, index, pci.device_id, mig.mode.current), `-i N -mig 1|0`,
    `mig -i N -dci`, `-dgi`, `-cgi <profiles> -C`. ``fail_mode_change`` makes `-mig` fail with that
    error (e.g. "In use by another client")."""

    mode: dict[int, bool] = field(default_factory=dict)
    instances: dict[int, list[str]] = field(default_factory=dict)
    fail_mode_change: str = ""
    calls: list[list[str]] = field(default_factory=list)

    @staticmethod
    def _bus(i: int) -> str:
        return f"00000000:{0x1B + i:02X}:00.0"

    def answer(self, gpus: list[str], args: list[str]) -> tuple[int, str, str]:
        from .kube_mig import MEMORY_SLICES, PROFILES

        self.calls.append(list(args))
        index = int(args[args.index("-i") + 1]) if "-i" in args else None
        if "-L" in args:
            out = ""
            for i, g in enumerate(gpus):
                out += f"GPU {i}: {g} (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)\n"
                for d, profile in enumerate(self.instances.get(i, [])):
                    out += (
                        f"  MIG {profile:<12} Device {d:>2}: (UUID: MIG-{i:08d}-{d:04d}-0000-0000-00000000)\n"
                    )
            return 0, out, ""
        query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
        if query is not None:
            rows = []
            for i, g in enumerate(gpus):
                capable = DEVICE_IDS.get(g) in PROFILES
                mode = ("Enabled" if self.mode.get(i) else "Disabled") if capable else "[N/A]"
                values = {
                    "index": str(i), "name": g, "memory.total": "143771", "driver_version": "580.95.05",
                    "pci.device_id": f"0x{DEVICE_IDS.get(g, 0x2335):04X}10DE", "mig.mode.current": mode,
                }  # fmt: skip
                rows.append(", ".join(values.get(f, "[N/A]") for f in query.split(",")))
            return 0, "".join(r + "\n" for r in rows), ""
        if "-mig" in args and index is not None:
            on = args[args.index("-mig") + 1] == "1"
            word = "Enabled" if on else "Disabled"
            if self.fail_mode_change:
                verb = "enable" if on else "disable"
                return (
                    1,
                    f"Unable to {verb} MIG Mode for GPU {self._bus(index)}: {self.fail_mode_change}\n",
                    "",
                )
            if not on and self.instances.get(index):
                return (
                    1,
                    f"Unable to disable MIG Mode for GPU {self._bus(index)}: In use by another client\n",
                    "",
                )
            self.mode[index] = on
            return 0, f"{word} MIG Mode for GPU {self._bus(index)}\nAll done.\n", ""
        if args[:1] == ["mig"] and index is not None:
            if not self.mode.get(index):
                return 6, f"Unable to run the command on GPU {index}: MIG mode is not enabled\n", ""
            if "-dci" in args or "-dgi" in args:
                if "-dgi" in args:
                    self.instances[index] = []
                return 0, "", ""
            if "-cgi" in args:
                wanted = args[args.index("-cgi") + 1].split(",")
                table = PROFILES[DEVICE_IDS.get(gpus[index], 0x2335)]
                have = list(self.instances.get(index, []))
                out = ""
                for name in wanted:
                    p = table.get(name)
                    used = sum(table[x][1] for x in have)
                    if p is None or used + p[1] > MEMORY_SLICES:
                        self.instances[index] = have
                        return (
                            2,
                            out + f"Unable to create a GPU instance on GPU {index} using profile {name}: "
                            "Insufficient Resources\n",
                            "",
                        )
                    have.append(name)
                    out += (
                        f"Successfully created GPU instance ID {len(have):>2} on GPU {index:>2} "
                        f"using profile MIG {name}\n"
                    )
                self.instances[index] = have
                return 0, out, ""
        return 0, "NVIDIA-SMI 580.95.05    Driver Version: 580.95.05    CUDA Version: 13.0\n", ""


_KEYS: list[str] = []


def key_pool(n: int = 8) -> list[str]:
    """RSA keys generated once per process and shared by the simulated nodes (keygen dominates kubeadm
    init on a small machine; distinct keys are not what the tests check)."""
    from . import kube_pki

    while len(_KEYS) < n:
        _KEYS.append(kube_pki.new_key(Host()))
    return list(_KEYS)


def make_node(root: Path, name: str, gpus: int = 0, shared_keys: bool = True) -> SimHost:
    """A prepared node: os-release, the tools kubeadm looks for, IPv4 forwarding configured, containerd on
    with SystemdCgroup, kubelet enabled; with ``gpus`` H200s on the PCI bus and a working driver."""
    root.mkdir(parents=True, exist_ok=True)
    h = SimHost(root=root, name=name, ip="127.0.0.1", key_pool=key_pool() if shared_keys else [])
    h.write("/proc/meminfo", "MemTotal:       65843180 kB\nMemFree:        60000000 kB\n")
    h.write("/etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n')
    h.write(
        "/etc/sysctl.d/99-kubernetes.conf",
        "net.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\n",
    )
    h.write("/etc/modules-load.d/k8s.conf", "overlay\nbr_netfilter\n")
    for t in TOOLS:
        h.write(f"/usr/sbin/{t}", "#!/bin/sh\n", 0o755)
    h.write("/etc/containerd/config.toml", CONTAINERD_OK)
    assert h.services is not None
    h.services.set_containerd(True)
    h.gpus = ["NVIDIA H200"] * gpus
    for i in range(gpus):
        d = f"/sys/bus/pci/devices/0000:{0x1B + i:02x}:00.0"
        h.write(f"{d}/vendor", "0x10de\n")
        h.write(f"{d}/device", "0x2335\n")
        h.write(f"{d}/class", "0x030200\n")
    h.write("/sys/bus/pci/devices/0000:00:00.0/vendor", "0x8086\n")
    h.write("/sys/bus/pci/devices/0000:00:00.0/class", "0x060000\n")
    return h


def use_vendor_artifacts() -> None:
    """Off a lab host, the lab's helm and operator find the real helm binary and the GPU Operator's
    manifests (which a lab host's packages carry) among the vendor artifacts."""
    from gpuprov_lab import vendor

    os.environ.setdefault("GPUPROV_LAB_REAL_HELM", str(vendor.helm()))
    os.environ.setdefault("GPUPROV_LAB_OPERATOR_ASSETS", str(vendor.artifact("gpu-operator", "assets")))


class Tool:
    """Run a sim CLI in-process: (rc, stdout, stderr)."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        use_vendor_artifacts()

    def kubeadm(self, *args: str, stdin: str = "") -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = kube_adm.main(list(args), self.host, out, err, io.StringIO(stdin))
        return rc, out.getvalue(), err.getvalue()

    def kubectl(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = kube_ctl.main(["--kubeconfig", "/etc/kubernetes/admin.conf", *args], self.host, out, err)
        return rc, out.getvalue(), err.getvalue()

    def helm(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = kube_helm.main(["--kubeconfig", "/etc/kubernetes/admin.conf", *args], self.host, out, err)
        return rc, out.getvalue(), err.getvalue()


def wait_for(pred: Callable[[], Any], timeout: float = 30, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout:g}s (last: {last!r})")


def join_argv(init_stdout: str) -> list[str]:
    """The join command kubeadm init printed, as argv (without 'kubeadm')."""
    text = init_stdout[init_stdout.index("kubeadm join") :].replace("\\\n", " ")
    return shlex.split(text.splitlines()[0])[1:]
