"""Settings validation before any host is touched.

The roles' knobs are declared once, in each role's `meta/argument_specs.yml`. Ansible checks them too,
but only once a play has started on the hosts (facts gathered, connections open). gpuprov reads the same
specs and checks every role-prefixed variable the inventory gives each selected host first, with
Ansible's own ArgumentSpecValidator (types, choices, list elements): unknown keys (typos that would
silently fall back to a default), wrong types and values outside `choices` are bad input (exit 2) and the
error names the file and the key. What the specs cannot say is in "rules beyond argument_specs" below.
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
from provisioner.yamlfile import described, yaml_kind

# Knobs shared by several roles (docs/contracts.md).
GLOBAL_KNOBS: dict[str, str] = {
    "gpuprov_mirror_url": "str",
    "gpuprov_mirror_key_url": "str",
    "gpuprov_mirror_key_fingerprint": "str",
    "gpuprov_registry_mirror_url": "str",
    "gpuprov_reboot_allowed": "bool",
    # GPU sharing, MIG and tenants (roles gpu_operator and gpu_tenants); checked further by
    # _gpu_setting_problems below.
    "gpuprov_mig_config": "str",
    "gpuprov_mig_strategy": "str",
    "gpuprov_mig_custom_configs": "dict",
    "gpuprov_gpu_sharing_profiles": "dict",
    "gpuprov_gpu_sharing": "str",
    "gpuprov_tenants": "list",
    "gpuprov_node_pool": "str",
}
_GLOBAL = "gpuprov"  # the validator of GLOBAL_KNOBS, next to the roles' own


@dataclass(frozen=True)
class Knob:
    role: str
    name: str
    type: str = "str"
    choices: tuple[Any, ...] = ()
    elements: str | None = None

    def argument_spec(self) -> dict[str, Any]:
        """This knob as ArgumentSpecValidator takes it: type, choices, elements. Not `required` nor
        `default`: the inventory overrides some knobs and leaves the rest to the role's defaults (and a
        helper role's required options come from the role that includes it), so only the knobs it sets
        are checked."""
        spec: dict[str, Any] = {"type": self.type}
        if self.choices:
            spec["choices"] = list(self.choices)
        if self.elements:
            spec["elements"] = self.elements
        return spec


@dataclass
class RoleSpecs:
    """The knobs of every role, by name, the role prefixes that claim a variable, and one
    ArgumentSpecValidator per role (built once, used for every host)."""

    knobs: dict[str, Knob] = field(default_factory=dict)
    prefixes: dict[str, str] = field(default_factory=dict)  # "nvidia_driver_" -> "nvidia_driver"
    _validators: dict[str, Any] = field(default_factory=dict, repr=False)
    # (role, repr of the knobs a host sets) -> problems: a fleet's hosts mostly share their group_vars
    _checked: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict, repr=False)
    # repr of a host's GPU sharing/MIG/tenant knobs -> their problems (the same for most of a fleet)
    _gpu_checked: dict[str, list[tuple[str, str]]] = field(default_factory=dict, repr=False)

    def owner(self, var: str) -> str | None:
        """The role whose prefix the variable carries (longest prefix wins)."""
        best = None
        for prefix, role in self.prefixes.items():
            if var.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
                best = (prefix, role)
        return best[1] if best else None

    def knob(self, role: str, name: str) -> Knob | None:
        if role == _GLOBAL:
            kind = GLOBAL_KNOBS.get(name)
            return None if kind is None else Knob(role=_GLOBAL, name=name, type=kind)
        knob = self.knobs.get(name)
        return knob if knob is not None and knob.role == role else None

    def validator(self, role: str) -> Any:
        """The role's ArgumentSpecValidator (GLOBAL_KNOBS' for "gpuprov"), built on first use."""
        validator = self._validators.get(role)
        if validator is None:
            from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

            if role == _GLOBAL:
                knobs = [Knob(role=_GLOBAL, name=n, type=t) for n, t in GLOBAL_KNOBS.items()]
            else:
                knobs = [k for k in self.knobs.values() if k.role == role]
            validator = ArgumentSpecValidator({k.name: k.argument_spec() for k in knobs})
            self._validators[role] = validator
        return validator


@cache
def load_role_specs(roles_dir: Path = ROLES_DIR) -> RoleSpecs:
    """Read every role's argument specs. A role's entry points (main, upgrade, ...) share one validator:
    the inventory sets a knob for the role, whichever entry point runs."""
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
    for role in [*sorted(set(specs.prefixes.values())), _GLOBAL]:
        specs.validator(role)
    return specs


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


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
    comment = re.compile(r"(^|\s)[#;].*$", re.MULTILINE)  # YAML and INI comments set nothing
    for path in candidates:
        try:
            if pattern.search(comment.sub("", path.read_text(errors="replace"))):
                return str(path)
        except OSError:
            continue
    return str(inventory)


# ------------------------------------------------------------------------ rules beyond argument_specs
# Everything gpuprov checks that a role's meta/argument_specs.yml cannot say (Ansible's spec language
# has types, choices, elements and required: no patterns, no ranges, no rule across two knobs) lives
# here, and only here. (ansible_port's 1-65535 is Ansible's connection variable, not a role knob: it is
# checked where the inventory is read, provisioner.inventory.)
#
# 1. YAML_SHAPES: what a value must already be in the inventory, per spec type. ArgumentSpecValidator
#    *converts* ("a,b" -> ["a", "b"], "k=v" -> {"k": "v"}, [1] -> "[1]", true -> "True"), but the role
#    never gets the converted value: it reads the variable as the inventory wrote it, and would loop over
#    the letters of "nvidia". So a list must be a YAML list, a mapping a mapping, a str a scalar (numbers
#    print as written: branch: 580). Which scalars fit (is "maybe" a boolean, "many" an int) is left to
#    ArgumentSpecValidator, which reads them as Ansible does. Types not listed ("raw") take anything.
YAML_SHAPES: dict[str, tuple[str, ...]] = {
    "str": ("string", "integer", "number"),
    "path": ("string",),
    "bool": ("boolean", "string"),
    "int": ("integer", "string"),
    "float": ("integer", "number"),
    "list": ("list",),
    "dict": ("mapping",),
}

# 2. VALUE_FORMATS: patterns the roles assert only once connected (roles/nvidia_driver/vars/main.yml,
#    __nvidia_driver_argument_checks): the same patterns, checked before any host is touched.
VALUE_FORMATS: dict[str, tuple[str, str]] = {
    "nvidia_driver_branch": (r"[0-9]{3}", 'a driver branch like "580"'),
    "nvidia_driver_version": (r"[0-9]{3}\.[0-9]+(\.[0-9]+)?", 'a full driver version like "580.159.04"'),
    "nvidia_driver_package_revision": (r"(-[0-9A-Za-z.+~]+)?", 'empty or a revision like "-1"'),
}


def _shape_problem(knob: Knob, value: Any) -> str | None:
    shapes = YAML_SHAPES.get(knob.type)
    if shapes is None or value is None or yaml_kind(value) in shapes:
        return None
    return _expected(knob.type, value)


def _format_problem(key: str, value: Any) -> str | None:
    fmt = VALUE_FORMATS.get(key)
    if fmt is None or value is None or _templated(value) or isinstance(value, bool):
        return None
    if not re.fullmatch(fmt[0], str(value)):
        return f"{str(value)[:80]!r} must be {fmt[1]}"
    return None


# 3. Rules across knobs: (knob, why) for each one broken.
def _cross_key_problems(hostvars: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
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
        problems.append(
            ("nvidia_driver_version", f"{version} is not in branch {branch} (nvidia_driver_branch)")
        )
    return problems


# 4. GPU sharing, MIG and tenants: documents inside knobs, read with the strict parsers the product
#    uses elsewhere (provisioner.sharing for device plugin configs, provisioner.mig for mig-parted
#    configs). A device plugin config with a misspelt key is silently ignored by the plugin, and MPS on
#    a MIG-enabled GPU fails on the node only; both are refused here, before any host is touched.
MIG_STRATEGIES = ("single", "mixed")
NO_SHARING = "none"  # the device plugin config every GPU host gets unless gpuprov_gpu_sharing names one
# A Kubernetes label value (k8s.io/apimachinery validation.IsValidLabelValue): MIG config names, sharing
# profile names and pool names end up as node label values.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _label_value_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
        return (
            f"{str(value)[:80]!r} is no Kubernetes label value (letters, digits, '-', '_', '.'; 63 at most)"
        )
    return None


def _mig_configs(hostvars: dict[str, Any]) -> dict[str, Any]:
    """gpuprov_mig_custom_configs parsed by mig-parted's rules (config name → entries); InputError."""
    from provisioner import mig

    custom = hostvars.get("gpuprov_mig_custom_configs")
    if not isinstance(custom, dict) or _templated(custom):
        return {}
    configs = mig.parse_config(yaml.safe_dump(_plain(custom)), "gpuprov_mig_custom_configs")
    for name in configs:
        if why := _label_value_problem(name):
            raise InputError(f"gpuprov_mig_custom_configs: mig-configs.{why}")
    # A layout no GPU could hold is refused here, with the profile tables gpuprov has, instead of by
    # `mig apply` once connected or by the MIG manager on the node.
    unholdable = mig.offline_problems(configs)
    if unholdable:
        more = f" (and {len(unholdable) - 1} more)" if len(unholdable) > 1 else ""
        raise InputError(f"gpuprov_mig_custom_configs: {unholdable[0]}{more}")
    return configs


