"""Where the lab keeps its state and caches, and the rules for lab and host names.

State of one lab lives under ``/var/lib/gpuprov/labs/<name>/`` (removed by ``lab down``); caches shared by
every lab (rootfs, .debs, mirror, signing key) under ``/var/cache/gpuprov/``. Both roots can be moved with
``GPUPROV_LAB_STATE_ROOT`` / ``GPUPROV_CACHE_DIR`` (used by tests that must not touch the real ones).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import InputError

LAB_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
LABEL = "gpuprov.lab"
HOST_LABEL = "gpuprov.lab.host"


def state_root() -> Path:
    return Path(os.environ.get("GPUPROV_LAB_STATE_ROOT", "/var/lib/gpuprov"))


def cache_root() -> Path:
    return Path(os.environ.get("GPUPROV_CACHE_DIR", "/var/cache/gpuprov"))


def labs_root() -> Path:
    return state_root() / "labs"


def engine_dir() -> Path:
    """Records of the Docker engine gpuprov started (PID, log); removed when gpuprov stops it."""
    return state_root() / "engine"


def check_lab_name(name: str) -> str:
    if not LAB_NAME_RE.match(name):
        raise InputError(
            f"--lab {name!r}: a lab name is 1-24 characters: a lowercase letter, then lowercase letters, "
            "digits or '-'"
        )
    return name


@dataclass(frozen=True)
class LabPaths:
    """Every path that belongs to one lab; all of it sits under ``root`` so removal is one rmtree."""

    name: str

    @property
    def root(self) -> Path:
        return labs_root() / self.name

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yml"

    @property
    def mirror_pid(self) -> Path:
        return self.root / "mirror.pid"

    @property
    def mirror_log(self) -> Path:
        return self.root / "mirror.log"

    def host_dir(self, host: str) -> Path:
        """Bind-mounted read-only at /etc/gpuprov-lab in the host: profile.json, faults.json."""
        return self.root / "hosts" / host

    def host_key_dir(self, host: str) -> Path:
        return self.root / "hostkeys" / host

    @property
    def network(self) -> str:
        return f"gpuprov-{self.name}"

    def container(self, host: str) -> str:
        return f"gpuprov-{self.name}-{host}"

    def volume(self, host: str, what: str) -> str:
        return f"gpuprov-{self.name}-{host}-{what}"


def digest(*parts: bytes | str) -> str:
    """sha256 over length-prefixed parts: the cache key of an image, a mirror part, a rootfs."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def tree_manifest(root: Path) -> list[str]:
    """Path, mode and content hash of every file in a tree (symlinks by target), for cache keys."""
    if not root.is_dir():
        return ["(none)"]
    parts: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                parts.append(f"{rel} -> {os.readlink(p)}")
            else:
                sha = hashlib.sha256(p.read_bytes()).hexdigest()
                parts.append(f"{rel} {p.stat().st_mode & 0o7777:o} {sha}")
    return parts
