"""Where commands run: one small interface over SSH (paramiko), this machine, and a recorded snapshot.

Every executor answers `run(argv_or_script, timeout) -> CommandResult`. A string is a shell script
run by `sh -c`; a sequence is an argv, quoted by the executor. Connection problems become
`HostUnreachable` with the reason (refused, timed out, host key unknown or changed, authentication
failed), so a fleet run can report that host as `error` and carry on with the others.

SSH reaches hosts the way `ansible-playbook` does through OpenSSH: ~/.ssh/config (parsed, never
executed) and the inventory's ssh arguments, jump hosts included (ProxyJump, -J, and the
`ssh -W %h:%p` ProxyCommand idiom, as direct-tcpip channels); `SshTarget.from_host` says how.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from provisioner.errors import GpuprovError, InputError
from provisioner.yamlfile import read_operator_file

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


class CommandStream(Protocol):
    """A long-lived command on a host: its stdin stays open, its stdout is read as it comes."""

    ended: bool

    def send(self, data: bytes, timeout: float) -> None: ...

    def read(self, timeout: float) -> bytes:
        """Stdout that arrived within `timeout` (b"" when none did; `ended` once the command is gone)."""
        ...

    def close(self) -> None: ...


STREAM_READ = 1 << 16


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

    def open_stream(self, command: Sequence[str] | str) -> LocalStream:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise ExecutorError(self.name, f"{argv[0]}: {exc.strerror}") from exc
        return LocalStream(self.name, proc)

    def close(self) -> None:
        return None


class LocalStream:
    """A command of this machine kept running; read through select() on its stdout pipe."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self.name = name
        self.proc = proc
        self.ended = False

    def send(self, data: bytes, timeout: float) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            self.ended = True
            raise ExecutorError(self.name, "the command ended") from exc

    def read(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        if self.ended or not select.select([fd], [], [], max(0.0, timeout))[0]:
            return b""
        data = os.read(fd, STREAM_READ)
        self.ended = not data
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the command sees end of input and ends
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.ended = True


# ---------------------------------------------------------------------------------------------- ssh


@dataclass(frozen=True)
class SshTarget:
    """What SshExecutor needs to reach a host; built from an inventory HostSpec and ssh_config.

    `identity_files` are ssh_config's IdentityFile lines (tried after `private_key_file`); `jump` lists the
    jump hosts (bastions) to go through, first hop first, each a target of its own.
    """

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
    identity_files: tuple[Path, ...] = ()
    jump: tuple[SshTarget, ...] = ()

    @classmethod
    def from_host(cls, host: Any) -> SshTarget:
        """Accept any object shaped like inventory.HostSpec (duck-typed to keep the import light).

        How a host is reached, as `ansible-playbook` (OpenSSH) would reach it:

        - ssh_config (`~/.ssh/config`, or the file $GPUPROV_SSH_CONFIG names; `none`: no file) is matched
          against ansible_host, or the inventory name when there is none: the name ssh is given. From it
          come HostName, Port, User, IdentityFile, UserKnownHostsFile and ProxyJump / ProxyCommand.
        - Inventory values win over ssh_config: ansible_port, ansible_user, ansible_ssh_private_key_file
          (tried before IdentityFile), UserKnownHostsFile and ProxyJump / ProxyCommand / -J in
          ansible_ssh_common_args / ansible_ssh_extra_args. Without either: port 22, user root.
        - A jump host `[user@]host[:port]` gets its HostName, Port, User, IdentityFile (and, for the first
          hop, its own ProxyJump) from ssh_config; its user defaults to the local user, as with ssh. It is
          checked against the same known_hosts with the same policy as the host, and never gets its
          password.
        - ProxyCommand is taken only in the `ssh -W %h:%p [-q] [-p port] [-i key] [-l user] [user@]host`
          form and turned into a jump; any other command is refused (InputError): gpuprov never runs a
          command taken from the inventory or ssh_config (nor `Match exec`).

        Host names, users and ports from either source are checked (InputError naming host and key).
        """
        return _target_from_host(cls, host)


@dataclass(frozen=True)
class JumpHop:
    """One jump host as written (ProxyJump, -J, or the `ssh -W %h:%p` ProxyCommand form)."""

    host: str
    user: str | None = None
    port: int | None = None
    key_file: Path | None = None


SSH_CONFIG_ENV = "GPUPROV_SSH_CONFIG"
MAX_JUMP_HOPS = 8
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]{2,45}(%[A-Za-z0-9._-]{1,32})?")
_USER_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9._@$+-]{0,63}")
# ssh(1) options that take a value (everything else is a flag).
_SSH_VALUE_FLAGS = frozenset("BbcDEeFIiJLlmOoPpQRSWw")
# What the `ssh -W %h:%p` ProxyCommand may carry besides -W, -p, -i, -l, -J, -o: harmless flags.
_PROXY_SSH_FLAGS = frozenset("q46CNTnvx")
_PROXY_COMMAND_FORM = "`ssh -W %h:%p [-q] [-p port] [-i key] [-l user] [user@]host`"