def _mig_enabled(config_name: Any, custom: dict[str, Any]) -> bool:
    """Whether the host's MIG config turns MIG on: NVIDIA's `all-disabled` and a custom config whose
    entries all say mig-enabled: false do not; every other config name does (NVIDIA's defaults
    all-enabled, all-1g.18gb, all-balanced, ...)."""
    if config_name in (None, "", "all-disabled"):
        return False
    entries = custom.get(str(config_name))
    return any(e.enabled for e in entries) if entries is not None else True


def _sharing_profiles(hostvars: dict[str, Any]) -> dict[str, Any]:
    """gpuprov_gpu_sharing_profiles parsed strictly (name → SharingConfig); InputError naming the key."""
    from provisioner import sharing

    profiles = hostvars.get("gpuprov_gpu_sharing_profiles")
    if not isinstance(profiles, dict):
        return {}
    parsed = {}
    for name, doc in _plain(profiles).items():
        where = f"gpuprov_gpu_sharing_profiles.{name}"
        if name == NO_SHARING:
            raise InputError(
                f"{where}: {NO_SHARING} is gpuprov's own profile (no sharing); pick another name"
            )
        if why := _label_value_problem(name):
            raise InputError(f"{where}: {why}")
        if not isinstance(doc, dict):
            raise InputError(f"{where}: a device plugin config is a mapping (version: v1, sharing: ...)")
        parsed[name] = sharing.parse_document(doc, where)
    return parsed


