"""What the inventory declares about a host's GPUs in the cluster, as policy keys for verification.

The knobs that shape the cluster (read by the roles) are expectations too; verification judges a host
against them wherever a policy says nothing (policy values win):

- `gpuprov_mig_config` (host/group var: a MIG layout name) → `mig.config`;
- `gpuprov_mig_strategy` (single, mixed; none: no expectation) → `mig.strategy`;
- `gpuprov_gpu_sharing` (host/group var: a profile name, or none) with `gpuprov_gpu_sharing_profiles`
  (all: name → the device plugin's config document) → `gpu.sharing.strategy`, `gpu.sharing.replicas`;
- `gpuprov_tenants` (all: a list of tenants, provisioner.tenants) → `tenants.quota`;
- `gpu_operator_values.dcgmExporter.enabled` (the GPU Operator's switch for its DCGM exporter, when the
  inventory sets it) → `monitoring.dcgm_exporter` on GPU hosts.

`declared(...)` returns {policy key: (value, source)}; the source names the inventory file that sets the
knob ("inventory host_vars gpu1", "inventory group_vars gpu_nodes", "inventory hosts.yml"). A bad value
is an InputError naming that file and the knob.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.yamlfile import described

MIG_CONFIG = "gpuprov_mig_config"
MIG_STRATEGY = "gpuprov_mig_strategy"
SHARING = "gpuprov_gpu_sharing"
SHARING_PROFILES = "gpuprov_gpu_sharing_profiles"
TENANTS = "gpuprov_tenants"
OPERATOR_VALUES = "gpu_operator_values"
# Policy keys filled together: a policy that sets one of a group decides the whole group.
GROUPS: tuple[tuple[str, ...], ...] = (
    ("mig.config",),
    ("mig.strategy",),
    ("gpu.sharing.strategy", "gpu.sharing.replicas"),
    ("tenants.quota",),
    ("monitoring.dcgm_exporter",),
)


def origin(inventory: Path | None, host: str, groups: Sequence[str], knob: str) -> tuple[str, str]:
    """(file, source) of the inventory file that most likely gives `host` its `knob`: host_vars first,
    then the host's groups' group_vars, group_vars/all, then the inventory itself (Ansible's precedence)."""
    if inventory is None:
        return "inventory", f"inventory vars of {host}"
    base = inventory if inventory.is_dir() else inventory.parent

    def files(path: Path) -> list[Path]:
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for suffix in (".yml", ".yaml", ".json"):
            candidate = path.with_name(path.name + suffix)
            if candidate.is_file():
                found.append(candidate)
        return found

    layers: list[tuple[list[Path], str]] = [(files(base / "host_vars" / host), f"host_vars {host}")]
    layers += [
        (files(base / "group_vars" / g), f"group_vars {g}") for g in reversed(list(groups)) if g != "all"
    ]
    layers.append((files(base / "group_vars" / "all"), "group_vars all"))
    inventory_files = (
        [inventory] if inventory.is_file() else sorted(p for p in inventory.iterdir() if p.is_file())
    )
    layers += [([p], p.name) for p in inventory_files]
    pattern = re.compile(rf"(^|[\s{{,]){re.escape(knob)}\s*[:=]", re.MULTILINE)
    for paths, label in layers:
        for path in paths:
            try:
                if pattern.search(path.read_text(errors="replace")):
                    return str(path), f"inventory {label}"
            except OSError:
                continue
    return str(inventory), f"inventory {inventory.name}"


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _policy_value(key: str, value: Any, where: str) -> Any:
    """A value checked as the policy checks its key; the error names `where` (file: knob)."""
    from provisioner.policy import validate_expectations

    try:
        return validate_expectations({key: value}, "")[key]
    except InputError as exc:
        raise InputError(f"{where}: {str(exc).removeprefix(key + ': ')}") from None


def _sharing(hostvars: Mapping[str, Any], where: str, profiles_where: str) -> dict[str, Any]:
    """gpu.sharing.* from the host's profile name and the profiles' device plugin documents."""
    from provisioner.sharing import PREFIX, parse_document

    name = hostvars.get(SHARING)
    if name in (None, "") or _templated(name):
        return {}
    if not isinstance(name, str):
        raise InputError(f"{where}: expected a sharing profile name or none, got {described(name)}")
    if name == "none":
        return {"gpu.sharing.strategy": "none"}
    profiles = hostvars.get(SHARING_PROFILES)
    if not isinstance(profiles, Mapping) or name not in profiles:
        known = ", ".join(sorted(map(str, profiles))) if isinstance(profiles, Mapping) else "none defined"
        raise InputError(f"{where}: no profile {name!r} in {SHARING_PROFILES} (profiles: {known})")
    doc = profiles[name]
    if not isinstance(doc, Mapping):
        raise InputError(
            f"{profiles_where}.{name}: expected the device plugin's config (version: v1, sharing: ...)"
        )
    config = parse_document(doc, f"{profiles_where}.{name}")
    out: dict[str, Any] = {"gpu.sharing.strategy": config.strategy}
    whole = next((r for r in config.resources if r.name == f"{PREFIX}/gpu"), None)
    if whole is not None:
        out["gpu.sharing.replicas"] = whole.replicas
    return out


def exporter_enabled(values: Any) -> bool | None:
    """What chart values say of the GPU Operator's DCGM exporter: dcgmExporter.enabled when set (a
    boolean), else None (the chart's default, true, unless something else installed the operator)."""
    if not isinstance(values, Mapping):
        return None
    exporter = values.get("dcgmExporter")
    enabled = exporter.get("enabled") if isinstance(exporter, Mapping) else None
    return enabled if isinstance(enabled, bool) else None


def declared(
    hostvars: Mapping[str, Any], *, host: str, groups: Sequence[str] = (), inventory: Path | None = None
) -> dict[str, tuple[Any, str]]:
    """{policy key: (validated value, source)} for what the inventory declares about `host`."""

    def where(knob: str) -> tuple[str, str]:
        path, source = origin(inventory, host, groups, knob)
        return f"{path}: {knob}", source

    out: dict[str, tuple[Any, str]] = {}
    value = hostvars.get(MIG_CONFIG)
    if value not in (None, "") and not _templated(value):
        at, source = where(MIG_CONFIG)
        out["mig.config"] = (_policy_value("mig.config", value, at), source)
    value = hostvars.get(MIG_STRATEGY)
    if value not in (None, "", "none") and not _templated(value):
        at, source = where(MIG_STRATEGY)
        out["mig.strategy"] = (_policy_value("mig.strategy", value, at), source)
    if hostvars.get(SHARING) not in (None, ""):
        at, source = where(SHARING)
        profiles_at, _ = where(SHARING_PROFILES)
        out.update({k: (v, source) for k, v in _sharing(hostvars, at, profiles_at).items()})
    exporter = exporter_enabled(hostvars.get(OPERATOR_VALUES))
    if exporter is not None and "gpu_nodes" in groups:
        out["monitoring.dcgm_exporter"] = (exporter, where(OPERATOR_VALUES)[1])
    value = hostvars.get(TENANTS)
    if value is not None and not _templated(value):
        from provisioner.tenants import operator_namespace, parse_tenants

        at, source = where(TENANTS)
        tenants = parse_tenants(value, at, operator_namespace(hostvars))
        if tenants:
            out["tenants.quota"] = (tenants, source)
    return out


def apply(exp: Any, found: Mapping[str, tuple[Any, str]]) -> None:
    """Set on `exp` what the inventory declares, for the key groups the policy left unset."""
    from provisioner.policy import KEYS

    for group in GROUPS:
        if any(k in exp.sources for k in group):
            continue
        for key in group:
            if key in found:
                value, source = found[key]
                setattr(exp, KEYS[key].field, value)
                exp.sources[key] = source
