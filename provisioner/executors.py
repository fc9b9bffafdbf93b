"""Where commands run: one small interface over SSH (paramiko), this machine, and a recorded snapshot.

Every executor answers `run(argv_or_script, timeout) -> CommandResult`. A string is a shell script
run by `sh -c`; a sequence is an argv, quoted by the executor. Connection problems become
`HostUnreachable` with the reason (refused, timed out, host key unknown or changed, authentication
failed), so a fleet run can report that host as `error` and carry on with the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from provisioner.errors import GpuprovError, InputError

if TYPE_CHECKING:  # paramiko is imported lazily: `gpuprov --help` must stay instant.
    import paramiko


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str
    duration_s: float


class ExecutorError(GpuprovError):
    """A command could not be run on a host; `reason` says why in a few words."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


class HostUnreachable(ExecutorError):
    """Could not connect or authenticate: the host was not touched."""


class CommandTimeout(ExecutorError):
    """The command ran past its timeout and was stopped."""


class Executor(Protocol):
    """Runs read-only commands on one host."""

    name: str

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult: ...

    def close(self) -> None: ...


def to_shell(command: Sequence[str] | str) -> str:
    """A script stays as written; an argv is quoted so that no argument is re-split by a shell."""
    if isinstance(command, str):
        return command
    return shlex.join(list(command))


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def recorded_seconds(value: object) -> float:
    """A recorded duration; anything but a finite non-negative number (a string, a list, NaN) is 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if 0 <= value < float("inf") else 0.0


# --------------------------------------------------------------------------------------------- local


class LocalExecutor:
    """This machine, through `/bin/sh`. Used by `--local` (the real GPU host has no sshd)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or socket.gethostname()

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # so a timeout can stop the whole process group
            )
        except OSError as exc:
            return CommandResult(127, "", f"{argv[0]}: {exc.strerror}", time.monotonic() - start)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CommandTimeout(self.name, f"command timed out after {timeout:g} s") from None
        return CommandResult(proc.returncode, _decode(out), _decode(err), time.monotonic() - start)

    def close(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------- ssh


@dataclass(frozen=True)
class SshTarget:
    """What SshExecutor needs to reach a host; built from an inventory HostSpec."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    private_key_file: Path | None = None
    known_hosts_file: Path | None = None
    strict_host_key_checking: bool = True
    # StrictHostKeyChecking=accept-new, as OpenSSH does it: a host not in known_hosts is recorded there
    # on first contact; a known host whose key changed is refused.
    accept_new: bool = False
    password: str | None = None

    @classmethod
    def from_host(cls, host: Any) -> SshTarget:
        """Accept any object shaped like inventory.HostSpec (duck-typed to keep the import light)."""
        key = getattr(host, "private_key_file", None)
        known = getattr(host, "known_hosts_file", None)
        return cls(
            name=host.name,
            address=getattr(host, "address", None) or host.name,
            port=int(getattr(host, "port", None) or 22),
            user=getattr(host, "user", None) or "root",
            private_key_file=Path(key).expanduser() if key else None,
            known_hosts_file=Path(known).expanduser() if known else None,
            strict_host_key_checking=bool(getattr(host, "strict_host_key_checking", True)),
            accept_new=bool(getattr(host, "accept_new_host_keys", False)),
            password=getattr(host, "password", None),
        )


class _KeyCache:
    """Known-hosts files and private keys are parsed once per run, not once per host."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, ...], tuple[tuple[float, ...], paramiko.HostKeys]] = {}
        self._keys: dict[Path, paramiko.PKey | Exception] = {}

    def known_hosts(self, files: tuple[Path, ...]) -> paramiko.HostKeys:
        import paramiko

        stamp = tuple(f.stat().st_mtime if f.exists() else -1.0 for f in files)
        cache_key = tuple(str(f) for f in files)
        with self._lock:
            cached = self._known.get(cache_key)
            if cached and cached[0] == stamp:
                return cached[1]
            keys = paramiko.HostKeys()
            for f in files:
                if f.exists():
                    try:
                        keys.load(str(f))
                    except (OSError, UnicodeDecodeError) as exc:
                        raise InputError(f"{f}: cannot read known_hosts: {exc}") from exc
            self._known[cache_key] = (stamp, keys)
            return keys

    def record(self, path: Path, name: str, key: paramiko.PKey) -> None:
        """Add a host key to a known_hosts file (accept-new), once, owner-only if the file is new."""
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            existing = path.read_text(errors="replace") if path.exists() else ""
            if line in existing:
                return
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as fh:
                if existing and not existing.endswith("\n"):
                    fh.write("\n")
                fh.write(line)
            self._known.clear()

    def private_key(self, path: Path) -> paramiko.PKey:
        import paramiko

        with self._lock:
            cached = self._keys.get(path)
            if cached is None:
                try:
                    cached = paramiko.PKey.from_path(str(path))
                except (OSError, paramiko.SSHException, ValueError) as exc:
                    cached = exc
                self._keys[path] = cached
        if isinstance(cached, Exception):
            raise cached
        return cached


KEYS = _KeyCache()
# The most of one command's stdout (and of its stderr) kept from a host.
MAX_COMMAND_OUTPUT = 64 * 1024 * 1024
_DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_rsa")


class SshExecutor:
    """One host over SSH (paramiko): host keys checked, one TCP connection reused for every command.

    Host key checking is on unless the inventory turns it off (StrictHostKeyChecking=no), and even
    then a key that *differs* from the recorded one is refused.
    """

    def __init__(
        self,
        target: SshTarget,
        connect_timeout: float = 10.0,
        keys: _KeyCache = KEYS,
        max_output: int = MAX_COMMAND_OUTPUT,
    ) -> None:
        self.max_output = max_output
        self.target = target
        self.name = target.name
        self.connect_timeout = connect_timeout
        self._keys = keys
        self._transport: paramiko.Transport | None = None

    # -- connection

    def _known_hosts_files(self) -> tuple[Path, ...]:
        if self.target.known_hosts_file is not None:
            return (self.target.known_hosts_file, Path("/etc/ssh/ssh_known_hosts"))
        return (Path("~/.ssh/known_hosts").expanduser(), Path("/etc/ssh/ssh_known_hosts"))

    def _host_key_name(self) -> str:
        t = self.target
        return t.address if t.port == 22 else f"[{t.address}]:{t.port}"

    def _recorded_keys(self) -> tuple[str, dict[str, paramiko.PKey], str]:
        files = self._known_hosts_files()
        known = self._keys.known_hosts(files)
        name = self._host_key_name()
        entry = known.lookup(name)
        where = ", ".join(str(f) for f in files if f.exists()) or str(files[0])
        return name, dict(entry.items()) if entry is not None else {}, where

    @staticmethod
    def _prefer_recorded_types(transport: paramiko.Transport, recorded: dict[str, paramiko.PKey]) -> None:
        """Ask for the host key types known_hosts holds (as OpenSSH does), so that a host with
        several keys answers with one we can check."""
        wanted: list[str] = []
        for kt in recorded:
            wanted += ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if kt == "ssh-rsa" else [kt]
        opts = transport.get_security_options()
        supported = list(opts.key_types)
        first = [a for a in wanted if a in supported]
        if first:
            opts.key_types = first + [a for a in supported if a not in first]

    def _check_host_key(
        self, key: paramiko.PKey, recorded: dict[str, paramiko.PKey], name: str, where: str
    ) -> None:
        known = recorded.get(key.get_name())
        if known is None:
            if recorded and self.target.accept_new:
                # accept-new accepts hosts never seen; a known host offering another key type is not new.
                raise HostUnreachable(
                    self.name,
                    f"host key for {name} ({key.get_name()}) is not the type known_hosts holds ({where}); "
                    "refusing to connect",
                )
            if self.target.strict_host_key_checking and not self.target.accept_new:
                raise HostUnreachable(
                    self.name,
                    f"host key for {name} ({key.get_name()}) is not in known_hosts ({where}); "
                    "add it (ssh-keyscan) or set StrictHostKeyChecking=accept-new for this host",
                )
            if self.target.accept_new:
                self._keys.record(self._known_hosts_files()[0], name, key)
            return
        if known != key:
            raise HostUnreachable(
                self.name,
                f"host key for {name} does not match known_hosts ({where}): possible man-in-the-middle, "
                "refusing to connect",
            )

    def _auth(self, transport: paramiko.Transport) -> None:
        import paramiko

        agent = paramiko.Agent() if os.environ.get("SSH_AUTH_SOCK") else None
        try:
            self._try_keys(transport, agent)
        finally:
            if agent is not None:
                agent.close()  # one agent connection per host would otherwise stay open for the run

    def _try_keys(self, transport: paramiko.Transport, agent: paramiko.Agent | None) -> None:
        import paramiko

        user = self.target.user
        tried: list[str] = []
        candidates: list[tuple[str, Any]] = []
        if self.target.private_key_file is not None:
            candidates.append((str(self.target.private_key_file), self.target.private_key_file))
        if agent is not None:
            with contextlib.suppress(paramiko.SSHException):
                candidates += [(f"agent:{k.get_name()}", k) for k in agent.get_keys()]
        if self.target.private_key_file is None:
            for ident in _DEFAULT_IDENTITIES:
                path = Path("~/.ssh").expanduser() / ident
                if path.exists():
                    candidates.append((str(path), path))
        for label, source in candidates:
            try:
                key = self._keys.private_key(source) if isinstance(source, Path) else source
            except (OSError, paramiko.SSHException, ValueError) as exc:
                tried.append(f"{label} (unreadable: {exc})")
                continue
            try:
                transport.auth_publickey(user, key)
                if transport.is_authenticated():
                    return
            except paramiko.AuthenticationException:
                tried.append(label)
            except paramiko.SSHException as exc:
                raise HostUnreachable(self.name, f"SSH error during authentication: {exc}") from exc
        if self.target.password is not None:
            try:
                transport.auth_password(user, self.target.password)
                if transport.is_authenticated():
                    return
            except paramiko.AuthenticationException:
                tried.append("password")
        raise HostUnreachable(
            self.name,
            f"authentication failed for {user}@{self.target.address}"
            + (f" (tried {', '.join(tried)})" if tried else " (no key, agent or password to try)"),
        )

    def connect(self) -> paramiko.Transport:
        """Open (once) and return the authenticated transport; every failure is HostUnreachable."""
        import paramiko

        if self._transport is not None and self._transport.is_active():
            return self._transport
        t = self.target
        try:
            sock = socket.create_connection((t.address, t.port), timeout=self.connect_timeout)
        except socket.gaierror as exc:
            raise HostUnreachable(self.name, f"cannot resolve {t.address}: {exc.strerror}") from exc
        except ConnectionRefusedError as exc:
            raise HostUnreachable(self.name, f"connection refused by {t.address}:{t.port}") from exc
        except TimeoutError as exc:
            raise HostUnreachable(
                self.name, f"connection to {t.address}:{t.port} timed out after {self.connect_timeout:g} s"
            ) from exc
        except OSError as exc:
            raise HostUnreachable(
                self.name, f"cannot connect to {t.address}:{t.port}: {exc.strerror or exc}"
            ) from exc
        transport = paramiko.Transport(sock)
        try:
            name, recorded, where = self._recorded_keys()
            self._prefer_recorded_types(transport, recorded)
            transport.banner_timeout = self.connect_timeout
            transport.auth_timeout = self.connect_timeout
            transport.start_client(timeout=self.connect_timeout)
            self._check_host_key(transport.get_remote_server_key(), recorded, name, where)
            self._auth(transport)
        except HostUnreachable:
            transport.close()
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            transport.close()
            raise HostUnreachable(
                self.name, f"SSH handshake with {t.address}:{t.port} failed: {exc or type(exc).__name__}"
            ) from exc
        self._transport = transport
        return transport

    # -- commands

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        import paramiko

        transport = self.connect()
        script = to_shell(command)
        start = time.monotonic()
        deadline = start + timeout
        try:
            chan = transport.open_session(timeout=max(1.0, min(timeout, self.connect_timeout)))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(self.name, f"cannot open an SSH session: {exc}") from exc
        try:
            chan.exec_command(script)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()

            def drain() -> bool:
                got = False
                while chan.recv_ready():
                    out.extend(chan.recv(1 << 16))
                    got = True
                while chan.recv_stderr_ready():
                    err.extend(chan.recv_stderr(1 << 16))
                    got = True
                return got

            while True:
                progressed = drain()
                if len(out) > self.max_output or len(err) > self.max_output:
                    # A host that floods its output (a kernel log of millions of lines) gets no more of the
                    # controller's memory: the command is stopped and what came so far is cut at the cap; the
                    # probe that was running shows as cut short (an error finding), later ones as not run.
                    del out[self.max_output :], err[self.max_output :]
                    return CommandResult(
                        -1,
                        _decode(bytes(out)),
                        _decode(bytes(err)) + f"\noutput over {self.max_output // (1 << 20)} MiB: cut\n",
                        time.monotonic() - start,
                    )
                if chan.eof_received or chan.closed:
                    # EOF/close come after all data, which is buffered by now: take what is left.
                    while drain():
                        pass
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(self.name, f"command timed out after {timeout:g} s")
                if not progressed:
                    select.select([chan], [], [], min(remaining, 1.0))
            remaining = max(0.0, deadline - time.monotonic())
            if not chan.status_event.wait(max(remaining, 1.0)):
                raise CommandTimeout(self.name, f"no exit status within {timeout:g} s")
            rc = chan.exit_status
            if rc == -1 and not transport.is_active():
                raise HostUnreachable(self.name, "SSH connection lost before the command finished")
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(self.name, f"SSH session lost: {exc}") from exc
        finally:
            chan.close()
        return CommandResult(rc, _decode(bytes(out)), _decode(bytes(err)), time.monotonic() - start)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


# ----------------------------------------------------------------------------------------- snapshot


# A snapshot is untrusted data: each file is read only when it is a regular file directly in the host's
# directory (never through a symlink, never a device or FIFO), by a plain name, and only up to a size.
MAX_SNAPSHOT_FILE = 16 * 1024 * 1024
MAX_SNAPSHOT_META = 4 * 1024 * 1024
_SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SnapshotFileRefused(GpuprovError):
    """A snapshot file that is not read (a link, a device, a FIFO, a bad name, too big)."""


def read_snapshot_file(host_dir: Path, name: str, limit: int = MAX_SNAPSHOT_FILE) -> bytes | None:
    """The bytes of one file of a host's snapshot directory; None when there is no such file."""
    if not _SNAPSHOT_NAME.fullmatch(name):
        raise SnapshotFileRefused(f"{name!r} is not a plain file name")
    path = host_dir / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise SnapshotFileRefused(f"{path} is a symbolic link") from exc
        raise SnapshotFileRefused(f"{path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SnapshotFileRefused(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SnapshotFileRefused(f"{path} is larger than {limit // (1024 * 1024)} MiB")
    return data


class SnapshotExecutor:
    """Replays one host directory of a snapshot (docs: host-snapshot contract).

    Probe collection reads the recorded files directly (`recorded`); `run` answers a command only
    when it is exactly a recorded probe's command, and otherwise says it was not recorded (rc 127),
    because a snapshot cannot run anything.
    """

    def __init__(self, host_dir: Path) -> None:
        self.host_dir = host_dir
        meta_path = host_dir / "meta.json"
        try:
            raw = read_snapshot_file(host_dir, "meta.json", MAX_SNAPSHOT_META)
        except SnapshotFileRefused as exc:
            raise InputError(f"{meta_path}: refused: {exc}") from exc
        if raw is None:
            raise InputError(f"{host_dir}: not a snapshot host directory (no meta.json)")
        try:
            self.meta: dict[str, Any] = json.loads(raw)
        except ValueError as exc:
            raise InputError(f"{meta_path}: unreadable snapshot metadata: {exc}") from exc
        if not isinstance(self.meta, dict) or not isinstance(self.meta.get("probes", {}), dict):
            raise InputError(f"{meta_path}: snapshot metadata must be an object with a 'probes' object")
        self.name = str(self.meta.get("host") or host_dir.name)

    @property
    def host_error(self) -> str | None:
        """Why the collector could not reach this host, when it could not."""
        err = self.meta.get("error")
        return str(err) if err else None

    def recorded(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """(meta entry, file text) for one probe; either may be None when not collected.
        SnapshotFileRefused when the file is there but may not be read."""
        entry = self.meta.get("probes", {}).get(name)
        data = read_snapshot_file(self.host_dir, name)
        text = None if data is None else _decode(data)
        return (entry if isinstance(entry, dict) else None), text

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        wanted = to_shell(command).strip()
        for name, entry in self.meta.get("probes", {}).items():
            if isinstance(entry, dict) and str(entry.get("command", "")).strip() == wanted:
                try:
                    _, text = self.recorded(name)
                except SnapshotFileRefused as exc:
                    return CommandResult(126, "", f"refused in snapshot: {exc}", 0.0)
                rc = entry.get("rc", 0)
                return CommandResult(
                    rc if isinstance(rc, int) and not isinstance(rc, bool) else 1,
                    text or "",
                    str(entry.get("stderr", "")),
                    recorded_seconds(entry.get("duration_s")),
                )
        return CommandResult(127, "", f"not recorded in snapshot {self.host_dir}", 0.0)

    def close(self) -> None:
        return None
