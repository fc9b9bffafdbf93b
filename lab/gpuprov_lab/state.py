"""The record of one lab (``lab.json``): what ``lab up`` made, so that status, faults, inventory and
``lab down`` work from it. Writes are atomic; a missing file means the lab does not exist."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov_lab import paths
from gpuprov_lab.plan import PlannedHost
from provisioner.errors import InputError

FORMAT = 1


@dataclass
class LabState:
    name: str
    subnet: str
    gateway: str
    mirror_port: int
    images: dict[str, str] = field(default_factory=dict)  # Debian release → host image tag
    mirror_dir: str = ""
    hosts: list[PlannedHost] = field(default_factory=list)

    @property
    def paths(self) -> paths.LabPaths:
        return paths.LabPaths(self.name)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def mirror_url(self) -> str:
        return f"http://{self.gateway}:{self.mirror_port}"

    def host(self, name: str) -> PlannedHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise InputError(
            f"host {name!r} is not in lab {self.name!r} (hosts: {', '.join(h.name for h in self.hosts)})"
        )

    def ssh_argv(self, ip: str, *command: str, timeout: int = 5) -> list[str]:
        """ssh to a lab host as root with the lab key and host key checking on; only errors said."""
        lp = self.paths
        return ssh_argv(
            lp.ssh_key, lp.known_hosts, ip, *command, timeout=timeout, options=("LogLevel=ERROR",)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "subnet": self.subnet,
            "gateway": self.gateway,
            "mirror_port": self.mirror_port,
            "images": self.images,
            "mirror_dir": self.mirror_dir,
            "hosts": [h.to_json() for h in self.hosts],
        }

    def save(self) -> None:
        write_json(self.paths.state_file, self.to_json())


def ssh_argv(
    key: Path, known_hosts: Path, ip: str, *command: str, timeout: int, options: tuple[str, ...] = ()
) -> list[str]:
    """ssh to a lab host as root with `key` alone, host keys checked against `known_hosts`, never asking
    anything; `options`: more -o options."""
    return [
        "ssh",
        "-i", str(key),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={timeout}",
        *(arg for option in options for arg in ("-o", option)),
        f"root@{ip}",
        *command,
    ]  # fmt: skip


def write_json(path: Path, doc: Any, mode: int = 0o644) -> None:
    """Atomic write (rename), so readers inside hosts never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.chmod(mode)
    os.replace(tmp, path)


def load(name: str) -> LabState | None:
    f = paths.LabPaths(name).state_file
    if not f.exists():
        return None
    doc = json.loads(f.read_text())
    return LabState(
        name=doc["name"],
        subnet=doc["subnet"],
        gateway=doc["gateway"],
        mirror_port=int(doc["mirror_port"]),
        images=dict(doc.get("images") or {}),
        mirror_dir=doc.get("mirror_dir", ""),
        hosts=[PlannedHost.from_json(h) for h in doc.get("hosts", [])],
    )


def require(name: str) -> LabState:
    st = load(paths.check_lab_name(name))
    if st is None:
        raise InputError(f"lab {name!r} does not exist (start it with: gpuprov lab up --lab {name})")
    return st


def all_labs() -> list[str]:
    root = paths.labs_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "lab.json").exists())


@contextmanager
def lock() -> Iterator[None]:
    """One lab change at a time on this machine (engine start, caches, subnets are shared)."""
    root = paths.labs_root()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
