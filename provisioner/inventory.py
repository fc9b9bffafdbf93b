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
from provisioner.yamlfile import check_ansible_yaml

_TRUE = {"1", "yes", "true", "on", "y"}


@dataclass(frozen=True)
class HostSpec:
    """One inventory host: where and how to reach it, and what the inventory says about it."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    private_key_file: Path | None = None
    known_hosts_file: Path | None = None
    strict_host_key_checking: bool = True
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


def check_yaml_files(source: Path) -> None:
    """Every YAML file of an inventory (the file or directory, group_vars/, host_vars/) parses, or an
    InputError names the file and line: Ansible would only say that no plugin could parse the source,
    after trying INI on a YAML file, or fail later naming neither."""
    base = source if source.is_dir() else source.parent
    files = [source] if source.is_file() and source.suffix in (".yml", ".yaml") else []
    if source.is_dir():
        files += sorted(p for p in source.iterdir() if p.is_file() and p.suffix in (".yml", ".yaml"))
    for sub in ("group_vars", "host_vars"):
        d = base / sub
        if d.is_dir():
            files += sorted(
                p for p in d.rglob("*") if p.is_file() and p.suffix in ("", ".yml", ".yaml", ".json")
            )
    for path in files:
        check_ansible_yaml(path)


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
        check_yaml_files(source)
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

        keys = (
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
        wanted = {k: hv[k] for k in keys if k in hv}
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