def _shown(value: object) -> str:
    text = str(value)
    return repr(text if len(text) <= 120 else text[:120] + "...")


def check_host_name(value: str, host: str, key: str) -> str:
    """A host name or IP address: no whitespace, no leading '-', nothing a shell or ssh would read."""
    if _HOST_NAME.fullmatch(value) or (value.count(":") >= 2 and _IPV6.fullmatch(value)):
        return value
    raise InputError(f"host {host}: {key}: {_shown(value)} is not a host name or IP address")


def check_port(value: object, host: str, key: str) -> int:
    """A TCP port, 1-65535, written as digits."""
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"\d{1,5}", text) or not 1 <= int(text) <= 65535:
        raise InputError(f"host {host}: {key}: {_shown(value)} is not a TCP port (1-65535)")
    return int(text)


def _check_user(value: str, host: str, key: str) -> str:
    if not _USER_NAME.fullmatch(value):
        raise InputError(f"host {host}: {key}: {_shown(value)} is not a user name")
    return value


def _parse_hop(text: str, host: str, source: str, with_port: bool = True) -> JumpHop:
    """`[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://[user@]host[:port]`."""
    spec = text.strip()
    if spec.startswith("ssh://"):
        spec, with_port = spec[len("ssh://") :].rstrip("/"), True
    user: str | None = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
        _check_user(user, host, source)
    port: int | None = None
    bracketed = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", spec)
    if bracketed:
        spec = bracketed.group(1)
        if bracketed.group(2) is not None:
            port = check_port(bracketed.group(2), host, source)
    elif with_port and spec.count(":") == 1:
        spec, port_text = spec.split(":")
        port = check_port(port_text, host, source)
    return JumpHop(check_host_name(spec, host, source), user, port)


def parse_proxy_jump(value: str, host: str, source: str) -> tuple[JumpHop, ...]:
    """ProxyJump / -J: one or several comma-separated `[user@]host[:port]` hops; `none` is no jump."""
    if value.strip().lower() == "none":
        return ()
    hops = tuple(_parse_hop(part, host, source) for part in value.split(","))
    if len(hops) > MAX_JUMP_HOPS:
        raise InputError(f"host {host}: {source}: more than {MAX_JUMP_HOPS} jump hosts")
    return hops


def _split_option(option: str) -> tuple[str, str]:
    """`Key=Value` or `Key Value` (one -o argument) as (lowercase key, value)."""
    m = re.match(r"\s*([A-Za-z]+)\s*(?:=\s*|\s+|$)(.*)", option, re.S)
    return (m.group(1).lower(), m.group(2).strip()) if m else ("", "")


def _getopt(words: list[str], i: int) -> tuple[list[tuple[str, str | None]], int]:
    """The options of one ssh word at words[i] (`-q`, `-p22`, `-qW %h:%p`): [(letter, value)], next i."""
    word, i, found = words[i], i + 1, []
    j = 1
    while j < len(word):
        letter, j = word[j], j + 1
        if letter not in _SSH_VALUE_FLAGS:
            found.append((letter, None))
            continue
        if j < len(word):
            found.append((letter, word[j:]))
        elif i < len(words):
            found.append((letter, words[i]))
            i += 1
        else:
            found.append((letter, None))
        break
    return found, i


