"""The machine a SIMULATED Kubernetes tool runs on: its files (under ``root``), services, commands,
addresses and the settings the real tools read from it (sysctl configuration, swap, the container
runtime's configuration).

On a lab host ``Host()`` is the machine itself (root ``/``, systemctl, real ports). Tests give each
simulated node a temporary root, an in-process service manager and their own ports (see kube_testing),
so the same code paths run off-host.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_V3_RUNTIME = "io.containerd.cri.v1.runtime"
FAULTS_FILE = "/etc/gpuprov-lab/faults.json"
SYSCTL_DIRS = (
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
)


@dataclass
class Host:
    """A machine seen by the sim tools. Subclassed by tests; the defaults are the real host."""

    root: Path = field(default_factory=lambda: Path("/"))
    name: str | None = None
    ip: str | None = None
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    # ---------------------------------------------------------------------------------------- files
    def p(self, path: str) -> Path:
        return self.root / str(path).lstrip("/")

    def exists(self, path: str) -> bool:
        return self.p(path).exists()

    def read(self, path: str, default: str | None = None) -> str | None:
        try:
            return self.p(path).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
            return default

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return self.p(path).read_bytes()
        except OSError:
            return None

    def write(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Atomic write (temp file + rename), parents created."""
        target = self.p(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def remove(self, path: str) -> None:
        target = self.p(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.p(path)))
        except OSError:
            return []

    def glob(self, pattern: str) -> list[str]:
        base = str(self.root).rstrip("/")
        return sorted("/" + os.path.relpath(m, base or "/") for m in glob.glob(str(self.p(pattern))))

    # ------------------------------------------------------------------------------------ identity
    def hostname(self) -> str:
        return self.name or socket.gethostname()

    def node_name(self) -> str:
        """Kubernetes node name: the lowercased hostname (as kubeadm and the kubelet default it)."""
        return self.hostname().lower()

    def node_ip(self) -> str:
        """The address of the interface that carries the default route (no packet is sent)."""
        if self.ip:
            return self.ip
        gateway = _default_gateway(self.read("/proc/net/route", "") or "")
        target = gateway or "10.255.255.255"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"

    def port(self, port: int) -> int:
        """The port actually used for a well-known port (tests remap them; a lab host does not)."""
        return port

    def bind_address(self, address: str) -> str:
        return address

    # ------------------------------------------------------------------------------------ commands
    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.env.get("PATH", PATH) + ":" + PATH)

    def run(
        self,
        argv: list[str],
        input: str | None = None,
        timeout: float = 60,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**self.env, "PATH": self.env.get("PATH", PATH) + ":" + PATH, "LC_ALL": "C", **(env or {})}
        try:
            return subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout, env=full_env, check=False
            )
        except FileNotFoundError as exc:
            return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {exc.strerror}\n")
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: timed out after {timeout:g}s\n")

    # ------------------------------------------------------------------------------------ services
    def systemctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", *args], timeout=90)

    def service_active(self, unit: str) -> bool:
        return self.systemctl("is-active", "--quiet", unit).returncode == 0

    def service_enabled(self, unit: str) -> bool:
        return self.systemctl("is-enabled", "--quiet", unit).returncode == 0

    def start_background(self, name: str, fn: Callable[[], None]) -> None:
        """Run a helper for the life of this process (threads on a real host)."""
        import threading

        threading.Thread(target=fn, name=name, daemon=True).start()

    # ------------------------------------------------------------------------------------ settings
    def swap_devices(self) -> list[str]:
        lines = (self.read("/proc/swaps", "") or "").splitlines()[1:]
        return [ln.split()[0] for ln in lines if ln.strip()]

    def sysctl_configured(self, key: str) -> str | None:
        """The value ``sysctl --system`` would set for key, from the configuration files.

        The lab reads configuration, never the live value: lab hosts share the kernel of the machine
        they run on, so the live net.ipv4.ip_forward and bridge-nf-call-iptables are that machine's,
        and the lab must never switch IPv4 forwarding on for it. A role that configures the setting in
        /etc/sysctl.d (and applies it) is what the real preflight then sees.
        """
        files: dict[str, str] = {}
        for d in reversed(SYSCTL_DIRS):
            for name in self.listdir(d):
                if name.endswith(".conf"):
                    files[name] = f"{d}/{name}"
        ordered = [files[n] for n in sorted(files)]
        if self.exists("/etc/sysctl.conf"):
            ordered.append("/etc/sysctl.conf")
        value: str | None = None
        want = key.replace("/", ".")
        for path in ordered:
            for line in (self.read(path, "") or "").splitlines():
                line = line.strip()
                if not line or line[0] in "#;" or "=" not in line:
                    continue
                k, v = line.lstrip("-").split("=", 1)
                if k.strip().replace("/", ".") == want:
                    value = v.strip()
        return value

    def os_release(self) -> dict[str, str]:
        out = {}
        for line in (
            self.read("/etc/os-release", "") or self.read("/usr/lib/os-release", "") or ""
        ).splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                out[k] = v.strip().strip('"')
        return out

    def kernel_release(self) -> str:
        return os.uname().release

    def mem_total_kib(self) -> int:
        for line in (self.read("/proc/meminfo", "") or "").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
        return 0

    def cpu_count(self) -> int:
        return os.cpu_count() or 1

    def faults(self) -> list[dict[str, Any]]:
        try:
            return list(json.loads(self.read(FAULTS_FILE, "") or "{}").get("faults", []))
        except ValueError:
            return []