def _gpu_setting_problems(hostvars: dict[str, Any]) -> list[tuple[str, str]]:
    """(knob, why) for the GPU sharing, MIG and tenant knobs one host gets."""
    problems: list[tuple[str, str]] = []
    values = _gpu_knobs(hostvars)
    if any(_templated(v) for k, v in values.items() if k != "gpu_operator_namespace"):
        return problems  # Ansible's to render; the roles assert what they get
    strategy = values.get("gpuprov_mig_strategy", "single")
    if strategy not in MIG_STRATEGIES:
        problems.append(("gpuprov_mig_strategy", f"{strategy!r} is not one of: {', '.join(MIG_STRATEGIES)}"))
    for key in ("gpuprov_mig_config", "gpuprov_node_pool"):
        if key in values and isinstance(values[key], str) and (why := _label_value_problem(values[key])):
            problems.append((key, why))
    try:
        custom = _mig_configs(values)
    except InputError as exc:
        problems.append(("gpuprov_mig_custom_configs", str(exc)))
        custom = {}
    try:
        profiles = _sharing_profiles(values)
    except InputError as exc:
        problems.append(("gpuprov_gpu_sharing_profiles", str(exc)))
        profiles = None  # already reported: the host's choice is not judged against it
    choice = values.get("gpuprov_gpu_sharing", NO_SHARING)
    if not isinstance(choice, str):
        problems.append(("gpuprov_gpu_sharing", f"expected a profile name, got {described(choice)}"))
    elif profiles is not None and choice != NO_SHARING:
        if choice not in profiles:
            known = ", ".join([NO_SHARING, *sorted(profiles)])
            problems.append(
                ("gpuprov_gpu_sharing", f"{choice!r} is no profile of gpuprov_gpu_sharing_profiles ({known})")
            )
        else:
            from provisioner import sharing

            try:
                where = f"gpuprov_gpu_sharing_profiles.{choice}"
                sharing.check_against_mig(
                    profiles[choice], _mig_enabled(values.get("gpuprov_mig_config"), custom), where
                )
            except InputError as exc:
                config = values.get("gpuprov_mig_config")
                problems.append(("gpuprov_gpu_sharing", f"{exc} (gpuprov_mig_config: {config})"))
    for knob in TENANT_KNOBS:
        if knob not in values:
            continue
        from provisioner.tenants import operator_namespace, parse_tenants

        try:
            tenants = parse_tenants(_plain(values[knob]), knob, operator_namespace(values))
        except InputError as exc:
            problems.append((knob, str(exc)))
            continue
        mig_tenant = next((i for i, t in enumerate(tenants) if t.mig), None)
        if mig_tenant is not None and strategy != "mixed":
            problems.append(
                (
                    knob,
                    f"{knob}[{mig_tenant}].mig: MIG quotas (nvidia.com/mig-<profile>) exist only "
                    "under gpuprov_mig_strategy: mixed; under single MIG devices count as nvidia.com/gpu",
                )
            )
    return problems


