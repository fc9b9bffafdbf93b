"""GPU tenants: each declared tenant's namespace, quota, limit range and node pool, on the control plane."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

from provisioner.checks.model import FAIL, PASS, SKIP, Finding, Unavailable, check, outcome
from provisioner.expectations import Expectations
from provisioner.hosttext import short_safe_text
from provisioner.probes import kubernetes
from provisioner.probes.base import HostFacts
from provisioner.probes.kubernetes import KUBE_TENANTS, Cluster
from provisioner.tenants import POOL_LABEL, Tenant

# Namespace annotations that pin a namespace's pods to a node pool: the PodNodeSelector admission plugin
# merges the node selector into every pod, PodTolerationRestriction adds the default tolerations
# (Kubernetes, "Admission Control in Kubernetes": PodNodeSelector, PodTolerationRestriction). Both plugins
# must be enabled on the API server for the annotations to take effect.
NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"
GPU_RESOURCE = "nvidia.com/gpu"

# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a decimal number with an SI or binary
# suffix. GPU counts are whole numbers; the suffixes are accepted so that "2k" or "4000m" compare right.
# ASCII digits, as many as a Quantity holds (its int64 and nine decimals): other scripts' digits and
# thousands of digits are no quantity.
_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:[0-9]{1,19}(?:\.[0-9]{0,9})?|\.[0-9]{1,9}))(?P<suffix>[munkMGTPE]|Ki|Mi|Gi|Ti|Pi|Ei)?"
)
_SCALE = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


def quantity(value: Any) -> Fraction | None:
    """A quantity's value, or None when it is not one."""
    m = _QUANTITY.fullmatch(str(value).strip()) if isinstance(value, str | int) else None
    if not m:
        return None
    return Fraction(m["num"]) * _SCALE[m["suffix"] or ""]


def _shown(value: Fraction | None) -> str:
    if value is None:
        return "?"
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def _mapping(obj: Any, *path: str) -> dict[str, Any]:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if isinstance(obj, dict) else {}


def _quota_problems(tenant: Tenant, cluster: Cluster, usage: list[str]) -> list[str]:
    """The quota's hard limits against the declared ones; `usage` gets used/hard per resource."""
    quotas = cluster.quotas.get(tenant.namespace, [])
    problems = []
    for resource, want in tenant.quota().items():
        # Every ResourceQuota of a namespace applies: the lowest hard limit is the one that holds.
        holding = [
            (quantity(_mapping(q, "spec", "hard").get(resource)), _mapping(q, "status", "used").get(resource))
            for q in quotas
            if resource in _mapping(q, "spec", "hard")
        ]
        if not holding:
            problems.append(f"no ResourceQuota sets {resource} (declared {want})")
            continue
        if any(hard is None for hard, _ in holding):
            problems.append(f"a ResourceQuota's {resource} is not a quantity")
            continue
        hard, used = min(holding, key=lambda pair: pair[0])  # type: ignore[arg-type, return-value]
        usage.append(
            f"{resource} {_shown(quantity(used) if used is not None else Fraction(0))}/{_shown(hard)}"
        )
        if hard != want:
            problems.append(f"{resource} hard {_shown(hard)}, declared {want}")
    return problems


def _limit_problems(tenant: Tenant, cluster: Cluster) -> list[str]:
    if tenant.max_gpus_per_pod is None:
        return []
    maxima = [
        quantity(limit["max"][GPU_RESOURCE])
        for lr in cluster.limit_ranges.get(tenant.namespace, [])
        for limit in _mapping(lr, "spec").get("limits") or []
        if isinstance(limit, dict)
        and limit.get("type") in ("Container", "Pod")
        and GPU_RESOURCE in _mapping(limit, "max")
    ]
    if not maxima:
        return [f"no LimitRange sets max {GPU_RESOURCE} (declared {tenant.max_gpus_per_pod} per pod)"]
    if any(m is None for m in maxima):
        return [f"a LimitRange's max {GPU_RESOURCE} is not a quantity"]
    lowest = min(m for m in maxima if m is not None)
    if lowest != tenant.max_gpus_per_pod:
        return [f"LimitRange max {GPU_RESOURCE} {_shown(lowest)}, declared {tenant.max_gpus_per_pod} per pod"]
    return []


def _pool_problems(tenant: Tenant, annotations: dict[str, Any]) -> list[str]:
    if tenant.node_pool is None:
        return []
    problems = []
    selector = str(annotations.get(NODE_SELECTOR_ANNOTATION) or "")
    pairs = dict(part.strip().partition("=")[::2] for part in selector.split(",") if part.strip())
    if pairs.get(POOL_LABEL) != tenant.node_pool:
        shown = short_safe_text(selector, 80) if selector else "unset"
        problems.append(f"{NODE_SELECTOR_ANNOTATION} is {shown}, expected {POOL_LABEL}={tenant.node_pool}")
    raw = annotations.get(TOLERATIONS_ANNOTATION)
    try:
        tolerations = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        tolerations = None
    if not isinstance(tolerations, list):
        problems.append(f"{TOLERATIONS_ANNOTATION} is {'not a JSON list' if raw else 'unset'}")
    elif not any(
        isinstance(t, dict)
        and t.get("key") == POOL_LABEL
        and (t.get("operator") == "Exists" or t.get("value") == tenant.node_pool)
        for t in tolerations
    ):
        problems.append(f"{TOLERATIONS_ANNOTATION} has no toleration for {POOL_LABEL}={tenant.node_pool}")
    return problems


@check("tenants.quota", probes=(KUBE_TENANTS,), severity="medium")
def tenants_quota(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """each declared GPU tenant has its namespace, GPU ResourceQuota, LimitRange and node pool"""
    if not exp.tenants:
        raise Unavailable(
            SKIP, "no tenants declared (tenants.quota in a policy, gpuprov_tenants in the inventory)"
        )
    cluster = kubernetes.tenant_objects(facts)
    where = exp.source("tenants.quota")
    findings: list[Finding] = []
    for tenant in exp.tenants:
        who = f"tenant {tenant.name}" + (
            f" (namespace {tenant.namespace})" if tenant.namespace != tenant.name else ""
        )
        namespace = cluster.namespaces.get(tenant.namespace)
        if namespace is None:
            findings.append(outcome(FAIL, f"{who}: namespace {tenant.namespace} does not exist ({where})"))
            continue
        usage: list[str] = []
        problems = _quota_problems(tenant, cluster, usage)
        problems += _limit_problems(tenant, cluster)
        problems += _pool_problems(tenant, _mapping(namespace, "metadata", "annotations"))
        used = f" [{', '.join(usage)} used/hard]" if usage else ""
        if problems:
            findings.append(
                outcome(FAIL, f"{who}: {'; '.join(problems)}{used} ({where})", tenant=tenant.name)
            )
        else:
            findings.append(outcome(PASS, f"{who}: quota as declared{used}", tenant=tenant.name, usage=usage))
    return findings
