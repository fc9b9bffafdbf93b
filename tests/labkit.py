"""Helpers for tests that drive a lab through the real CLI: running ``gpuprov``, reading a lab back from
its inventory, and SSH to its hosts with host key checking on. Used by tests/conftest.py (the session
lab fixture), by tests that bring up labs of their own and by the benchmarks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# cp1 and one GPU host of each containerd generation (the default lab).
LAB_HOSTS = 4


def gpuprov(
    *args: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (``python -m provisioner``) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=False,
    )


@dataclass(frozen=True)
class LabHost:
    name: str
    ip: str
    profile: str
    gpu_count: int
    os: str = "bookworm"


@dataclass(frozen=True)
class Lab:
    """A running lab as the tests see it: its inventory and SSH that checks host keys."""

    name: str
    inventory: Path
    hosts: dict[str, LabHost]
    ssh_key: Path
    known_hosts: Path
    mirror_url: str
    mirror_key_fingerprint: str
    registry_url: str = ""

    @property
    def tools_image(self) -> str:
        """The lab's own image (a shell, NVIDIA's nvidia-smi, kubectl) by the lab registry's address."""
        from gpuprov_lab.kube import images

        host = self.registry_url.split("://", 1)[-1]
        return f"{host}/{images.TOOLS_REPOSITORY}:{images.TOOLS_TAG}"

    def ssh_argv(
        self, host: str, command: str, known_hosts: Path | None = None, timeout: int = 10
    ) -> list[str]:
        from gpuprov_lab.state import ssh_argv

        ip = self.hosts[host].ip
        return ssh_argv(self.ssh_key, known_hosts or self.known_hosts, ip, command, timeout=timeout)

    def ssh(
        self,
        host: str,
        command: str,
        *,
        known_hosts: Path | None = None,
        timeout: float = 600,
        connect: int = 10,
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command on a lab host over SSH (host key checking on)."""
        return subprocess.run(
            self.ssh_argv(host, command, known_hosts, connect),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def hosts_on(self, *oses: str) -> list[str]:
        """The GPU hosts running one of these lab OS flavours (bookworm, trixie, trixie-containerd2)."""
        return [n for n, h in self.hosts.items() if h.gpu_count and h.os in oses]

    def cli(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        """`gpuprov <args> --lab <this lab>`."""
        return gpuprov(*args, "--lab", self.name, timeout=timeout)


def lab_from_inventory(name: str, inventory: Path) -> Lab:
    doc = yaml.safe_load(inventory.read_text())["all"]
    common = doc["vars"]
    hosts: dict[str, LabHost] = {}
    for group in ("kube_control_plane", "gpu_nodes"):
        for host, hv in (doc["children"][group].get("hosts") or {}).items():
            hosts[host] = LabHost(
                host,
                hv["ansible_host"],
                hv["lab_profile"],
                hv["lab_gpu_count"],
                hv.get("lab_os", "bookworm"),
            )
    args = common["ansible_ssh_common_args"].split()
    known = next(a.split("=", 1)[1] for a in args if a.startswith("UserKnownHostsFile="))
    return Lab(
        name=name,
        inventory=inventory,
        hosts=hosts,
        ssh_key=Path(common["ansible_ssh_private_key_file"]),
        known_hosts=Path(known),
        mirror_url=common["gpuprov_mirror_url"],
        mirror_key_fingerprint=common["gpuprov_mirror_key_fingerprint"],
        registry_url=common.get("gpuprov_registry_mirror_url", ""),
    )


def lab_unavailable() -> str | None:
    """Why no lab can run on this machine, or None."""
    from gpuprov_lab.engine import unavailable_reason

    return unavailable_reason()


def require_lab() -> None:
    """Skip (or, with GPUPROV_REQUIRE_LAB=1, fail) when the lab cannot run here."""
    reason = lab_unavailable()
    if reason is None:
        return
    import pytest

    if os.environ.get("GPUPROV_REQUIRE_LAB") == "1":
        pytest.fail(f"GPUPROV_REQUIRE_LAB=1 but the lab cannot run here: {reason}", pytrace=False)
    pytest.skip(f"the lab cannot run here: {reason}")


def unique_lab_name(prefix: str = "t") -> str:
    return f"{prefix}{os.getpid() % 100000}-{uuid.uuid4().hex[:6]}"


# What a host's "state" is for reset's round trip, read by the tests themselves (not by the ledger that
# reset works from): installed packages, holds, every file under apt's configuration and the engines'
# configuration directories with its checksum, and which of the stack's directories exist.
STATE_FILE_DIRS = (
    "/etc/apt/sources.list",
    "/etc/apt/sources.list.d",
    "/etc/apt/keyrings",
    "/etc/apt/trusted.gpg.d",
    "/usr/share/keyrings",
    "/etc/apt/preferences.d",
    "/etc/apt/apt.conf.d",
    "/etc/docker",
    "/etc/containerd",
)
STATE_DIRS = (
    "/etc/docker",
    "/etc/containerd",
    "/etc/kubernetes",
    "/etc/cdi",
    "/var/run/cdi",
    "/etc/cni",
    "/opt/cni",
    "/var/lib/kubelet",
    "/var/lib/etcd",
    "/var/lib/cni",
    "/root/.kube",
    "/var/lib/gpuprov",
)


@dataclass(frozen=True)
class HostState:
    packages: frozenset[str]
    holds: frozenset[str]
    files: dict[str, str]  # path -> sha256
    dirs: frozenset[str]  # those of STATE_DIRS that exist

    def differences(self, other: HostState) -> list[str]:
        """What `other` has that this state has not, and the reverse (empty: the same)."""
        out = [f"package {p} added" for p in sorted(other.packages - self.packages)]
        out += [f"package {p} gone" for p in sorted(self.packages - other.packages)]
        out += [f"hold {h} added" for h in sorted(other.holds - self.holds)]
        out += [f"hold {h} gone" for h in sorted(self.holds - other.holds)]
        for path in sorted(set(self.files) | set(other.files)):
            if path not in other.files:
                out.append(f"{path} gone")
            elif path not in self.files:
                out.append(f"{path} added")
            elif self.files[path] != other.files[path]:
                out.append(f"{path} changed")
        out += [f"{d} exists" for d in sorted(other.dirs - self.dirs)]
        out += [f"{d} gone" for d in sorted(self.dirs - other.dirs)]
        return out


def host_state(lab: Lab, host: str) -> HostState:
    script = (
        "dpkg-query -W -f '${db:Status-Abbrev} ${binary:Package}\\n' | awk '$1 ~ /^.i/ {print \"pkg \" $2}'; "
        "apt-mark showhold | sed 's/^/hold /'; "
        f"for d in {' '.join(STATE_FILE_DIRS)}; do "
        '[ -e "$d" ] && find "$d" -type f -exec sha256sum {} +; '
        'done | awk \'{print "file " $2 " " $1}\'; '
        f'for d in {" ".join(STATE_DIRS)}; do [ -e "$d" ] && echo "dir $d"; done; true'
    )
    res = lab.ssh(host, script, timeout=120)
    assert res.returncode == 0, f"{host}: cannot read the host's state: {res.stderr}"
    packages, holds, dirs, files = set(), set(), set(), {}
    for line in res.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "pkg":
            packages.add(rest)
        elif kind == "hold":
            holds.add(rest)
        elif kind == "dir":
            dirs.add(rest)
        elif kind == "file":
            path, _, sha = rest.rpartition(" ")
            files[path] = sha
    return HostState(frozenset(packages), frozenset(holds), files, frozenset(dirs))
