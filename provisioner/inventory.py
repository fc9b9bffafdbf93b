"""Ansible inventories read the way Ansible reads them (YAML, INI, directories, group_vars/host_vars).

Ansible's own inventory code does the parsing, so `-i` means to gpuprov exactly what it means to
`ansible-playbook -i`; this module turns the result into typed HostSpecs (how to reach a host over SSH,
its groups and variables) and maps every parse problem to an InputError that names the file.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.hosttext import first_line
from provisioner.sshaccess import SshAccess
from provisioner.yamlfile import described, is_yaml, load_ansible_yaml, read_operator_file

_TRUE = {"1", "yes", "true", "on", "y"}


@dataclass(frozen=True)
class HostSpec(SshAccess):
    """One inventory host: where and how to reach it, and what the inventory says about it."""

    accept_new_host_keys: bool = False
    password: str | None = None
    groups: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)

    @property
    def become(self) -> bool:
        return needs_become(self)


def _ssh_options(args: str) -> dict[str, str]:
    """`-o Key=Value` / `-oKey=Value` / `-o Key Value` options from an ssh argument string."""
    opts: dict[str, str] = {}
    try:
        words = shlex.split(args)
    except ValueError:
        return opts
    i = 0
    while i < len(words):
        w = words[i]
        value: str | None = None
        if w == "-o" and i + 1 < len(words):
            value, i = words[i + 1], i + 1
        elif w.startswith("-o") and len(w) > 2:
            value = w[2:]
        if value:
            if "=" in value:
                k, v = value.split("=", 1)
            else:
                k, _, v = value.partition(" ")
                if not v and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    v, i = words[i + 1], i + 1
            opts[k.strip().lower()] = v.strip()
        i += 1
    return opts


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(message, file=sys.stderr)


def needs_become(host: Any) -> bool:
    """Whether commands on a host need sudo: ansible_become set, for a user other than root."""
    hostvars = getattr(host, "vars", None) or {}
    return ansible_bool(hostvars.get("ansible_become"), False) and getattr(host, "user", "root") != "root"


def ansible_bool(value: Any, default: bool) -> bool:
    """An inventory value read as Ansible reads a boolean (yes/no, true/false, 1/0, on/off)."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE


# The names Ansible reads a vars file under (group_vars/NAME, NAME.yml, ...: its YAML_FILENAME_EXTENSIONS).
_VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")
_YAML_EXTENSIONS = (".yml", ".yaml", ".json")
# A file Ansible Vault encrypted whole starts so; Ansible decrypts it before reading it.
_VAULT_HEADER = "$ANSIBLE_VAULT;"


def check_inventory_files(source: Path) -> None:
    """Every file Ansible will read for the inventory `source` is checked first, the way Ansible finds
    them: the file itself, or every file of the directory (recursively, skipping what Ansible ignores);
    and everything under group_vars/ and host_vars/ next to it. Each must be a bounded text file
    (provisioner.yamlfile: no FIFO, device or huge file), and a YAML one parses strictly (no alias, no
    repeated key, no deep nesting); otherwise an InputError names the file and line. Ansible would only
    say that no plugin could parse the source, after trying INI on a YAML file, or warn about a repeated
    key and use its last value, or hang on a FIFO."""
    seen: set[str] = set()
    if source.is_dir():
        _check_inventory_dir(source, seen)
    else:
        _check_inventory_file(source)
    base = source if source.is_dir() else source.parent
    for sub in ("group_vars", "host_vars"):
        vars_dir = base / sub
        if vars_dir.is_dir():
            _check_vars_dir(vars_dir, seen, top=True)


def _first_visit(directory: Path, seen: set[str]) -> bool:
    """False for a directory already walked (a symlink loop, or a link to a sibling)."""
    real = os.path.realpath(directory)
    if real in seen:
        return False
    seen.add(real)
    return True


def _check_inventory_file(path: Path) -> None:
    """One inventory file, as Ansible's plugins try it: by extension YAML, else YAML first (its YAML plugin
    takes a mapping), then INI."""
    text = read_operator_file(path, "inventory file")
    if text.startswith(_VAULT_HEADER):
        return
    if path.suffix in _YAML_EXTENSIONS:
        _check_yaml_inventory(load_ansible_yaml(text, path), path)
        return
    try:
        doc = load_ansible_yaml(text, path)
    except InputError:
        if is_yaml(text):
            raise  # YAML that breaks a rule (an alias, a repeated key): the YAML plugin would read it
        doc = None
    if isinstance(doc, dict):
        _check_yaml_inventory(doc, path)
    else:
        _check_ini_repeats(text, path)