_GPU_KNOB_PREFIXES = ("gpuprov_mig_", "gpuprov_gpu_", "gpuprov_tenants", "gpuprov_node_pool")
# The tenant lists: the knob, and the gpu_tenants role's own list, which defaults to it (an inventory
# may set either; both reach the role).
TENANT_KNOBS = ("gpuprov_tenants", "gpu_tenants_list")
# Role knobs the GPU checks read beside GLOBAL_KNOBS: the role's tenant list and the namespace the GPU
# Operator runs in, which no tenant may take.
_GPU_ROLE_KNOBS = ("gpu_tenants_list", "gpu_operator_namespace")


def _gpu_knobs(hostvars: dict[str, Any]) -> dict[str, Any]:
    """The GPU sharing, MIG and tenant settings among a host's variables."""
    names = [k for k in GLOBAL_KNOBS if k.startswith(_GPU_KNOB_PREFIXES)] + list(_GPU_ROLE_KNOBS)
    return {k: hostvars[k] for k in names if k in hostvars}


# ------------------------------------------------------------------------------------ checking a host


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    message: str


def _expected(kind: str, value: Any) -> str:
    """`value` is not of the spec's `kind`, in YAML's words."""
    if kind == "bool":
        return f"expected a boolean, got {value!r}"
    if kind in ("int", "float") and isinstance(value, bool):
        return f"expected {kind}, got {value!r}"
    return f"expected {kind}, got {yaml_kind(value)} {str(value)[:80]!r}"


def _not_a_choice(knob: Knob, value: Any) -> str:
    values = value if isinstance(value, list) else [value]
    bad = [v for v in values if v not in knob.choices and str(v) not in map(str, knob.choices)]
    return f"{(bad or [value])[0]!r} is not one of: {', '.join(map(str, knob.choices))}"


# Which knob each of ArgumentSpecValidator's errors is about (its messages name it; the classes do not).
_ERROR_KEY = re.compile(
    r"argument '(?P<a>[^']+)' is of type"  # ArgumentTypeError
    r"|Elements value for option '(?P<b>[^']+)'"  # ElementError
    r"|value of (?P<c>\S+) must be one"  # ArgumentValueError (choices)
)


