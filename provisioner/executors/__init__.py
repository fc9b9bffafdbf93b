"""Where commands run: one small interface over SSH (paramiko), this machine, and a recorded snapshot.

Every executor answers `run(argv_or_script, timeout) -> CommandResult`. A string is a shell script
run by `sh -c`; a sequence is an argv, quoted by the executor. Connection problems become
`HostUnreachable` with the reason (refused, timed out, host key unknown or changed, authentication
failed), so a fleet run can report that host as `error` and carry on with the others.

SSH reaches hosts the way `ansible-playbook` does through OpenSSH: ~/.ssh/config (parsed, never
executed) and the inventory's ssh arguments, jump hosts included (ProxyJump, -J, and the
`ssh -W %h:%p` ProxyCommand idiom, as direct-tcpip channels); `SshTarget.from_host` says how.

One backend per module: base (the interface, its results and errors), local, ssh (with ssh_target: how
a host is reached), snapshot. The names the rest of the product uses are taken from here.
"""

from provisioner.executors.base import (
    CommandResult,
    CommandStream,
    CommandTimeout,
    Executor,
    ExecutorError,
    HostUnreachable,
    OpenConnections,
    recorded_seconds,
    to_shell,
)
from provisioner.executors.local import LocalExecutor, LocalStream
from provisioner.executors.snapshot import (
    MAX_SNAPSHOT_FILE,
    MAX_SNAPSHOT_META,
    SnapshotExecutor,
    SnapshotFileRefused,
)
from provisioner.executors.ssh import KEYS, SshExecutor, SshStream
from provisioner.executors.ssh_target import (
    SSH_CONFIG_ENV,
    JumpHop,
    SshTarget,
    load_ssh_config,
    parse_proxy_command,
    parse_ssh_args,
)

__all__ = [
    "KEYS",
    "MAX_SNAPSHOT_FILE",
    "MAX_SNAPSHOT_META",
    "SSH_CONFIG_ENV",
    "CommandResult",
    "CommandStream",
    "CommandTimeout",
    "Executor",
    "ExecutorError",
    "HostUnreachable",
    "JumpHop",
    "LocalExecutor",
    "LocalStream",
    "OpenConnections",
    "SnapshotExecutor",
    "SnapshotFileRefused",
    "SshExecutor",
    "SshStream",
    "SshTarget",
    "load_ssh_config",
    "parse_proxy_command",
    "parse_ssh_args",
    "recorded_seconds",
    "to_shell",
]