def parse_proxy_command(
    command: str | None, host: str, source: str, expanded: tuple[str, str] | None = None
) -> tuple[JumpHop, ...]:
    """The `ssh -W %h:%p ... [user@]jumphost` ProxyCommand as jump hops; anything else is refused.

    `expanded` is (hostname, port) when ssh_config already replaced %h and %p (paramiko does)."""

    def refuse(why: str) -> InputError:
        return InputError(
            f"host {host}: {source}: ProxyCommand {_shown(command)} refused ({why}): gpuprov never runs a "
            f"command taken from the inventory or ssh_config; use ProxyJump, -J or {_PROXY_COMMAND_FORM}"
        )

    if command is None or command.strip().lower() == "none":
        return ()
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise refuse(f"cannot be split into words: {exc}") from exc
    if not words or os.path.basename(words[0]) != "ssh":
        raise refuse("not an ssh -W command")
    forward = dest = user = port = key = None
    before: tuple[JumpHop, ...] = ()
    i = 1
    while i < len(words):
        if not (words[i].startswith("-") and len(words[i]) > 1):
            if dest is not None:
                raise refuse(f"{_shown(words[i])} after the jump host")
            dest, i = words[i], i + 1
            continue
        options, i = _getopt(words, i)
        for letter, value in options:
            if letter in _PROXY_SSH_FLAGS:
                continue
            if letter not in "WpilJo":
                raise refuse(f"option -{letter}")
            if value is None:
                raise refuse(f"-{letter} without a value")
            if letter == "W":
                forward = value
            elif letter == "p":
                port = check_port(value, host, f"{source} (ProxyCommand -p)")
            elif letter == "i":
                key = Path(value).expanduser()
            elif letter == "l":
                user = _check_user(value, host, f"{source} (ProxyCommand -l)")
            elif letter == "J":
                before = parse_proxy_jump(value, host, f"{source} (ProxyCommand -J)")
            else:
                opt, opt_value = _split_option(value)
                if opt == "proxyjump":
                    before = parse_proxy_jump(opt_value, host, f"{source} (ProxyCommand -o ProxyJump)")
                elif opt == "proxycommand":
                    raise refuse("a ProxyCommand inside the ProxyCommand")
    allowed = {"%h:%p", "[%h]:%p"}
    if expanded is not None:
        allowed |= {f"{expanded[0]}:{expanded[1]}", f"[{expanded[0]}]:{expanded[1]}"}
    if forward not in allowed:
        raise refuse("it must forward with -W %h:%p" if forward is None else f"-W {_shown(forward)}")
    if dest is None:
        raise refuse("no jump host")
    hop = _parse_hop(dest, host, f"{source} (ProxyCommand)", with_port=False)
    # As with ssh: -l wins over user@, -p is the only way to give a port outside an ssh:// URI.
    return (*before, JumpHop(hop.host, user or hop.user, port or hop.port, key))


def parse_ssh_args(args: str, host: str, variable: str) -> tuple[JumpHop, ...] | None:
    """The jump hosts that ssh arguments (ansible_ssh_common_args, ...) ask for: `-J`, `-o ProxyJump=`,
    or `-o ProxyCommand=` in the `ssh -W %h:%p` form. None when they name no proxy at all; () for `none`.
    As with ssh, the first proxy option wins; other options are ignored."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise InputError(f"host {host}: {variable}: cannot be split into words: {exc}") from exc
    i = 0
    while i < len(words):
        if words[i] == "--":
            break
        if not (words[i].startswith("-") and len(words[i]) > 1):
            i += 1
            continue
        options, i = _getopt(words, i)
        for letter, value in options:
            if value is None:
                continue
            if letter == "J":
                return parse_proxy_jump(value, host, f"{variable} (-J)")
            if letter == "o":
                opt, opt_value = _split_option(value)
                if opt == "proxyjump":
                    return parse_proxy_jump(opt_value, host, f"{variable} (ProxyJump)")
                if opt == "proxycommand":
                    return parse_proxy_command(opt_value, host, variable)
    return None


class SshConfig:
    """A parsed ssh_config file (paramiko parses it; gpuprov applies the options it supports).

    `Include` is followed (relative paths from ~/.ssh); `Match exec` is refused, since it runs a command."""

    def __init__(self, path: Path, text: str) -> None:
        import paramiko

        self.path = path
        try:
            self._parsed = paramiko.SSHConfig.from_text(self._expand(path, text, 0))
        except (paramiko.ssh_exception.ConfigParseError, ValueError) as exc:
            raise InputError(f"{path}: cannot parse ssh config: {exc}") from exc

    def _expand(self, path: Path, text: str, depth: int) -> str:
        """The text with its Include lines replaced by the files they name."""
        if depth > 8:
            raise InputError(f"{self.path}: ssh config Include nested more than 8 deep (at {path})")
        lines = text.splitlines()
        out: list[str] = []
        block = "Host *"
        for n, line in enumerate(lines, 1):
            m = re.match(r"\s*([A-Za-z]+)\s*(?:=\s*|\s+)(.*)", line)
            keyword, value = (m.group(1).lower(), m.group(2).strip()) if m else ("", "")
            if keyword in ("host", "match"):
                block = line
            if keyword == "match":
                try:
                    criteria = [w.lstrip("!").lower() for w in shlex.split(value)]
                except ValueError:
                    criteria = []
                if "exec" in criteria:
                    raise InputError(
                        f"{path}: line {n}: 'Match exec' would run a command, which gpuprov does not do; "
                        f"point {SSH_CONFIG_ENV} at an ssh config without it (or 'none')"
                    )
            if keyword == "include":
                for pattern in value.split():
                    full = Path(pattern).expanduser()
                    if not full.is_absolute():
                        full = Path("~/.ssh").expanduser() / full
                    for found in sorted(full.parent.glob(full.name)):
                        out.append(self._expand(found, _read_config(found), depth + 1))
                out.append(block)  # back in the block the Include was in
                continue
            out.append(line)
        return "\n".join(out)

    def lookup(self, name: str) -> dict[str, Any]:
        """The options for `name` (lowercase keys), as paramiko's first-match-wins lookup gives them."""
        try:
            return dict(self._parsed.lookup(name))
        except Exception as exc:  # paramiko's own errors for odd values (canonicalisation, Match)
            raise InputError(f"{self.path}: cannot apply ssh config to {name}: {exc}") from exc