def _plain(value: Any) -> Any:
    """`value` without Ansible's tags (its origin, on every string, int, list and dict of an inventory):
    the validator deep-copies what it is given, and copying the tags costs twenty times the check."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    for kind in (bool, str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def _role_problems(role: str, params: dict[str, Any], specs: RoleSpecs) -> dict[str, str]:
    """{knob: why} for the knobs of one role (or the global ones) that one host sets (plain values)."""
    from ansible.module_utils.errors import ArgumentValueError, UnsupportedError

    result = specs.validator(role).validate(params)
    problems: dict[str, str] = {}
    type_errors: dict[str, str] = {}
    value_errors: dict[str, str] = {}
    for error in result.errors.errors:
        if isinstance(error, UnsupportedError):
            continue  # result.unsupported_parameters names them
        match = _ERROR_KEY.search(error.msg)
        key = match and (match["a"] or match["b"] or match["c"])
        if key not in params:  # a wording this Ansible does not use: its own words, then
            problems.setdefault(f"{role}_*", error.msg)
            continue
        target = value_errors if isinstance(error, ArgumentValueError) else type_errors
        target.setdefault(key, type(error).__name__)  # ArgumentTypeError, ElementError
    for key, value in params.items():
        knob = specs.knob(role, key)
        if key in result.unsupported_parameters or knob is None:
            if role == _GLOBAL:
                problems[key] = f"unknown setting (known: {', '.join(GLOBAL_KNOBS)})"
            else:
                near = sorted(k for k in specs.knobs if specs.knobs[k].role == role and _close(k, key))
                hint = f"; did you mean {near[0]}?" if near else ""
                problems[key] = f"unknown setting for role {role}{hint}"
        elif why := _shape_problem(knob, value):
            problems[key] = why
        elif type_errors.get(key) == "ArgumentTypeError":
            problems[key] = _expected(knob.type, value)
        elif key in type_errors and not any(_templated(v) for v in value):  # ElementError
            problems[key] = f"expected a list of {knob.elements}, got {str(value)[:80]}"
        elif why := _format_problem(key, value):
            problems[key] = why
        elif key in value_errors:
            problems[key] = _not_a_choice(knob, value)
    return problems


def check_host_vars(host: str, hostvars: dict[str, Any], specs: RoleSpecs) -> list[Problem]:
    """Problems with one host's role and global knobs."""
    by_role: dict[str, dict[str, Any]] = {}
    for key, value in hostvars.items():
        role = _GLOBAL if key.startswith("gpuprov_") else specs.owner(key)
        if role is None:
            continue
        if _templated(value) and specs.knob(role, key) is not None:
            continue  # a template is Ansible's to render; its result is checked by the role
        by_role.setdefault(role, {})[key] = value
    problems: dict[str, str] = {}
    for role, params in by_role.items():
        plain = _plain(params)
        seen = (role, repr(plain))
        if seen not in specs._checked:
            if len(specs._checked) > 4096:
                specs._checked.clear()
            specs._checked[seen] = _role_problems(role, plain, specs)
        problems.update(specs._checked[seen])
    found = [Problem(host, key, problems[key]) for key in sorted(problems)]
    cross = _cross_key_problems(hostvars) + _version_problems(hostvars, problems)
    gpu = [(k, why) for k, why in _cached_gpu_problems(hostvars, specs) if k not in problems]
    return found + [Problem(host, key, why) for key, why in cross + gpu]


def _version_problems(hostvars: dict[str, Any], known: dict[str, str]) -> list[tuple[str, str]]:
    """The version matrix's verdict (provisioner.versions) on the host's versions; nothing for a knob
    that already has a problem of its own."""
    from provisioner import versions

    if "kubernetes_minor" in known or "gpu_operator_chart_version" in known:
        return []
    return versions.problems(hostvars)


def _cached_gpu_problems(hostvars: dict[str, Any], specs: RoleSpecs) -> list[tuple[str, str]]:
    """_gpu_setting_problems, once per distinct set of values (a fleet shares its group_vars)."""
    relevant = _gpu_knobs(hostvars)
    if not relevant:
        return []
    seen = repr(_plain(relevant))
    if seen not in specs._gpu_checked:
        if len(specs._gpu_checked) > 4096:
            specs._gpu_checked.clear()
        specs._gpu_checked[seen] = _gpu_setting_problems(relevant)
    return specs._gpu_checked[seen]


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
