"""One host over SSH (paramiko): host keys checked against known_hosts, one TCP connection (through the
target's jump hosts, as direct-tcpip channels) reused for every command and stream."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.errors import InputError
from provisioner.executors.base import (
    STREAM_READ,
    CommandResult,
    CommandTimeout,
    HostUnreachable,
    as_text,
    to_shell,
)
from provisioner.executors.ssh_target import SshTarget

if TYPE_CHECKING:  # paramiko is imported lazily: `gpuprov --help` must stay instant.
    import paramiko


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
        self._jumps: list[paramiko.Transport] = []  # transports to the jump hosts, first hop first

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
        files = [self.target.private_key_file] if self.target.private_key_file is not None else []
        # ssh_config's IdentityFile lines come after the inventory's key, as ssh tries -i first.
        files += [f for f in self.target.identity_files if f not in files]
        candidates += [(str(f), f) for f in files]
        if agent is not None:
            with contextlib.suppress(paramiko.SSHException):
                candidates += [(f"agent:{k.get_name()}", k) for k in agent.get_keys()]
        if not files:
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

    def _tcp(self) -> socket.socket:
        t = self.target
        try:
            return socket.create_connection((t.address, t.port), timeout=self.connect_timeout)
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

    def _handshake(self, sock: Any) -> paramiko.Transport:
        """SSH over a connected stream (a socket, or a channel through a jump host): host key checked,
        then authenticated. The same for a host and for each of its jump hosts."""
        import paramiko

        t = self.target
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
        return transport

    def _forward(self, through: paramiko.Transport, hop: SshTarget, address: str, port: int) -> Any:
        """A direct-tcpip channel from jump host `hop` to address:port (what `ssh -W` / ProxyJump does)."""
        import paramiko

        try:
            return through.open_channel(
                "direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=self.connect_timeout
            )
        except paramiko.ChannelException as exc:
            raise HostUnreachable(
                self.name, f"via jump host {hop.name}: cannot reach {address}:{port} from there: {exc.text}"
            ) from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(
                self.name,
                f"via jump host {hop.name}: no channel to {address}:{port}: {exc or type(exc).__name__}",
            ) from exc

    def _dial(self) -> Any:
        """A stream to the host: a TCP connection, or a channel through its jump hosts (each hop reached
        through the one before, checked and authenticated like any host)."""
        t = self.target
        if not t.jump:
            return self._tcp()
        through: paramiko.Transport | None = None
        for i, hop in enumerate(t.jump):
            hop_ex = SshExecutor(hop, self.connect_timeout, self._keys, self.max_output)
            # The channel from the previous hop names that hop when it fails; the rest names this one.
            stream = None if through is None else self._forward(through, t.jump[i - 1], hop.address, hop.port)
            try:
                through = hop_ex._handshake(hop_ex._tcp() if stream is None else stream)
            except HostUnreachable as exc:
                raise HostUnreachable(self.name, f"via jump host {hop.name}: {exc.reason}") from exc
            self._jumps.append(through)
        assert through is not None  # t.jump is not empty
        return self._forward(through, t.jump[-1], t.address, t.port)

    def connect(self) -> paramiko.Transport:
        """Open (once) and return the authenticated transport; every failure is HostUnreachable."""
        if self._transport is not None and self._transport.is_active():
            return self._transport
        self.close()  # a dropped connection: its jump hosts go too
        try:
            self._transport = self._handshake(self._dial())
        except BaseException:
            self._close_jumps()
            raise
        return self._transport

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
                        as_text(bytes(out)),
                        as_text(bytes(err)) + f"\noutput over {self.max_output // (1 << 20)} MiB: cut\n",
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
        return CommandResult(rc, as_text(bytes(out)), as_text(bytes(err)), time.monotonic() - start)

    def open_stream(self, command: Sequence[str] | str) -> SshStream:
        """The command on its own session channel of the open connection, its stdin left open."""
        import paramiko

        transport = self.connect()
        try:
            chan = transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(to_shell(command))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(self.name, f"cannot open an SSH session: {exc}") from exc
        return SshStream(self.name, chan)

    def _close_jumps(self) -> None:
        while self._jumps:
            self._jumps.pop().close()  # last hop first: each runs over the one before

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._close_jumps()


class SshStream:
    """A long-lived command on one session channel. Reads block on the channel's own buffer (filled by
    paramiko's transport thread) with a timeout; stderr is drained so that it never holds the channel's
    window, and only its last few KiB are kept (what the command said before it ended)."""

    STDERR_KEPT = 4096

    def __init__(self, name: str, chan: paramiko.Channel) -> None:
        self.name = name
        self.chan = chan
        self.ended = False
        self.stderr_tail = b""

    def _drain_stderr(self) -> None:
        while self.chan.recv_stderr_ready():
            self.stderr_tail = (self.stderr_tail + self.chan.recv_stderr(STREAM_READ))[-self.STDERR_KEPT :]

    def send(self, data: bytes, timeout: float) -> None:
        import paramiko

        try:
            self.chan.settimeout(timeout)
            self.chan.sendall(data)
        except (paramiko.SSHException, EOFError, OSError) as exc:  # socket.timeout is an OSError
            self.ended = True
            raise HostUnreachable(self.name, f"SSH session lost: {exc or type(exc).__name__}") from exc

    def read(self, timeout: float) -> bytes:
        import paramiko

        if self.ended:
            return b""
        self._drain_stderr()
        try:
            self.chan.settimeout(max(0.0, timeout))
            data = self.chan.recv(STREAM_READ)
        except TimeoutError:
            return b""
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.ended = True
            raise HostUnreachable(self.name, f"SSH session lost: {exc or type(exc).__name__}") from exc
        if not data:  # end of file: the command ended or the connection dropped
            self._drain_stderr()
            self.ended = True
        return data

    def close(self) -> None:
        self.ended = True
        self.chan.close()  # sshd closes the command's stdin: the command sees end of input