def _read_config(path: Path) -> str:
    """An ssh_config file, read as every file an operator names is (bounded, a regular text file: a FIFO
    or /dev/zero there must not hang or fill the controller); /dev/null is the usual "no config"."""
    if os.path.realpath(path) == os.devnull:
        return ""
    return read_operator_file(path, "ssh config")


_CONFIGS_LOCK = threading.Lock()
_CONFIGS: dict[Path, tuple[str, SshConfig]] = {}


def load_ssh_config() -> SshConfig | None:
    """The ssh_config in force: $GPUPROV_SSH_CONFIG (`none`: no file), else ~/.ssh/config; None when
    there is none. Parsed once, and again when the file's text changes (its Includes are not watched)."""
    chosen = os.environ.get(SSH_CONFIG_ENV) or "~/.ssh/config"
    if chosen.strip().lower() == "none":
        return None
    path = Path(chosen).expanduser()
    if not path.exists():
        return None
    text = _read_config(path)
    with _CONFIGS_LOCK:
        cached = _CONFIGS.get(path)
        if cached is None or cached[0] != text:
            cached = (text, SshConfig(path, text))
            _CONFIGS[path] = cached
        return cached[1]


def _known_hosts_from(opts: dict[str, Any]) -> Path | None:
    files = str(opts.get("userknownhostsfile") or "").split()
    return Path(files[0]).expanduser() if files and files[0] != "/dev/null" else None


def _config_proxy(config: SshConfig, opts: dict[str, Any], host: str, for_name: str) -> tuple[JumpHop, ...]:
    """ProxyJump (preferred) or ProxyCommand of one ssh_config lookup."""
    if opts.get("proxyjump"):
        return parse_proxy_jump(str(opts["proxyjump"]), host, f"ProxyJump for {for_name} in {config.path}")
    if "proxycommand" in opts:
        expanded = (str(opts.get("hostname", for_name)), str(opts.get("port", 22)))
        source = f"ProxyCommand for {for_name} in {config.path}"
        return parse_proxy_command(opts["proxycommand"], host, source, expanded)
    return ()


def _render_ssh_args(raw: Any, hostvars: dict[str, Any], host: str, variable: str) -> str:
    """The variable as Ansible would pass it; templated only when it is a template naming a proxy."""
    text = str(raw)
    if not (("{{" in text or "{%" in text) and ("proxy" in text.lower() or "-J" in text)):
        return text
    try:
        from ansible.errors import AnsibleError
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
    except ImportError as exc:
        raise InputError(
            f"host {host}: {variable}: a template, and ansible is not there to render it"
        ) from exc
    try:
        return str(Templar(loader=DataLoader(), variables=hostvars).template(raw))
    except AnsibleError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"host {host}: {variable}: {first}") from exc


