"""How a host is reached over SSH, as `ansible-playbook` (OpenSSH) would reach it: the inventory's
values, ~/.ssh/config (parsed, never executed) and the jump hosts either names (ProxyJump, -J, and the
`ssh -W %h:%p` ProxyCommand idiom), checked and resolved into an SshTarget; `SshTarget.from_host` says how.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.sshaccess import SshAccess
from provisioner.yamlfile import read_operator_file


@dataclass(frozen=True)
class SshTarget(SshAccess):
    """What SshExecutor needs to reach a host; built from an inventory HostSpec and ssh_config.

    `identity_files` are ssh_config's IdentityFile lines (tried after `private_key_file`); `jump` lists the
    jump hosts (bastions) to go through, first hop first, each a target of its own.
    """

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
