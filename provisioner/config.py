"""Settings validation before any host is touched.

The roles' knobs are declared once, in each role's `meta/argument_specs.yml`. Ansible checks them too,
but only once a play has started on the hosts (facts gathered, connections open). gpuprov reads the same
specs and checks every role-prefixed variable the inventory gives each selected host first: unknown keys
(typos that would silently fall back to a default), wrong types and values outside `choices` are bad
input (exit 2) and the error names the file and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from provisioner.content import ROLES_DIR
from provisioner.errors import InputError

# Knobs shared by several roles (docs/contracts.md).
GLOBAL_KNOBS: dict[str, str] = {
    "gpuprov_mirror_url": "str",
    "gpuprov_mirror_key_url": "str",
    "gpuprov_mirror_key_fingerprint": "str",
    "gpuprov_reboot_allowed": "bool",
}


@dataclass(frozen=True)
class Knob:
    role: str
    name: str
    type: str = "str"
    choices: tuple[Any, ...] = ()
    elements: str | None = None


@dataclass
class RoleSpecs:
    """The knobs of every role, by name, and the role prefixes that claim a variable."""

    knobs: dict[str, Knob] = field(default_factory=dict)
    prefixes: dict[str, str] = field(default_factory=dict)  # "nvidia_driver_" -> "nvidia_driver"

    def owner(self, var: str) -> str | None:
        """The role whose prefix the variable carries (longest prefix wins)."""
        best = None
        for prefix, role in self.prefixes.items():
            if var.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
                best = (prefix, role)
        return best[1] if best else None


@cache
def load_role_specs(roles_dir: Path = ROLES_DIR) -> RoleSpecs:
    """Read every role's argument specs (all entry points)."""
    specs = RoleSpecs()
    if not roles_dir.is_dir():
        return specs
    for spec_file in sorted(roles_dir.glob("*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        try:
            doc = yaml.safe_load(spec_file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"{spec_file}: invalid YAML: {exc}") from exc
        specs.prefixes[f"{role}_"] = role
        for entry in (doc.get("argument_specs") or {}).values():
            for name, opt in ((entry or {}).get("options") or {}).items():
                opt = opt or {}
                specs.knobs[name] = Knob(
                    role=role,
                    name=name,
                    type=str(opt.get("type", "str")),
                    choices=tuple(opt.get("choices") or ()),
                    elements=opt.get("elements"),
                )
    return specs


_TYPE_CHECKS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "path": (str,),
    "raw": (object,),
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "list": (list,),
    "dict": (dict,),
}
_BOOL_STRINGS = {"yes", "no", "true", "false", "on", "off", "1", "0"}


def yaml_kind(value: Any) -> str:
    """What a value is, in YAML's words (Ansible wraps values in its own classes, whose names mean
    nothing to a user: _AnsibleTaggedStr is a string)."""
    for kind, types in (("boolean", bool), ("string", str), ("integer", int), ("number", float)):
        if isinstance(value, types):
            return kind
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return "null" if value is None else "value"


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _type_error(value: Any, kind: str) -> str | None:
    """Why `value` does not fit Ansible's argument-spec `kind` (None when it fits)."""
    if value is None or _templated(value) or kind not in _TYPE_CHECKS:
        return None
    if kind == "bool":
        if isinstance(value, bool) or (isinstance(value, str) and value.lower() in _BOOL_STRINGS):
            return None
        return f"expected a boolean, got {value!r}"
    if kind in ("int", "float") and isinstance(value, bool):
        return f"expected {kind}, got {value!r}"
    if kind == "int" and isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return None
    if kind == "str" and isinstance(value, int | float) and not isinstance(value, bool):
        return None  # Ansible converts numbers to strings for str options (e.g. branch: 580)
    if not isinstance(value, _TYPE_CHECKS[kind]):
        return f"expected {kind}, got {yaml_kind(value)} {str(value)[:80]!r}"
    return None


def _where(inventory: Path, key: str) -> str:
    """The inventory file that sets `key` (group_vars/host_vars included), for the error message."""
    base = inventory if inventory.is_dir() else inventory.parent

    # Most specific first, as Ansible's precedence goes: host_vars, a group's vars, group_vars/all, the
    # inventory itself (the value a host gets comes from the first of them that sets it).
    def files(d: Path) -> list[Path]:
        return sorted(p for p in d.rglob("*") if p.is_file()) if d.is_dir() else []

    groups = files(base / "group_vars")
    everyone = ("all", "all.yml", "all.yaml")
    is_all = [p for p in groups if p.relative_to(base / "group_vars").parts[0] in everyone]
    candidates = files(base / "host_vars") + [p for p in groups if p not in is_all] + is_all
    candidates += [inventory] if inventory.is_file() else []
    if inventory.is_dir():
        candidates.extend(sorted(p for p in inventory.iterdir() if p.is_file()))
    pattern = re.compile(rf"(^|[\s{{,]){re.escape(key)}\s*[:=]", re.MULTILINE)
    for path in candidates:
        try:
            if pattern.search(path.read_text(errors="replace")):
                return str(path)
        except OSError:
            continue
    return str(inventory)


# Value formats the roles assert only once connected (roles/nvidia_driver/vars/main.yml,
# __nvidia_driver_argument_checks): the same patterns, checked before any host is touched.
VALUE_FORMATS: dict[str, tuple[str, str]] = {
    "nvidia_driver_branch": (r"[0-9]{3}", 'a driver branch like "580"'),
    "nvidia_driver_version": (r"[0-9]{3}\.[0-9]+(\.[0-9]+)?", 'a full driver version like "580.159.04"'),
    "nvidia_driver_package_revision": (r"(-[0-9A-Za-z.+~]+)?", 'empty or a revision like "-1"'),
}


def _format_problem(key: str, value: Any) -> str | None:
    fmt = VALUE_FORMATS.get(key)
    if fmt is None or value is None or _templated(value) or isinstance(value, bool):
        return None
    if not re.fullmatch(fmt[0], str(value)):
        return f"{str(value)[:80]!r} must be {fmt[1]}"
    return None


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    message: str


def check_host_vars(host: str, hostvars: dict[str, Any], specs: RoleSpecs) -> list[Problem]:
    """Problems with one host's role and global knobs."""
    problems: list[Problem] = []
    for key, value in sorted(hostvars.items()):
        if key.startswith("gpuprov_"):
            if key not in GLOBAL_KNOBS:
                problems.append(Problem(host, key, f"unknown setting (known: {', '.join(GLOBAL_KNOBS)})"))
            elif why := _type_error(value, GLOBAL_KNOBS[key]):
                problems.append(Problem(host, key, why))
            continue
        role = specs.owner(key)
        if role is None:
            continue
        knob = specs.knobs.get(key)
        if knob is None:
            near = sorted(k for k in specs.knobs if specs.knobs[k].role == role and _close(k, key))
            hint = f"; did you mean {near[0]}?" if near else ""
            problems.append(Problem(host, key, f"unknown setting for role {role}{hint}"))
            continue
        if why := _type_error(value, knob.type) or _format_problem(key, value):
            problems.append(Problem(host, key, why))
            continue
        if knob.choices and not _templated(value):
            values = value if isinstance(value, list) else [value]
            bad = [v for v in values if v not in knob.choices and str(v) not in map(str, knob.choices)]
            if bad:
                allowed = ", ".join(map(str, knob.choices))
                problems.append(Problem(host, key, f"{bad[0]!r} is not one of: {allowed}"))
    branch, version = hostvars.get("nvidia_driver_branch"), hostvars.get("nvidia_driver_version")
    if (
        branch is not None
        and version is not None
        and not _format_problem("nvidia_driver_branch", branch)
        and not _format_problem("nvidia_driver_version", version)
        and not _templated(branch)
        and not _templated(version)
        and str(version).split(".")[0] != str(branch)
    ):
        why = f"{version} is not in branch {branch} (nvidia_driver_branch)"
        problems.append(Problem(host, "nvidia_driver_version", why))
    return problems


def _close(a: str, b: str) -> bool:
    """Similar enough to be a typo of each other."""
    import difflib

    return difflib.SequenceMatcher(None, a, b).ratio() >= 0.85


def validate_inventory_settings(inventory: Any, hosts: list[Any], specs: RoleSpecs | None = None) -> None:
    """Raise InputError naming the file, host and key of the first bad setting (all listed)."""
    specs = specs or load_role_specs()
    problems: list[Problem] = []
    for host in hosts:
        problems.extend(check_host_vars(host.name, host.vars, specs))
    if not problems:
        return
    # The same bad group variable shows up once per host: report each key once, naming the hosts.
    by_key: dict[tuple[str, str], list[str]] = {}
    for p in problems:
        by_key.setdefault((p.key, p.message), []).append(p.host)
    lines = []
    for (key, message), names in by_key.items():
        who = names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} more)"
        lines.append(f"{_where(Path(inventory.source), key)}: {key}: {message} (host {who})")
    raise InputError(
        "; ".join(lines) if len(lines) <= 3 else "; ".join(lines[:3]) + f"; and {len(lines) - 3} more"
    )