def _default_gateway(route_table: str) -> str | None:
    for line in route_table.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 2 and parts[1] == "00000000":
            raw = bytes.fromhex(parts[2])[::-1]
            return socket.inet_ntoa(raw)
    return None


# ------------------------------------------------------------------------------------ containerd


@dataclass
class ContainerdConfig:
    """What the kubelet and kubeadm need to know of containerd's configuration."""

    cri_enabled: bool = True
    runtimes: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_runtime: str = "runc"
    enable_cdi: bool = False
    cdi_spec_dirs: list[str] = field(default_factory=lambda: ["/etc/cdi", "/var/run/cdi"])
    source: str = CONTAINERD_CONFIG
    error: str | None = None

    def systemd_cgroup(self, runtime: str | None = None) -> bool:
        rt = self.runtimes.get(runtime or self.default_runtime) or {}
        return bool((rt.get("options") or {}).get("SystemdCgroup", False))

    def has_runtime(self, handler: str) -> bool:
        return handler in self.runtimes

    def binary(self, handler: str) -> str:
        """The OCI runtime binary a runtime runs (runc's options.BinaryName; empty = runc itself)."""
        return str(((self.runtimes.get(handler) or {}).get("options") or {}).get("BinaryName") or "")


def containerd_config(host: Host) -> ContainerdConfig:
    """What containerd really uses: `containerd config dump` (config.toml with its imports merged the
    way that containerd version merges them: 1.x replaces a plugin's whole table with an imported file's,
    2.x merges key by key), read the way containerd 1.6/1.7 (version 2) and 2.x (version 3) lay it out.
    Where the dump cannot run (the off-host tests), config.toml itself; defaults when there is no file
    (CRI on, runc with cgroupfs)."""
    cfg = ContainerdConfig(runtimes={"runc": {"runtime_type": "io.containerd.runc.v2", "options": {}}})
    # Off-host (the tests' node roots) the machine's own containerd would read the machine's files.
    on_host = host.root == Path("/")
    dump = host.run(["containerd", "config", "dump"], timeout=30) if on_host else None
    if dump is not None and dump.returncode == 0 and dump.stdout.strip():
        text: str | None = dump.stdout
        cfg.source = "containerd config dump"
    else:
        text = host.read(CONTAINERD_CONFIG)
    if text is None:
        return cfg
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        cfg.error = f"failed to load TOML: {cfg.source}: {exc}"
        return cfg
    version = int(doc.get("version", 1) or 1)
    disabled = set(doc.get("disabled_plugins") or [])
    plugins = doc.get("plugins") or {}
    if version >= 3:
        cri = plugins.get(CRI_V3_RUNTIME) or {}
    elif version == 2:
        cri = plugins.get(CRI_V2) or {}
    else:
        cri = plugins.get("cri") or {}
    section = cri.get("containerd") or {}
    if section.get("default_runtime_name"):
        cfg.default_runtime = section["default_runtime_name"]
    for name, rt in (section.get("runtimes") or {}).items():
        merged = dict(cfg.runtimes.get(name, {}))
        merged.update({k: v for k, v in rt.items() if k != "options"})
        merged["options"] = {**(merged.get("options") or {}), **(rt.get("options") or {})}
        cfg.runtimes[name] = merged
    # containerd 1.7 has enable_cdi false by default, 2.x true (pkg/cri/config DefaultConfig); 1.6 has none.
    cfg.enable_cdi = bool(cri.get("enable_cdi", version >= 3))
    if cri.get("cdi_spec_dirs"):
        cfg.cdi_spec_dirs = [str(d) for d in cri["cdi_spec_dirs"]]
    cfg.cri_enabled = not ({"cri", CRI_V2, CRI_V3_RUNTIME, "io.containerd.grpc.v1.cri"} & disabled)
    return cfg
