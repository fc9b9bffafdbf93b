"""How a host is reached over SSH, as far as an inventory host (inventory.HostSpec) and the SSH executor's
target (executors.ssh_target.SshTarget, made from one) both say it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SshAccess:
    """A host's name, its address and port, the user, the key, and how its host key is checked."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    private_key_file: Path | None = None
    known_hosts_file: Path | None = None
    strict_host_key_checking: bool = True