def _resolve_jumps(
    hops: tuple[JumpHop, ...], base: SshTarget, config: SshConfig | None, seen: tuple[str, ...]
) -> tuple[SshTarget, ...]:
    """SshTargets for the hops, with ssh_config applied; the first hop's own ProxyJump comes first."""
    import getpass

    out: list[SshTarget] = []
    for n, hop in enumerate(hops):
        opts = config.lookup(hop.host) if config is not None else {}
        where = f"for jump host {hop.host} in {config.path}" if config is not None else ""
        address = str(opts.get("hostname") or hop.host)
        if address != hop.host:
            check_host_name(address, base.name, f"HostName {where}")
        port = hop.port or (check_port(opts["port"], base.name, f"Port {where}") if "port" in opts else 22)
        user = hop.user or (
            _check_user(str(opts["user"]), base.name, f"User {where}") if "user" in opts else ""
        )
        if not user:
            try:
                user = getpass.getuser()  # ssh's default: the local user
            except (KeyError, OSError):
                user = "root"
        hop_target = SshTarget(
            name=hop.host,
            address=address,
            port=port,
            user=user,
            private_key_file=hop.key_file,
            known_hosts_file=_known_hosts_from(opts) or base.known_hosts_file,
            strict_host_key_checking=base.strict_host_key_checking,
            accept_new=base.accept_new,
            identity_files=tuple(Path(p).expanduser() for p in opts.get("identityfile") or ()),
        )
        if n == 0 and config is not None:
            # Only the first hop is reached by its own ssh_config route; later hops go through the earlier.
            if hop.host in seen or len(seen) > MAX_JUMP_HOPS:
                chain = " -> ".join((*seen, hop.host))
                raise InputError(
                    f"host {base.name}: jump hosts loop or nest too deep ({chain}) in {config.path}"
                )
            upstream = _config_proxy(config, opts, base.name, f"jump host {hop.host}")
            out += _resolve_jumps(upstream, base, config, (*seen, hop.host))
        out.append(hop_target)
    if len(out) > MAX_JUMP_HOPS:
        raise InputError(f"host {base.name}: more than {MAX_JUMP_HOPS} jump hosts")
    return tuple(out)


def _target_from_host(cls: type[SshTarget], host: Any) -> SshTarget:
    name = str(host.name)
    hostvars = getattr(host, "vars", None)
    hostvars = hostvars if isinstance(hostvars, dict) else {}

    def from_inventory(attr: str, keys: tuple[str, ...], default: object) -> Any:
        """The inventory's value when it set one (a variable, or an attribute off the default)."""
        value = getattr(host, attr, None)
        if any(k in hostvars for k in keys):
            return value
        return None if value in (None, "", default) else value

    address = from_inventory("address", ("ansible_host",), name)
    port = from_inventory("port", ("ansible_port", "ansible_ssh_port"), 22)
    user = from_inventory("user", ("ansible_user", "ansible_ssh_user"), "root")
    key = getattr(host, "private_key_file", None)
    known = getattr(host, "known_hosts_file", None)

    destination = str(address or name)  # what Ansible hands ssh, and what ssh_config is matched against
    config = load_ssh_config()
    opts = config.lookup(destination) if config is not None else {}
    where = f"in {config.path}" if config is not None else ""
    if opts.get("hostname") and opts["hostname"] != destination:
        final_address = check_host_name(str(opts["hostname"]), name, f"HostName {where}")
    else:
        final_address = check_host_name(destination, name, "ansible_host" if address else "inventory name")
    if port is not None:
        port_value = check_port(port, name, "ansible_port")
    else:
        port_value = check_port(opts["port"], name, f"Port {where}") if "port" in opts else 22
    if user is not None:
        user_value = _check_user(str(user), name, "ansible_user")
    else:
        user_value = _check_user(str(opts["user"]), name, f"User {where}") if "user" in opts else "root"

    hops: tuple[JumpHop, ...] | None = None
    for variable in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        raw = hostvars.get(variable)
        if raw:
            hops = parse_ssh_args(_render_ssh_args(raw, hostvars, name, variable), name, variable)
            if hops is not None:
                break
    if hops is None and config is not None:
        hops = _config_proxy(config, opts, name, destination)

    target = cls(
        name=name,
        address=final_address,
        port=port_value,
        user=user_value,
        private_key_file=Path(key).expanduser() if key else None,
        known_hosts_file=Path(known).expanduser() if known else _known_hosts_from(opts),
        strict_host_key_checking=bool(getattr(host, "strict_host_key_checking", True)),
        accept_new=bool(getattr(host, "accept_new_host_keys", False)),
        password=getattr(host, "password", None),
        identity_files=tuple(Path(p).expanduser() for p in opts.get("identityfile") or ()),
    )
    if not hops:
        return target
    return replace(target, jump=_resolve_jumps(hops, target, config, (destination,)))


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