# The keys of a group in a YAML inventory (Ansible's YAML plugin skips any other with a warning: a
# misspelt `host:` leaves the group without its hosts).
_GROUP_KEYS = ("hosts", "vars", "children")


def _check_yaml_inventory(doc: Any, path: Path) -> None:
    """A YAML inventory's shape: groups of hosts, vars and children, each a mapping. Ansible would skip
    a misshapen group with a warning, or fail naming neither the group nor the key."""
    if doc is None:
        return  # Ansible says the file is empty
    if not isinstance(doc, dict):
        raise InputError(f"{path}: a YAML inventory is a mapping of groups (all: ...), got {described(doc)}")
    if "plugin" in doc:
        return  # an inventory plugin's configuration (auto plugin): the plugin's to read
    for name, group in doc.items():
        _check_group(group, str(name), path)


def _check_group(group: Any, at: str, path: Path) -> None:
    if group is None:
        return
    if not isinstance(group, dict):
        raise InputError(f"{path}: {at}: expected a group (hosts, vars, children), got {described(group)}")
    for key, value in group.items():
        if key not in _GROUP_KEYS:
            raise InputError(f"{path}: {at}.{key}: unknown key; a group has {', '.join(_GROUP_KEYS)}")
        if value is None:
            continue
        if not isinstance(value, dict):
            raise InputError(f"{path}: {at}.{key}: expected a mapping, got {described(value)}")
        if key == "hosts":
            for host, host_vars in value.items():
                if host_vars is not None and not isinstance(host_vars, dict):
                    raise InputError(
                        f"{path}: {at}.hosts.{host}: expected the host's variables (a mapping), "
                        f"got {described(host_vars)}"
                    )
        elif key == "children":
            for child, data in value.items():
                _check_group(data, f"{at}.children.{child}", path)


def _check_vars_file(path: Path) -> None:
    text = read_operator_file(path, "inventory file")
    if text.startswith(_VAULT_HEADER):
        return
    doc = load_ansible_yaml(text, path)
    if doc is not None and not isinstance(doc, dict):
        raise InputError(f"{path}: expected variables (a mapping of names to values), got {described(doc)}")


