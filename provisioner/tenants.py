"""GPU tenants: the inventory knob `gpuprov_tenants`, read strictly.

A tenant is a namespace with a GPU quota. The knob is a list (an all-hosts variable):

    gpuprov_tenants:
      - name: research            # required; a Kubernetes namespace name (DNS-1123 label)
        namespace: research-gpu   # default: name
        gpus: 8                   # ResourceQuota hard requests.nvidia.com/gpu
        mig: {1g.18gb: 14}        # ResourceQuota hard requests.nvidia.com/mig-<profile>
        max_gpus_per_pod: 2       # LimitRange max nvidia.com/gpu per container
        node_pool: h200           # namespace pinned to nodes labelled gpuprov.io/pool=<node_pool>

`parse_tenants(value, where, operator_namespace=...)` returns the tenants or raises InputError naming
`where` (the file and the key) and the element; both the role-settings validation and verification call
it, so a shape is refused the same way wherever it is read.

A tenant's namespace is never one the cluster runs itself in: kube-system, kube-public, kube-node-lease,
default, nor the GPU Operator's (gpu_operator_namespace). A quota or a node pool there would bind the
cluster's own pods (kube-proxy, CoreDNS, the operator's DaemonSets) to the tenant's GPUs and nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import InputError
from provisioner.yamlfile import described

KNOB = "gpuprov_tenants"
KEYS = ("name", "namespace", "gpus", "mig", "max_gpus_per_pod", "node_pool")
# The label a node pool's nodes carry, and what a tenant's namespace pins its pods to.
POOL_LABEL = "gpuprov.io/pool"
# A namespace name is a DNS-1123 label (k8s.io/apimachinery validation.IsDNS1123Label).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A MIG profile a quota can name: requests.nvidia.com/mig-<profile> must be a Kubernetes resource name,
# which has no '+' (so media-extension profiles such as 1g.18gb+me cannot be quota'd by name).
_MIG_PROFILE = re.compile(r"[1-7]g\.[0-9]+gb")
# A label value (k8s.io/apimachinery validation.IsValidLabelValue), for the pool name.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
MAX_GPUS = 100_000
# Namespaces Kubernetes keeps for itself (kubeadm and the API server create them).
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "default")
# The GPU Operator's namespace when the inventory does not set gpu_operator_namespace (the gpu_operator
# role's default).
DEFAULT_OPERATOR_NAMESPACE = "gpu-operator"


@dataclass(frozen=True)
class Tenant:
    name: str
    namespace: str
    gpus: int | None = None
    mig: Mapping[str, int] = field(default_factory=dict)
    max_gpus_per_pod: int | None = None
    node_pool: str | None = None

    def quota(self) -> dict[str, int]:
        """The ResourceQuota hard limits this tenant declares: resource name → count."""
        hard = {"requests.nvidia.com/gpu": self.gpus} if self.gpus is not None else {}
        hard.update({f"requests.nvidia.com/mig-{p}": n for p, n in sorted(self.mig.items())})
        return hard


def _count(value: Any, where: str, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_GPUS:
        raise InputError(
            f"{where}: expected a whole number from {least} to {MAX_GPUS}, got {described(value)}"
        )
    return value


def _reserved_problem(namespace: str, operator_namespace: str | None) -> str | None:
    if namespace in SYSTEM_NAMESPACES:
        return f"{namespace!r} is Kubernetes' own namespace"
    if namespace == operator_namespace:
        return f"{namespace!r} is the GPU Operator's namespace (gpu_operator_namespace)"
    return None


def _tenant(raw: Any, where: str, operator_namespace: str | None) -> Tenant:
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping (keys: {', '.join(KEYS)}), got {described(raw)}")
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(KEYS)})")
    name = raw.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        raise InputError(
            f"{where}.name: expected a namespace-style name (a-z, 0-9, '-'), got {described(name)}"
        )
    namespace = raw.get("namespace", name)
    if not isinstance(namespace, str) or not _DNS_LABEL.fullmatch(namespace):
        raise InputError(
            f"{where}.namespace: expected a Kubernetes namespace name, got {described(namespace)}"
        )
    if why := _reserved_problem(namespace, operator_namespace):
        key = "namespace" if "namespace" in raw else "name"
        raise InputError(
            f"{where}.{key}: {why}: a tenant's quota and node pool there would bind the cluster's own pods; "
            "give the tenant a namespace of its own"
        )
    gpus = _count(raw["gpus"], f"{where}.gpus") if raw.get("gpus") is not None else None
    mig_raw = raw.get("mig")
    mig_raw = {} if mig_raw is None else mig_raw
    if not isinstance(mig_raw, Mapping):
        raise InputError(f"{where}.mig: expected a mapping of MIG profile → count, got {described(mig_raw)}")
    mig: dict[str, int] = {}
    for profile, count in mig_raw.items():
        if not isinstance(profile, str) or not _MIG_PROFILE.fullmatch(profile):
            raise InputError(f"{where}.mig: {profile!r} is not a MIG profile such as 1g.18gb")
        mig[profile] = _count(count, f"{where}.mig.{profile}")
    if gpus is None and not mig:
        raise InputError(f"{where}: declares no quota: give gpus, mig or both")
    per_pod = raw.get("max_gpus_per_pod")
    if per_pod is not None:
        per_pod = _count(per_pod, f"{where}.max_gpus_per_pod", least=1)
        if gpus is not None and per_pod > gpus:
            raise InputError(f"{where}.max_gpus_per_pod: {per_pod} is more than the tenant's gpus ({gpus})")
    pool = raw.get("node_pool")
    if pool is not None and (not isinstance(pool, str) or not _LABEL_VALUE.fullmatch(pool)):
        raise InputError(
            f"{where}.node_pool: expected a node pool name (a label value), got {described(pool)}"
        )
    return Tenant(name, namespace, gpus, mig, per_pod, pool)


def operator_namespace(hostvars: Mapping[str, Any]) -> str | None:
    """The GPU Operator's namespace a host's variables give (gpu_operator_namespace, else the role's
    default); None when it is left to a template."""
    value = hostvars.get("gpu_operator_namespace")
    if value is None:
        return DEFAULT_OPERATOR_NAMESPACE
    return str(value) if not (isinstance(value, str) and "{" in value) else None


def parse_tenants(
    value: Any, where: str, operator_namespace: str | None = DEFAULT_OPERATOR_NAMESPACE
) -> tuple[Tenant, ...]:
    """The tenants of a `gpuprov_tenants` value; InputError naming `where` and the element. No tenant
    may live in a namespace of the cluster's own, `operator_namespace` included (None: not known, as
    when the inventory leaves it to a template)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(
            f"{where}: expected a list of tenants (- name: ..., gpus: ...), got {described(value)}"
        )
    tenants = tuple(_tenant(item, f"{where}[{i}]", operator_namespace) for i, item in enumerate(value))
    for attr in ("name", "namespace"):
        seen: set[str] = set()
        for i, t in enumerate(tenants):
            key = getattr(t, attr)
            if key in seen:
                raise InputError(f"{where}[{i}].{attr}: {key!r} is declared twice")
            seen.add(key)
    return tenants