# ----------------------------------------------------------------------------------------- snapshot


# A snapshot is untrusted data: each file is read only when it is a regular file directly in the host's
# directory (never through a symlink, never a device or FIFO), by a plain name, and only up to a size.
MAX_SNAPSHOT_FILE = 16 * 1024 * 1024
MAX_SNAPSHOT_META = 4 * 1024 * 1024
_SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class OpenConnections:
    """Executors in use by a run, so that Ctrl-C can close their connections: blocked reads return and
    worker threads end instead of holding the exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, Executor] = {}

    def add(self, ex: Executor) -> None:
        with self._lock:
            self._by_id[id(ex)] = ex

    def discard(self, ex: Executor) -> None:
        with self._lock:
            self._by_id.pop(id(ex), None)

    def close_all(self) -> None:
        with self._lock:
            live = list(self._by_id.values())
            self._by_id.clear()
        for ex in live:
            with contextlib.suppress(Exception):
                ex.close()


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
    # Checked on the descriptor before it becomes a file object, which a directory cannot be.
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SnapshotFileRefused(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SnapshotFileRefused(f"{path} is larger than {limit // (1024 * 1024)} MiB")
    return data


MAX_SNAPSHOT_HOST_NAME = 255


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def checked_snapshot_meta(meta_path: Path, doc: object) -> dict[str, Any]:
    """meta.json as replay reads it, every key it uses of the type it must have.

    A value of another type must not be read as "absent": a `probes` that is not an object, or an
    entry that is not one, would turn every probe into "not collected" and every check into a skip,
    and a host judged on nothing into a healthy one. So it is bad input, naming the file and key.
    """

    def bad(key: str, why: str) -> InputError:
        return InputError(f"{meta_path}: {key}: {why}")

    if not isinstance(doc, dict):
        raise InputError(f"{meta_path}: snapshot metadata must be a JSON object, not {_json_kind(doc)}")
    for key in ("host", "collected_at", "collector", "error"):
        if key in doc and not isinstance(doc[key], str):
            raise bad(key, f"must be a string, not {_json_kind(doc[key])}")
    if "host" in doc and not 0 < len(doc["host"]) <= MAX_SNAPSHOT_HOST_NAME:
        raise bad("host", f"must be 1 to {MAX_SNAPSHOT_HOST_NAME} characters")
    probes = doc.get("probes")
    if not isinstance(probes, dict):
        what = f", not {_json_kind(probes)}" if "probes" in doc else " (there is none)"
        raise InputError(f"{meta_path}: snapshot metadata must have a 'probes' object{what}")
    for name, entry in probes.items():
        key = f"probes[{name[:64]!a}]"
        if not isinstance(entry, dict):
            raise bad(key, f"must be an object, not {_json_kind(entry)}")
        rc = entry.get("rc")
        if isinstance(rc, bool) or not isinstance(rc, int) or not 0 <= rc <= 255:
            raise bad(f"{key}.rc", "must be the probe's exit status, a whole number 0-255")
        for text_key in ("command", "stderr"):
            if text_key in entry and not isinstance(entry[text_key], str):
                raise bad(f"{key}.{text_key}", f"must be a string, not {_json_kind(entry[text_key])}")
    not_collected = doc.get("not_collected")
    if not_collected is not None and not (
        isinstance(not_collected, dict) and all(isinstance(v, str) for v in not_collected.values())
    ):
        raise bad("not_collected", "must be an object of strings")
    return doc


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
            doc = json.loads(raw)
        except ValueError as exc:
            raise InputError(f"{meta_path}: unreadable snapshot metadata: {exc}") from exc
        except RecursionError:
            raise InputError(f"{meta_path}: unreadable snapshot metadata: nested too deeply") from None
        self.meta: dict[str, Any] = checked_snapshot_meta(meta_path, doc)
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