# An INI inventory's section header, as Ansible's INI plugin reads it: [group], [group:vars], ...
_INI_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:[#;].*)?")


def _check_ini_repeats(text: str, path: Path) -> None:
    """An INI inventory sets each variable once per group (in [group:vars]) and per host (on its host
    lines): Ansible keeps the last of two values without a word. Lines Ansible cannot parse are left
    to it (it names them)."""
    group, state = "ungrouped", "hosts"
    first_seen: dict[tuple[str, str, str], int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        section = _INI_SECTION.fullmatch(line)
        if section:
            group, state = section[1], section[2] or "hosts"
            continue
        if state == "vars" and "=" in line:
            keys = [("group", group, line.split("=", 1)[0].strip())]
        elif state == "hosts":
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError:
                continue
            keys = [("host", tokens[0], t.split("=", 1)[0]) for t in tokens[1:] if "=" in t] if tokens else []
        else:
            continue
        on_this_line: set[tuple[str, str, str]] = set()
        for key in keys:
            first = first_seen.setdefault(key, number)
            if first != number or key in on_this_line:
                where = f"[{group}:vars]" if key[0] == "group" else f"host {key[1]}"
                raise InputError(
                    f"{path}:{number}: duplicate key {key[2][:80]!r} for {where} (first on line {first}): "
                    "Ansible would keep the last value"
                )
            on_this_line.add(key)


def _check_inventory_dir(directory: Path, seen: set[str]) -> None:
    """An inventory directory as Ansible's InventoryManager walks it (its IGNORED names left out)."""
    from ansible.inventory.manager import IGNORED

    if not _first_visit(directory, seen):
        return
    for name in sorted(os.listdir(directory)):
        if IGNORED.search(os.fsencode(name)):
            continue
        path = directory / name
        if path.is_dir():
            _check_inventory_dir(path, seen)
        else:
            _check_inventory_file(path)


def _check_vars_dir(directory: Path, seen: set[str], *, top: bool = False) -> None:
    """group_vars/ or host_vars/ as Ansible's vars plugin reads them. At the top, NAME or NAME.yml
    (.yaml, .json) for a group or host NAME, as a file or a directory: a host named by its address
    (host_vars/192.0.2.7) has no extension of its own, so every entry is checked but those Ansible
    ignores in an inventory directory (README.md, backups). Inside a directory, the files with one of
    those extensions or none. Hidden files and backups (NAME~) are nobody's: Ansible passes them by."""
    from ansible.inventory.manager import IGNORED

    if not _first_visit(directory, seen):
        return
    for name in sorted(os.listdir(directory)):
        if name.startswith(".") or name.endswith("~") or (top and IGNORED.search(os.fsencode(name))):
            continue
        path = directory / name
        if path.is_dir():
            _check_vars_dir(path, seen)
        elif top or os.path.splitext(name)[1] in _VARS_EXTENSIONS:
            _check_vars_file(path)


# Inventory host names gpuprov accepts: what a host name or an IPv4 address needs, and no character that
# means something in an Ansible host pattern.
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


# One term of an Ansible host pattern that is not a regex (~...): names, globs and an optional subscript.
_LIMIT_TERM = re.compile(r"[!&]?[A-Za-z0-9._*?-]+(\[-?\d*(:-?\d*)?\])?")


def check_limit(pattern: str) -> None:
    """Refuse a --limit Ansible would misread (a lone '[' there selects every host)."""
    for term in re.split(r"[,:](?![^\[]*\])", pattern):
        term = term.strip()
        if not term:
            continue
        if term.lstrip("!&").startswith("~"):
            try:
                re.compile(term.lstrip("!&")[1:])
            except re.error as exc:
                why = f"{term!r} is not a valid regular expression: {exc}"
                raise InputError(f"--limit {pattern}: {why}") from exc
            continue
        if not _LIMIT_TERM.fullmatch(term):
            raise InputError(
                f"--limit {pattern}: {term!r} is not a host, group or glob pattern "
                "(names, * and ?, !excluded, &required, name[0:3], ~regex)"
            )


# The variables that say how to reach a host: gpuprov's own SSH connections read them. Each is one
# value (a string, a number or a boolean), never a list or a mapping.
CONNECTION_VARS = (
    "ansible_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_host_key_checking",
    "ansible_password",
    "ansible_ssh_pass",
)


class Inventory:
    """A parsed inventory. `select()` applies an Ansible host pattern (as --limit does)."""

    def __init__(self, source: Path) -> None:
        self.source = source
        # Unparsable sources are errors, not warnings: a typo must not silently yield zero hosts. Set on
        # ansible's constants (read when an inventory is parsed), not through the environment, which
        # ansible reads only once, when something first imports it.
        from ansible import constants as C
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

        if not source.exists():
            raise InputError(f"{source}: inventory not found")
        check_inventory_files(source)
        C.INVENTORY_UNPARSED_IS_FAILED = True
        C.INVENTORY_ANY_UNPARSED_IS_FAILED = True
        self._loader = DataLoader()
        try:
            self._manager = InventoryManager(loader=self._loader, sources=[str(source)])
        except AnsibleError as exc:
            raise InputError(f"{source}: cannot parse inventory: {_first_line(exc)}") from exc
        self._variables = VariableManager(loader=self._loader, inventory=self._manager)
        for name in self._manager.hosts:
            if not HOST_NAME.fullmatch(name):
                raise InputError(
                    f"{source}: host name {name[:80]!r} may hold only letters, digits, '.', '-' and '_' "
                    "(starting with a letter or digit): gpuprov hands host names to Ansible as --limit "
                    "patterns, where ',', ':', '*', '!' and '&' select other hosts"
                )

    @property
    def group_names(self) -> list[str]:
        return sorted(self._manager.groups)

    def host_names(self, pattern: str = "all") -> list[str]:
        return [h.name for h in self._manager.get_hosts(pattern)]

    def host_vars(self, name: str) -> dict[str, Any]:
        """All variables Ansible would give the host before facts: inventory, group_vars, host_vars."""
        from ansible.errors import AnsibleError

        host = self._manager.get_host(name)
        if host is None:
            raise InputError(f"{self.source}: no host named {name!r}")
        try:
            raw = self._variables.get_vars(host=host, include_hostvars=False)
        except AnsibleError as exc:
            raise InputError(f"{self.source}: variables of {name}: {_first_line(exc)}") from exc
        return {k: v for k, v in raw.items() if not k.startswith("ansible_facts")}

    def select(self, limit: str | None = None) -> list[HostSpec]:
        """HostSpecs for `limit` (an Ansible pattern; None = all), in inventory order."""
        pattern = limit or "all"
        check_limit(pattern)
        from ansible.errors import AnsibleError

        try:
            hosts = self._manager.get_hosts(pattern)
        except AnsibleError as exc:
            raise InputError(f"--limit {pattern}: {_first_line(exc)}") from exc
        return [self._spec(h.name) for h in hosts]

    def _spec(self, name: str) -> HostSpec:
        hv = self.host_vars(name)
        rendered = self._render(hv, name)
        ssh_args = " ".join(
            str(rendered.get(k) or "") for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args")
        )
        opts = _ssh_options(ssh_args)
        known = opts.get("userknownhostsfile")
        checking = opts.get("stricthostkeychecking")
        strict = ansible_bool(rendered.get("ansible_host_key_checking"), default=True)
        env_checking = os.environ.get("ANSIBLE_HOST_KEY_CHECKING")
        if env_checking is not None:
            strict = ansible_bool(env_checking, default=True)
            if not strict:
                _warn_once(
                    "gpuprov: warning: ANSIBLE_HOST_KEY_CHECKING is off in the environment: gpuprov's own "
                    "SSH connections accept unknown host keys too (a changed key is still refused)"
                )
        accept_new = False
        if checking is not None:
            accept_new = checking.lower() == "accept-new"
            strict = checking.lower() not in {"no", "off", "false", "accept-new"}
        port_value = next(
            (rendered[k] for k in ("ansible_port", "ansible_ssh_port") if rendered.get(k) is not None), 22
        )
        try:
            port = int(port_value)
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"{self.source}: host {name}: ansible_port {port_value!r} is not a number"
            ) from exc
        if not 1 <= port <= 65535:
            raise InputError(f"{self.source}: host {name}: ansible_port {port} is not a TCP port (1-65535)")
        key = rendered.get("ansible_ssh_private_key_file") or rendered.get("ansible_private_key_file")
        host = self._manager.get_host(name)
        groups = sorted(g.name for g in host.get_groups() if g.name != "all") if host else []
        return HostSpec(
            name=name,
            address=str(rendered.get("ansible_host") or name),
            port=port,
            user=str(rendered.get("ansible_user") or rendered.get("ansible_ssh_user") or "root"),
            private_key_file=Path(str(key)).expanduser() if key else None,
            known_hosts_file=Path(known).expanduser() if known and known != "/dev/null" else None,
            strict_host_key_checking=strict,
            accept_new_host_keys=accept_new,
            password=rendered.get("ansible_password") or rendered.get("ansible_ssh_pass"),
            groups=groups,
            vars=hv,
        )

    def _render(self, hv: dict[str, Any], name: str) -> dict[str, Any]:
        """Template the connection variables (they may refer to other variables)."""
        from ansible.errors import AnsibleError
        from ansible.template import Templar

        wanted = {k: hv[k] for k in CONNECTION_VARS if k in hv}
        for key, value in wanted.items():
            if isinstance(value, dict | list | tuple):
                from provisioner.inventory_expectations import origin

                host = self._manager.get_host(name)
                groups = [g.name for g in host.get_groups()] if host else []
                where = origin(self.source, name, groups, key)[0]
                raise InputError(
                    f"{where}: {key}: expected a single value, got {described(value)} (host {name})"
                )
        if not any(isinstance(v, str) and "{{" in v for v in wanted.values()):
            return wanted
        templar = Templar(loader=self._loader, variables=hv)
        try:
            return {k: templar.template(v) for k, v in wanted.items()}
        except AnsibleError as exc:
            raise InputError(f"{self.source}: host {name}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    return first_line(str(exc), 1000) or type(exc).__name__


def load_inventory(path: Path) -> Inventory:
    """Parse an inventory file or directory; InputError (exit 2) when it is missing or unparsable."""
    return Inventory(Path(path))
