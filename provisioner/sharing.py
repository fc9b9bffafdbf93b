"""GPU sharing profiles: the NVIDIA device plugin's configuration (`version: v1`), checked before use.

The device plugin reads its config with a lenient YAML decoder (sigs.k8s.io/yaml): a key it does not
know, such as `timeslicing` for `timeSlicing`, is dropped without a word and the GPUs are not shared.
gpuprov reads the same format strictly. The rules follow the plugin's own decoder (NVIDIA
k8s-device-plugin, api/config/v1: config.go, sharing.go, replicas.go, resources.go, consts.go):

- `version` is `v1` (or absent); the top-level keys are flags, resources, sharing, imex;
- `sharing` holds `timeSlicing` and/or `mps`, each with `renameByDefault` and
  `failRequestsGreaterThanOne` (booleans) and a non-empty `resources` list;
- a resource has a `name` (a Kubernetes resource name; `nvidia.com/` is added when missing; at most 63
  characters in all), an optional `rename`, `devices` (`all`, a count > 0, or a list of GPU indices,
  MIG indices `gpu:mig` or GPU/MIG UUIDs; `all` when absent) and `replicas`, at least 2 (the plugin's
  rule) and at most 1024 (gpuprov's, as for the policy key gpu.sharing.replicas: a GPU advertised as
  thousands of devices is a typo);
- every value has the type the plugin's decoder wants: anything else is refused naming the key, what
  was expected and what was given;
- when both are set the plugin uses MPS; gpuprov refuses the ambiguity instead;
- a renamed resource is `<name>.shared` under renameByDefault.

MPS is refused on MIG-enabled GPUs (the plugin's MPS daemon shares whole GPUs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.hostnumbers import is_index
from provisioner.yamlfile import described, load_strict

PREFIX = "nvidia.com"
MAX_RESOURCE_NAME = 63
SHARED_SUFFIX = ".shared"
TOP_KEYS = {"version", "flags", "resources", "sharing", "imex"}
SHARING_KEYS = {"timeSlicing", "mps"}
REPLICATED_KEYS = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
RESOURCE_KEYS = {"name", "rename", "devices", "replicas"}
MIN_REPLICAS = 2
MAX_REPLICAS = 1024
# GPU and MIG indices are nvidia-smi's (provisioner.hostnumbers.is_index); a count of devices is bounded
# by the same number.
MAX_DEVICES = 4096

# Kubernetes' DNS subdomain (k8s.io/apimachinery validation.IsDNS1123Subdomain), the plugin's check.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# Indices in ASCII digits only: \d would take other scripts' digits ("٣"), which the plugin does not.
_INDEX = "[0-9]{1,4}"
_DEVICE_REF = re.compile(
    rf"{_INDEX}|{_INDEX}:{_INDEX}|GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/{_INDEX}/{_INDEX}"
)


@dataclass(frozen=True)
class SharedResource:
    name: str  # full name, e.g. nvidia.com/gpu
    rename: str  # the advertised name when renamed ("" = same name)
    devices: str | int | tuple[str, ...]  # "all", a count, or device references
    replicas: int

    @property
    def advertised(self) -> str:
        return self.rename or self.name


@dataclass(frozen=True)
class SharingConfig:
    strategy: str  # none | time-slicing | mps
    resources: tuple[SharedResource, ...]
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False

    def allocatable(self, gpus: int, resource: str = f"{PREFIX}/gpu") -> dict[str, int]:
        """What a node with `gpus` whole GPUs advertises for `resource` (replicas of every GPU the
        entry covers; an entry for some devices replicates those only)."""
        for r in self.resources:
            if r.name != resource:
                continue
            if r.devices == "all":
                shared = gpus
            elif isinstance(r.devices, int):
                shared = min(r.devices, gpus)
            else:
                shared = len({d for d in r.devices if not is_index(d) or int(d) < gpus})
            out = {r.advertised: shared * r.replicas}
            if r.rename and gpus - shared:
                out[resource] = gpus - shared
            elif gpus - shared:
                out[r.advertised] += gpus - shared
            return out
        return {resource: gpus}


def _resource_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(
            f"{where}: expected a resource name such as gpu or nvidia.com/gpu, got {described(value)}"
        )
    full = value if value.startswith(PREFIX + "/") else f"{PREFIX}/{value}"
    if len(full) > MAX_RESOURCE_NAME:
        raise InputError(f"{where}: {full!r} is longer than {MAX_RESOURCE_NAME} characters")
    _, _, name = full.partition("/")
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise InputError(
            f"{where}: {value!r} is not a Kubernetes resource name (lower case, digits, '-', '.')"
        )
    return full


def _devices(value: Any, where: str) -> str | int | tuple[str, ...]:
    if value is None or value == "all":
        return "all"
    if isinstance(value, bool):
        raise InputError(f"{where}: expected all, a count or a list of devices, got {described(value)}")
    if isinstance(value, int):
        if not 0 < value <= MAX_DEVICES:
            raise InputError(
                f"{where}: a count of devices must be more than 0 and at most {MAX_DEVICES}, got {value}"
            )
        return value
    if isinstance(value, str):
        raise InputError(f"{where}: {value[:40]!r}: the only word allowed is all")
    if isinstance(value, list) and value:
        refs: list[str] = []
        for i, d in enumerate(value):
            ref = str(d) if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else d
            if not isinstance(ref, str) or not _DEVICE_REF.fullmatch(ref) or not _indices_ok(ref):
                raise InputError(
                    f"{where}[{i}]: {str(d)[:60]!r} is no GPU index, MIG index (gpu:mig) or GPU/MIG UUID"
                )
            refs.append(ref)
        return tuple(refs)
    raise InputError(f"{where}: expected all, a count or a list of devices, got {described(value)}")


def _indices_ok(ref: str) -> bool:
    """Every GPU or MIG index in a device reference (3, 3:1) is one nvidia-smi could print."""
    parts = ref.split(":") if not ref.startswith(("GPU-", "MIG-")) else []
    return all(is_index(p) for p in parts)


def _bool(doc: Mapping[str, Any], key: str, where: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise InputError(f"{where}.{key}: expected true or false, got {described(value)}")
    return value


def _unknown(doc: Mapping[str, Any], known: set[str], where: str) -> None:
    extra = sorted(str(k) for k in doc if k not in known)
    if extra:
        hint = next((k for k in known if k.lower() == extra[0].lower()), None)
        did = f" (did you mean {hint}?)" if hint else ""
        raise InputError(
            f"{where}: unknown key {extra[0]!r}{did}; "
            "the device plugin would ignore it and not share the GPUs"
        )


def _replicated(doc: Any, where: str) -> tuple[bool, bool, tuple[SharedResource, ...]]:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: expected a mapping, got {described(doc)}")
    _unknown(doc, REPLICATED_KEYS, where)
    rename_default = _bool(doc, "renameByDefault", where)
    fail_gt_one = _bool(doc, "failRequestsGreaterThanOne", where)
    items = doc.get("resources")
    if items is None or items == []:
        raise InputError(f"{where}.resources: no resources specified")
    if not isinstance(items, list):
        raise InputError(f"{where}.resources: expected a list of resources, got {described(items)}")
    out: list[SharedResource] = []
    for i, item in enumerate(items):
        w = f"{where}.resources[{i}]"
        if not isinstance(item, dict):
            raise InputError(f"{w}: expected a mapping, got {described(item)}")
        _unknown(item, RESOURCE_KEYS, w)
        if "name" not in item:
            raise InputError(f"{w}: no resource name specified")
        name = _resource_name(item["name"], f"{w}.name")
        rename = _resource_name(item["rename"], f"{w}.rename") if item.get("rename") else ""
        if not rename and rename_default:
            rename = name + SHARED_SUFFIX
        replicas = item.get("replicas")
        if "replicas" not in item:
            raise InputError(f"{w}: no replicas specified")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            bounds = f"{MIN_REPLICAS}-{MAX_REPLICAS}"
            raise InputError(
                f"{w}.replicas: expected a whole number of replicas ({bounds}), got {described(replicas)}"
            )
        if replicas < MIN_REPLICAS:
            raise InputError(f"{w}.replicas: number of replicas must be >= {MIN_REPLICAS}, got {replicas}")
        if replicas > MAX_REPLICAS:
            raise InputError(
                f"{w}.replicas: {replicas} is more than {MAX_REPLICAS} replicas per GPU "
                f"(the policy key gpu.sharing.replicas allows {MIN_REPLICAS}-{MAX_REPLICAS})"
            )
        out.append(SharedResource(name, rename, _devices(item.get("devices"), f"{w}.devices"), replicas))
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"{where}.resources: {dup} is listed twice")
    return rename_default, fail_gt_one, tuple(out)


def parse_config(text: str, path: Path | str) -> SharingConfig:
    """A device plugin config file; InputError naming the file and the key path."""
    doc = load_strict(text, path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: a device plugin config is a mapping (version: v1, sharing: ...)")
    return parse_document(doc, str(path))


def parse_document(doc: Mapping[str, Any], where: str) -> SharingConfig:
    version = doc.get("version", "v1")
    if version != "v1":
        raise InputError(f"{where}: version: unknown version {version!r} (the device plugin reads v1)")
    _unknown(doc, TOP_KEYS, where)
    for key in ("flags", "resources", "imex"):
        if key in doc and not isinstance(doc[key], dict):
            raise InputError(f"{where}: {key}: expected a mapping, got {described(doc[key])}")
    sharing = doc.get("sharing")
    if sharing is None:
        sharing = {}
    if not isinstance(sharing, dict):
        raise InputError(
            f"{where}: sharing: expected a mapping with timeSlicing or mps, got {described(sharing)}"
        )
    _unknown(sharing, SHARING_KEYS, f"{where}: sharing")
    if "timeSlicing" in sharing and "mps" in sharing:
        raise InputError(
            f"{where}: sharing: both timeSlicing and mps are set; the device plugin would use MPS only"
        )
    for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        if key in sharing:
            rbd, fail, resources = _replicated(sharing[key], f"{where}: sharing.{key}")
            if strategy == "mps":
                fail = True if "failRequestsGreaterThanOne" not in sharing[key] else fail
            return SharingConfig(strategy, resources, rbd, fail)
    return SharingConfig("none", ())


def check_against_mig(config: SharingConfig, mig_enabled: bool, where: str) -> None:
    """MPS shares whole GPUs: refused where MIG is enabled."""
    if config.strategy == "mps" and mig_enabled:
        raise InputError(f"{where}: MPS cannot share MIG-enabled GPUs; use time-slicing or a MIG layout")
