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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from provisioner.errors import InputError
from provisioner.expectations import CONTAINER_ENGINES, Expectations
from provisioner.probes.system import SERVICE_UNITS
from provisioner.yamlfile import load_strict_file

# --------------------------------------------------------------------------------------- validation
# The schema is pydantic models (_schema() below); the value formats they check are these functions,
# which return the value as the checks want it or raise ValueError with the words a user reads.


def _driver_version(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and re.fullmatch(r"\d{3}(\.\d+){0,2}", value.strip()):
        return value.strip()
    if isinstance(value, float):
        raise ValueError(f'quote the version (YAML reads {value!r} as a number): "580.159.04"')
    raise ValueError(
        f'expected a driver branch like "580" or an exact version like "580.159.04", got {value!r}'
    )


def _cuda_version(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"\d+\.\d+(\.\d+)?", value.strip()):
        return value.strip()
    if isinstance(value, float | int) and not isinstance(value, bool):
        raise ValueError(f'quote the version (YAML reads {value!r} as a number; 12.10 would be 12.1): "13.0"')
    raise ValueError(f'expected a CUDA version like "13.0", got {value!r}')


def _str_list(what: str, pattern: str | None = None, choices: Iterable[str] | None = None) -> Any:
    allowed = tuple(choices) if choices is not None else None

    def check(value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise ValueError(f"expected a list of {what}, got {value!r}")
        out = tuple(v.strip() for v in value)
        for v in out:
            if pattern and not re.fullmatch(pattern, v):
                raise ValueError(f"{v!r} is not a valid {what}")
            if allowed is not None and v not in allowed:
                raise ValueError(f"{v!r} is not one of {', '.join(allowed)}")
        return out

    return check


def _os_list(value: Any) -> tuple[str, ...]:
    lowered = [v.lower() if isinstance(v, str) else v for v in value] if isinstance(value, list) else value
    return _str_list('OS names like "ubuntu 24.04"', r"[a-z][a-z0-9._-]* \d+(\.\d+)?")(lowered)


# NVIDIA's Xid catalog numbers its events from 1 into the low hundreds.
XID_RANGE = range(1, 1000)


def _xid_list(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"expected a list of Xid numbers, got {str(value)[:80]}")
    bad = [v for v in value if v not in XID_RANGE]
    if bad:
        raise ValueError(f"{bad[0]} is not an Xid (Xids are {XID_RANGE.start}-{XID_RANGE.stop - 1})")
    return tuple(value)


def _image(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", value.strip()):
        return value.strip()
    raise ValueError(f"expected a container image reference, got {value!r}")


def _check_ids(value: Any) -> tuple[str, ...]:
    from provisioner.checks import CHECK_IDS

    return _str_list("check ids", choices=CHECK_IDS)(value)


def _sharing_strategy(value: Any) -> str:
    if value in ("none", "time-slicing", "mps"):
        return str(value)
    raise ValueError(f"expected none, time-slicing or mps (the device plugin's strategies), got {value!r}")


def _mig_config(value: Any) -> str:
    # A mig-parted configuration name: what the nvidia.com/mig.config label holds (a label value).
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.+]{0,61}[A-Za-z0-9])?", value):
        return value
    raise ValueError(f"expected a MIG configuration name such as all-1g.18gb (a label value), got {value!r}")


def _mig_strategy(value: Any) -> str:
    # The device plugin's MIG strategies that advertise MIG devices (NVIDIA k8s-device-plugin, api/config/v1
    # consts.go: none, single, mixed); "none" advertises whole GPUs and needs no expectation.
    if value in ("single", "mixed"):
        return str(value)
    raise ValueError(f"expected single or mixed (the device plugin's MIG strategies), got {value!r}")


def _tenants(value: Any) -> tuple[Any, ...]:
    from provisioner.tenants import parse_tenants

    try:
        return parse_tenants(value, "")
    except InputError as exc:
        raise ValueError(str(exc).lstrip()) from None


class Key(NamedTuple):
    field: str  # the Expectations field it sets
    meaning: str  # one line, for docs and errors


# policy key → (Expectations field, meaning). The models in _schema() have one field per key, by alias.
KEYS: dict[str, Key] = {
    "os.supported": Key("os_supported", 'supported OS list, e.g. ["ubuntu 24.04", "debian 12"]'),
    "gpu.present": Key("gpu_present", "an NVIDIA GPU must be on the PCI bus"),
    "gpu.count": Key("gpu_count", "GPUs expected on the PCI bus and seen by the driver"),
    "driver.version": Key("driver_version", 'driver branch ("580") or exact version'),
    "cuda.version": Key("cuda_version", 'CUDA toolkit release at /usr/local/cuda ("13.0")'),
    "gpu.persistence": Key("gpu_persistence", "persistence mode enabled (default true)"),
    "gpu.ecc": Key("gpu_ecc", "ECC enabled (default: where the GPU supports it)"),
    "packages.held": Key("packages_held", "packages that must be on hold"),
    "services.active": Key("services_active", "units that must be active"),
    "container_toolkit.runtime": Key(
        "container_toolkit_runtime", "engines whose config must have the nvidia runtime"
    ),
    "k8s.node": Key("k8s_node", "host must be a Ready Kubernetes node"),
    "gpu.xid.ignore": Key("xid_ignore", "Xids reported but not counted"),
    "container.smoke_image": Key("container_smoke_image", "image for the container smoke test"),
    "dcgm.diag": Key("dcgm_diag", "run DCGM diagnostic level 1 where dcgmi is installed"),
    "checks.skip": Key("skip_checks", "check ids not to evaluate"),
    "gpu.sharing.strategy": Key(
        "sharing_strategy", "GPU sharing the device plugin applies: none, time-slicing, mps"
    ),
    "gpu.sharing.replicas": Key("sharing_replicas", "replicas per GPU under time-slicing or MPS (2 or more)"),
    "mig.config": Key("mig_config", "MIG layout the node must have, e.g. all-1g.18gb or all-disabled"),
    "mig.strategy": Key("mig_strategy", "how the device plugin advertises MIG devices: single or mixed"),
    "monitoring.dcgm_exporter": Key("dcgm_exporter", "the DCGM exporter must serve this node's GPUs"),
    "tenants.quota": Key(
        "tenants", "GPU tenants: list of {name, namespace, gpus, mig, max_gpus_per_pod, node_pool}"
    ),
}
_RESERVED = ("groups", "hosts")

# What a user reads when pydantic's own types refuse a value (the format functions above word theirs).
_TYPE_MESSAGES: dict[str, str] = {
    "gpu.count": "expected a whole number of GPUs (0-64), got {value!r}",
    "gpu.sharing.replicas": "expected a whole number of replicas per GPU (2-1024), got {value!r}",
    "gpu.present": "expected true or false, got {value!r}",
    "gpu.persistence": "expected true or false, got {value!r}",
    "gpu.ecc": "expected true or false, got {value!r}",
    "k8s.node": "expected true or false, got {value!r}",
    "dcgm.diag": "expected true or false, got {value!r}",
    "monitoring.dcgm_exporter": "expected true or false, got {value!r}",
}


def _members(section: str) -> Any:
    """groups: and hosts: map a name to a block of keys (names as strings, as the inventory has them)."""

    def check(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a mapping of {section[:-1]} name → keys")
        return {str(name): keys for name, keys in value.items()}

    return check


@cache
def _schema() -> tuple[Any, Any]:
    """The policy's pydantic models: (one block of keys, the whole file). Built on first use: pydantic
    takes 0.1-0.2 s to import, which only a policy's readers (verify, check) should pay."""
    from typing import Annotated

    from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

    def key(name: str) -> Any:
        return Field(None, alias=name)

    def formatted(kind: Any, check: Any) -> Any:
        return Annotated[kind, BeforeValidator(check)]

    class Block(BaseModel):
        """Policy keys: the top level's, a group's or a host's. null (None) unsets a key set by an
        outer layer; an unknown key is refused (extra="forbid")."""

        model_config = ConfigDict(extra="forbid")

        os_supported: formatted(tuple[str, ...], _os_list) | None = key("os.supported")
        gpu_present: StrictBool | None = key("gpu.present")
        gpu_count: Annotated[int, Field(strict=True, ge=0, le=64)] | None = key("gpu.count")
        driver_version: formatted(str, _driver_version) | None = key("driver.version")
        cuda_version: formatted(str, _cuda_version) | None = key("cuda.version")
        gpu_persistence: StrictBool | None = key("gpu.persistence")
        gpu_ecc: StrictBool | None = key("gpu.ecc")
        packages_held: (
            formatted(tuple[str, ...], _str_list("package names or globs", r"[a-z0-9*?][a-z0-9.+*?:-]*"))
            | None
        ) = key("packages.held")
        services_active: formatted(tuple[str, ...], _str_list("units", choices=SERVICE_UNITS)) | None = key(
            "services.active"
        )
        container_toolkit_runtime: (
            formatted(tuple[str, ...], _str_list("engines", choices=CONTAINER_ENGINES)) | None
        ) = key("container_toolkit.runtime")
        k8s_node: StrictBool | None = key("k8s.node")
        xid_ignore: formatted(tuple[int, ...], _xid_list) | None = key("gpu.xid.ignore")
        container_smoke_image: formatted(str, _image) | None = key("container.smoke_image")
        dcgm_diag: StrictBool | None = key("dcgm.diag")
        skip_checks: formatted(tuple[str, ...], _check_ids) | None = key("checks.skip")
        sharing_strategy: formatted(str, _sharing_strategy) | None = key("gpu.sharing.strategy")
        sharing_replicas: Annotated[int, Field(strict=True, ge=2, le=1024)] | None = key(
            "gpu.sharing.replicas"
        )
        mig_config: formatted(str, _mig_config) | None = key("mig.config")
        mig_strategy: formatted(str, _mig_strategy) | None = key("mig.strategy")
        dcgm_exporter: StrictBool | None = key("monitoring.dcgm_exporter")
        tenants: formatted(Any, _tenants) | None = key("tenants.quota")

    class File(Block):
        """A policy file: top-level keys, then per-group and per-host blocks."""

        groups: formatted(dict[str, Block | None], _members("groups")) | None = None
        hosts: formatted(dict[str, Block | None], _members("hosts")) | None = None

    assert {f.alias for f in Block.model_fields.values()} == set(KEYS)
    return Block, File


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(KEYS) + list(_RESERVED), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _problem(error: Any, where: str) -> str:
    """One of pydantic's errors, as "key.path: message" (the key path from `where` down)."""
    value, kind = error["input"], error["type"]
    loc = tuple(str(part) for part in error["loc"])
    if kind == "invalid_key":  # a key that is no string (YAML's 1, true, null): the key is the input
        loc = (*loc[:-1], str(value))
    at = ".".join(part for part in (where, *loc) if part) or "policy"
    if kind in ("extra_forbidden", "invalid_key"):
        return f"{at}: unknown key{_suggest(loc[-1])}; keys: {', '.join(KEYS)}"
    if kind == "value_error":
        return f"{at}: {error['ctx']['error']}"
    if kind in ("model_type", "model_attributes_type"):
        from provisioner.config import yaml_kind

        return f"{at}: expected a mapping of policy keys, got {yaml_kind(value)}"
    template = _TYPE_MESSAGES.get(loc[-1]) if loc else None
    return f"{at}: {template.format(value=value)}" if template else f"{at}: {error['msg']}, got {value!r}"


def _first(errors: list[Any], doc: Any, sections: bool) -> Any:
    """The error a reader meets first: top-level keys before groups: before hosts: (with `sections`),
    then in the document's order."""

    def position(error: Any) -> tuple[int, list[int]]:
        loc = error["loc"]
        if error["type"] == "invalid_key":
            loc = (*loc[:-1], error["input"])
        rank = _RESERVED.index(loc[0]) + 1 if sections and loc and loc[0] in _RESERVED else 0
        steps, node = [], doc
        for part in loc:
            names = [str(k) for k in node] if isinstance(node, Mapping) else []
            if str(part) not in names:
                break
            steps.append(names.index(str(part)))
            node = list(node.values())[steps[-1]]
        return rank, steps

    return min(errors, key=position)


def _validated(model: Any, mapping: Any, where: str, *, sections: bool) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(mapping)
    except ValidationError as exc:
        raise InputError(_problem(_first(exc.errors(), mapping, sections), where)) from None


def _keys_set(block: Any, mapping: Mapping[str, Any]) -> dict[str, Any]:
    """{policy key: validated value} for the keys the block sets (None: unset), in the file's order."""
    return {k: getattr(block, KEYS[k].field) for k in mapping if k in KEYS}


def validate_expectations(mapping: Any, where: str) -> dict[str, Any]:
    """Check one block of policy keys; return {policy key: validated value}."""
    if mapping is None:
        return {}
    block, _file = _schema()
    return _keys_set(_validated(block, mapping, where, sections=False), mapping)


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
                name = KEYS[key].field
                if value is None:
                    setattr(exp, name, getattr(defaults, name))
                    exp.sources.pop(key, None)
                else:
                    setattr(exp, name, value)
                    exp.sources[key] = where
        return exp


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file; any problem is an InputError naming the file and key."""
    doc = load_strict_file(path, "policy file")
    return policy_from_mapping(doc if doc is not None else {}, path)


def policy_from_mapping(doc: Any, path: Path | None = None) -> Policy:
    name = str(path) if path else "policy"
    if not isinstance(doc, Mapping):
        raise InputError(f'{name}: a policy is a mapping of keys (driver.version: "580", ...)')
    _block, policy_file = _schema()
    # Error messages name the file first, then the key path.
    try:
        parsed = _validated(policy_file, doc, "", sections=True)
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    policy = Policy(path=path, base=_keys_set(parsed, doc))
    for section, target in (("groups", policy.groups), ("hosts", policy.hosts)):
        given = {str(member): keys for member, keys in (doc.get(section) or {}).items()}
        for member, block in (getattr(parsed, section) or {}).items():
            target[member] = _keys_set(block, given[member]) if block is not None else {}
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
