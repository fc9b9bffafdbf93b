"""Desired fleet state (a YAML policy) → per-host expectations for the checks.

A policy names expectations with the check ids' own dotted names (`driver.version: "580"`). Top-level
keys apply to every host; `groups:` overrides them per inventory group (in the order the policy
lists the groups, later ones winning) and `hosts:` per inventory host name (winning over groups).
Every key is validated up front; an error names the file and the key. See docs/verification.md.

Without a policy, checks derive what they can from the host itself, and an expectation that cannot
be known (which driver version *should* this be?) makes its check `skip` with that reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.expectations import CONTAINER_ENGINES, Expectations
from provisioner.probes import SERVICE_UNITS
from provisioner.yamlfile import load_strict

# --------------------------------------------------------------------------------------- validation

Validator = Callable[[Any, str], Any]


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise InputError(f"{where}: expected true or false, got {value!r}")


def _count(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 64:
        return value
    raise InputError(f"{where}: expected a whole number of GPUs (0-64), got {value!r}")


def _driver_version(value: Any, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and re.fullmatch(r"\d{3}(\.\d+){0,2}", value.strip()):
        return value.strip()
    if isinstance(value, float):
        raise InputError(f'{where}: quote the version (YAML reads {value!r} as a number): "580.159.04"')
    raise InputError(
        f'{where}: expected a driver branch like "580" or an exact version like "580.159.04", got {value!r}'
    )


def _cuda_version(value: Any, where: str) -> str:
    if isinstance(value, str) and re.fullmatch(r"\d+\.\d+(\.\d+)?", value.strip()):
        return value.strip()
    if isinstance(value, float | int) and not isinstance(value, bool):
        raise InputError(
            f'{where}: quote the version (YAML reads {value!r} as a number; 12.10 would be 12.1): "13.0"'
        )
    raise InputError(f'{where}: expected a CUDA version like "13.0", got {value!r}')


def _str_list(what: str, pattern: str | None = None, choices: Iterable[str] | None = None) -> Validator:
    allowed = tuple(choices) if choices is not None else None

    def check(value: Any, where: str) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise InputError(f"{where}: expected a list of {what}, got {value!r}")
        out = tuple(v.strip() for v in value)
        for v in out:
            if pattern and not re.fullmatch(pattern, v):
                raise InputError(f"{where}: {v!r} is not a valid {what}")
            if allowed is not None and v not in allowed:
                raise InputError(f"{where}: {v!r} is not one of {', '.join(allowed)}")
        return out

    return check


def _os_list(value: Any, where: str) -> tuple[str, ...]:
    out = _str_list('OS names like "ubuntu 24.04"', r"[a-z][a-z0-9._-]* \d+(\.\d+)?")(
        [v.lower() if isinstance(v, str) else v for v in value] if isinstance(value, list) else value, where
    )
    return out


# NVIDIA's Xid catalog numbers its events from 1 into the low hundreds.
XID_RANGE = range(1, 1000)


def _xid_list(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"{where}: expected a list of Xid numbers, got {str(value)[:80]}")
    bad = [v for v in value if v not in XID_RANGE]
    if bad:
        raise InputError(f"{where}: {bad[0]} is not an Xid (Xids are {XID_RANGE.start}-{XID_RANGE.stop - 1})")
    return tuple(value)


def _image(value: Any, where: str) -> str:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", value.strip()):
        return value.strip()
    raise InputError(f"{where}: expected a container image reference, got {value!r}")


def _check_ids(value: Any, where: str) -> tuple[str, ...]:
    from provisioner.checks import CHECK_IDS

    return _str_list("check ids", choices=CHECK_IDS)(value, where)


# policy key → (Expectations field, validator, one-line meaning for docs and errors)
KEYS: dict[str, tuple[str, Validator, str]] = {
    "os.supported": ("os_supported", _os_list, 'supported OS list, e.g. ["ubuntu 24.04", "debian 12"]'),
    "gpu.present": ("gpu_present", _bool, "an NVIDIA GPU must be on the PCI bus"),
    "gpu.count": ("gpu_count", _count, "GPUs expected on the PCI bus and seen by the driver"),
    "driver.version": ("driver_version", _driver_version, 'driver branch ("580") or exact version'),
    "cuda.version": ("cuda_version", _cuda_version, 'CUDA toolkit release at /usr/local/cuda ("13.0")'),
    "gpu.persistence": ("gpu_persistence", _bool, "persistence mode enabled (default true)"),
    "gpu.ecc": ("gpu_ecc", _bool, "ECC enabled (default: where the GPU supports it)"),
    "packages.held": (
        "packages_held",
        _str_list("package names or globs", r"[a-z0-9*?][a-z0-9.+*?:-]*"),
        "packages that must be on hold",
    ),
    "services.active": (
        "services_active",
        _str_list("units", choices=SERVICE_UNITS),
        "units that must be active",
    ),
    "container_toolkit.runtime": (
        "container_toolkit_runtime",
        _str_list("engines", choices=CONTAINER_ENGINES),
        "engines whose config must have the nvidia runtime",
    ),
    "k8s.node": ("k8s_node", _bool, "host must be a Ready Kubernetes node"),
    "gpu.xid.ignore": ("xid_ignore", _xid_list, "Xids reported but not counted"),
    "container.smoke_image": ("container_smoke_image", _image, "image for the container smoke test"),
    "dcgm.diag": ("dcgm_diag", _bool, "run DCGM diagnostic level 1 where dcgmi is installed"),
    "checks.skip": ("skip_checks", _check_ids, "check ids not to evaluate"),
}
_RESERVED = ("groups", "hosts")


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(KEYS) + list(_RESERVED), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def validate_expectations(mapping: Any, where: str) -> dict[str, Any]:
    """Check one block of policy keys; return {policy key: validated value}."""
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        from provisioner.config import yaml_kind

        kind = yaml_kind(mapping)
        raise InputError(f"{where or 'policy'}: expected a mapping of policy keys, got {kind}")
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or key not in KEYS:
            at = f"{where}.{key}" if where else str(key)
            raise InputError(f"{at}: unknown key{_suggest(str(key))}; keys: {', '.join(KEYS)}")
        # null removes an expectation set by an outer layer (back to the default)
        out[key] = None if value is None else KEYS[key][1](value, f"{where}.{key}" if where else key)
    return out


# ------------------------------------------------------------------------------------------- policy


@dataclass
class Policy:
    path: Path | None
    base: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def expectations_for(self, host: str, groups: Iterable[str] = ()) -> Expectations:
        """Merge top level < groups (policy order) < host, remembering where each value came from."""
        label = self.path.name if self.path else "policy"
        exp = Expectations()
        layers: list[tuple[str, dict[str, Any]]] = [(label, self.base)]
        member = set(groups)
        layers += [(f"{label} groups.{g}", keys) for g, keys in self.groups.items() if g in member]
        if host in self.hosts:
            layers.append((f"{label} hosts.{host}", self.hosts[host]))
        defaults = Expectations()
        for where, keys in layers:
            for key, value in keys.items():
                name = KEYS[key][0]
                if value is None:
                    setattr(exp, name, getattr(defaults, name))
                    exp.sources.pop(key, None)
                else:
                    setattr(exp, name, value)
                    exp.sources[key] = where
        return exp


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file; any problem is an InputError naming the file and key."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise InputError(f"{path}: policy file not found") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read policy: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from exc
    doc = load_strict(text, path)
    return policy_from_mapping(doc if doc is not None else {}, path)


def policy_from_mapping(doc: Any, path: Path | None = None) -> Policy:
    name = str(path) if path else "policy"
    if not isinstance(doc, Mapping):
        raise InputError(f'{name}: a policy is a mapping of keys (driver.version: "580", ...)')
    base = {k: v for k, v in doc.items() if k not in _RESERVED}
    policy = Policy(path=path)
    # Error messages name the file first, then the key path.
    try:
        policy.base = validate_expectations(base, "")
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    for section in _RESERVED:
        block = doc.get(section)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise InputError(f"{name}: {section}: expected a mapping of {section[:-1]} name → keys")
        target = policy.groups if section == "groups" else policy.hosts
        for member, keys in block.items():
            try:
                target[str(member)] = validate_expectations(keys, f"{section}.{member}")
            except InputError as exc:
                raise InputError(f"{name}: {exc}") from None
    return policy


def check_policy_names(policy: Policy, hosts: Iterable[str], groups: Iterable[str], inventory: Path) -> None:
    """A policy's groups: and hosts: must name what the inventory has (a typo would silently apply
    nothing)."""
    name = str(policy.path) if policy.path else "policy"
    known_groups, known_hosts = set(groups), set(hosts)
    for group in policy.groups:
        if group not in known_groups:
            raise InputError(f"{name}: groups.{group}: no such group in {inventory}")
    for host in policy.hosts:
        if host not in known_hosts:
            raise InputError(f"{name}: hosts.{host}: no such host in {inventory}")


def with_overrides(exp: Expectations, **changes: Any) -> Expectations:
    """A copy with some fields changed (callers such as bootstrap pin what they just installed)."""
    known = {f.name for f in fields(Expectations)}
    unknown = set(changes) - known
    if unknown:
        raise InputError(f"unknown expectation(s): {', '.join(sorted(unknown))}")
    return replace(exp, sources=dict(exp.sources), **changes)
