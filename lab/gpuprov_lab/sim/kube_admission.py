"""Admission of pods by the SIMULATED kube-apiserver (gpuprov lab): the built-in plugins that decide
where GPU workloads may go and how many GPUs a namespace may hold.

Each plugin follows kubernetes/kubernetes v1.33 (paths below are in that repository at tag v1.33.5):

- API defaulting before admission (pkg/apis/core/v1/defaults.go SetDefaults_Pod: a container's request
  defaults to its limit; extended resources such as nvidia.com/gpu may only be set as limits).
- LimitRanger (plugin/pkg/admission/limitranger/admission.go): LimitRange defaulting
  (SetDefaults_LimitRangeItem), type Container default / defaultRequest merged into containers,
  min / max / maxLimitRequestRatio enforced with the real messages.
- DefaultTolerationSeconds (plugin/pkg/admission/defaulttolerationseconds): the not-ready and
  unreachable tolerations a whitelist then has to allow.
- PodNodeSelector (plugin/pkg/admission/podnodeselector/admission.go): the namespace annotation
  scheduler.alpha.kubernetes.io/node-selector merged into the pod's nodeSelector.
- PodTolerationRestriction (plugin/pkg/admission/podtolerationrestriction/admission.go and
  pkg/util/tolerations/tolerations.go): namespace annotations scheduler.alpha.kubernetes.io/
  defaultTolerations (merged) and tolerationsWhitelist (enforced).
- ResourceQuota (plugin/pkg/admission/resourcequota/controller.go checkRequest and
  pkg/quota/v1/evaluator/core/pods.go): pod usage, the "must specify" constraints, "exceeded quota".
  The quota controller (pkg/controller/resourcequota) keeps status.hard/used: :func:`quota_status`.

Plugin configuration files (--admission-control-config-file: cluster-wide default tolerations and
node selectors) are not read: the lab's kubeadm writes none.
"""

from __future__ import annotations

import copy
import json
import re
from fractions import Fraction
from typing import Any

from . import kube_util as u
from .kube_store import ApiError, Obj, Store

# kube-apiserver v1.33 pkg/kubeapiserver/options/plugins.go DefaultOffAdmissionPlugins: everything
# else of AllOrderedPlugins is on unless --disable-admission-plugins names it. These are the ones the
# lab's API server implements, in AllOrderedPlugins order.
ORDERED = (
    "LimitRanger",
    "PodNodeSelector",
    "DefaultTolerationSeconds",
    "PodTolerationRestriction",
    "ResourceQuota",
)
DEFAULT_OFF = {"PodNodeSelector", "PodTolerationRestriction"}
NS_NODE_SELECTOR = "scheduler.alpha.kubernetes.io/node-selector"
NS_DEFAULT_TOLERATIONS = "scheduler.alpha.kubernetes.io/defaultTolerations"
NS_TOLERATIONS_WHITELIST = "scheduler.alpha.kubernetes.io/tolerationsWhitelist"
LIMIT_RANGER_ANNOTATION = "kubernetes.io/limit-ranger"
NATIVE_COMPUTE = ("cpu", "memory", "ephemeral-storage")
# pods.go validationSet: quota on these makes every container state them (a historical coupling).
MUST_SPECIFY = {"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"}


def enabled_plugins(enable: str, disable: str) -> set[str]:
    """The admission plugins in force for --enable-admission-plugins / --disable-admission-plugins."""
    on = {p for p in ORDERED if p not in DEFAULT_OFF}
    on |= {p.strip() for p in enable.split(",") if p.strip()}
    on -= {p.strip() for p in disable.split(",") if p.strip()}
    return on


# ------------------------------------------------------------------------------------ quantities

_QTY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_BIN = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DEC = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class Quantity:
    """resource.Quantity (k8s.io/apimachinery/pkg/api/resource): an exact value and the format it was
    written in (binary or decimal SI), printed the canonical way String() prints it."""

    def __init__(self, value: Fraction, binary: bool = False) -> None:
        self.value, self.binary = value, binary

    @classmethod
    def parse(cls, text: Any) -> Quantity:
        s = str(text).strip()
        m = _QTY.match(s)
        if not m:
            raise ValueError(f"quantities must match the regular expression '{_QTY.pattern}'")
        number, suffix = Fraction(m.group(1)), m.group(2) or ""
        if suffix in _BIN:
            return cls(number * 1024 ** _BIN[suffix], binary=True)
        if suffix[:1] in ("e", "E") and len(suffix) > 1:
            return cls(number * Fraction(10) ** int(suffix[1:]))
        return cls(number * Fraction(10) ** _DEC[suffix])

    def __add__(self, other: Quantity) -> Quantity:
        # Quantity.Add keeps the receiver's format, unless the receiver is zero.
        return Quantity(self.value + other.value, other.binary if self.value == 0 else self.binary)

    def __str__(self) -> str:
        v = self.value
        if v == 0:
            return "0"
        if self.binary and v.denominator == 1 and abs(v) >= 1024:
            n, exp = int(v), 0
            while exp < 6 and n % 1024 == 0:
                n, exp = n // 1024, exp + 1
            if exp:
                return f"{n}{next(k for k, e in _BIN.items() if e == exp)}"
        # Decimal SI: the largest suffix (a multiple of 10^3) that keeps the mantissa whole.
        for suffix, exp in sorted(_DEC.items(), key=lambda kv: -kv[1]):
            scaled = v / Fraction(10) ** exp
            if scaled.denominator == 1 and (exp <= 0 or abs(scaled) >= 1):
                return f"{int(scaled)}{suffix}"
        return f"{int(v * 10**9)}n"


def _q(x: Any) -> Quantity:
    return Quantity.parse(x)


def _sum(a: dict[str, Quantity], b: dict[str, Quantity]) -> dict[str, Quantity]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out else v
    return out


def is_extended(name: str) -> bool:
    """helper.IsExtendedResourceName: domain-qualified, outside kubernetes.io, not a quota prefix."""
    return (
        "/" in name
        and not name.startswith("requests.")
        and not (name.split("/")[0].endswith("kubernetes.io"))
    )


def _forbidden(kind_plural: str, name: str, msg: str) -> ApiError:
    """apierrors.NewForbidden as admission.NewForbidden builds it."""
    return ApiError(
        403,
        "Forbidden",
        f'{kind_plural} "{name}" is forbidden: {msg}',
        {"name": name, "kind": kind_plural},
    )


# ------------------------------------------------------------------------------------ defaulting


def default_requests_from_limits(pod: Obj) -> None:
    """SetDefaults_Pod: a limit without a request makes the request (how nvidia.com/gpu gets one)."""
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        res = c.setdefault("resources", {})
        limits = res.get("limits") or {}
        if not limits:
            continue
        req = res.setdefault("requests", {})
        for k, v in limits.items():
            req.setdefault(k, v)


def default_limit_range(lr: Obj) -> Obj:
    """SetDefaults_LimitRangeItem for type Container: default ← max, defaultRequest ← default ← min."""
    out = copy.deepcopy(lr)
    for item in u.dig(out, "spec", "limits", default=[]) or []:
        if item.get("type") != "Container":
            continue
        default = item.setdefault("default", {})
        default_req = item.setdefault("defaultRequest", {})
        for k, v in (item.get("max") or {}).items():
            default.setdefault(k, v)
        for k, v in default.items():
            default_req.setdefault(k, v)
        for k, v in (item.get("min") or {}).items():
            default_req.setdefault(k, v)
    return out


# ------------------------------------------------------------------------------------ LimitRanger


def limit_ranger_mutate(store: Store, pod: Obj, ns: str) -> None:
    """Default limits/requests of the namespace's Container LimitRanges into containers that lack them,
    and the kubernetes.io/limit-ranger annotation saying what was set (mergeContainerResources)."""
    notes: list[str] = []
    for lr in store.list(store.res("limitranges"), ns):
        lr = default_limit_range(lr)
        for item in u.dig(lr, "spec", "limits", default=[]) or []:
            if item.get("type") != "Container":
                continue
            for kind in ("containers", "initContainers"):
                for c in u.dig(pod, "spec", kind, default=[]) or []:
                    res = c.setdefault("resources", {})
                    limits, requests = res.setdefault("limits", {}), res.setdefault("requests", {})
                    set_req = [k for k in item.get("defaultRequest") or {} if k not in requests]
                    set_lim = [k for k in item.get("default") or {} if k not in limits]
                    for k in set_req:
                        requests[k] = item["defaultRequest"][k]
                    for k in set_lim:
                        limits[k] = item["default"][k]
                    if set_req:
                        notes.append(f"{', '.join(set_req)} request for {_ckind(kind)} {c.get('name')}")
                    if set_lim:
                        notes.append(f"{', '.join(set_lim)} limit for {_ckind(kind)} {c.get('name')}")
                    for key in ("limits", "requests"):
                        if not res[key]:
                            del res[key]
    if notes:
        meta = pod.setdefault("metadata", {})
        meta.setdefault("annotations", {})[LIMIT_RANGER_ANNOTATION] = "LimitRanger plugin set: " + "; ".join(
            notes
        )


def _ckind(kind: str) -> str:
    return "init container" if kind == "initContainers" else "container"


def _min_error(res: str, enforced: Any, req: Any, lim: Any) -> str | None:
    e = _q(enforced)
    if req is None:
        return f"minimum {res} usage per Container is {e}.  No request is specified"
    if _q(req).value < e.value:
        return f"minimum {res} usage per Container is {e}, but request is {_q(req)}"
    if lim is not None and _q(lim).value < e.value:
        return f"minimum {res} usage per Container is {e}, but limit is {_q(lim)}"
    return None


def _max_error(res: str, enforced: Any, req: Any, lim: Any) -> str | None:
    e = _q(enforced)
    if lim is None:
        return f"maximum {res} usage per Container is {e}.  No limit is specified"
    if _q(lim).value > e.value:
        return f"maximum {res} usage per Container is {e}, but limit is {_q(lim)}"
    if req is not None and _q(req).value > e.value:
        return f"maximum {res} usage per Container is {e}, but request is {_q(req)}"
    return None


def _ratio_error(res: str, enforced: Any, req: Any, lim: Any) -> str | None:
    head = f"{res} max limit to request ratio per Container is {_q(enforced)}"
    if req is None or _q(req).value == 0:
        return f"{head}, but no request is specified or request is 0"
    if lim is None or _q(lim).value == 0:
        return f"{head}, but no limit is specified or limit is 0"
    ratio = _q(lim).value / _q(req).value
    if ratio > _q(enforced).value:
        return f"{head}, but provided ratio is {float(ratio):f}"
    return None


def limit_ranger_validate(store: Store, pod: Obj, ns: str, name: str) -> None:
    """PodValidateLimitFunc for type Container; errors joined the way utilerrors.NewAggregate prints."""
    for lr in store.list(store.res("limitranges"), ns):
        errs: list[str] = []
        for item in u.dig(default_limit_range(lr), "spec", "limits", default=[]) or []:
            if item.get("type") != "Container":
                continue
            for kind in ("containers", "initContainers"):
                for c in u.dig(pod, "spec", kind, default=[]) or []:
                    req = u.dig(c, "resources", "requests") or {}
                    lim = u.dig(c, "resources", "limits") or {}
                    for check, key in (
                        (_min_error, "min"),
                        (_max_error, "max"),
                        (_ratio_error, "maxLimitRequestRatio"),
                    ):
                        for res, enforced in (item.get(key) or {}).items():
                            msg = check(res, enforced, req.get(res), lim.get(res))
                            if msg:
                                errs.append(msg)
        if errs:
            raise _forbidden("pods", name, errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")


# ------------------------------------------------------------------------------------ tolerations

DEFAULT_TOLERATION_SECONDS = 300


def default_toleration_seconds(pod: Obj) -> None:
    """DefaultTolerationSeconds: NoExecute tolerations of not-ready and unreachable for 300s."""
    tol = pod.setdefault("spec", {}).setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if any(
            (t.get("key") == key or not t.get("key")) and t.get("effect") in ("NoExecute", "", None)
            for t in tol
        ):
            continue
        tol.append(
            {
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
            }
        )


def _norm(t: Obj) -> Obj:
    """A toleration as the API stores it (operator defaults to Equal)."""
    return {**t, "operator": t.get("operator") or "Equal"}


def is_superset(ss: Obj, t: Obj) -> bool:
    """tolerations.go isSuperset: does toleration ss tolerate everything t does?"""
    ss, t = _norm(ss), _norm(t)
    if ss == t:
        return True
    if t.get("key", "") != ss.get("key", "") and (ss.get("key") or ss["operator"] != "Exists"):
        return False
    if t.get("effect", "") != ss.get("effect", "") and ss.get("effect"):
        return False
    limit = ss.get("tolerationSeconds") if ss.get("effect") == "NoExecute" else None
    if limit is not None and (t.get("tolerationSeconds") is None or t["tolerationSeconds"] > limit):
        return False
    if ss["operator"] == "Equal":
        return t["operator"] == "Equal" and t.get("value", "") == ss.get("value", "")
    return ss["operator"] == "Exists"


def merge_tolerations(first: list[Obj], second: list[Obj]) -> list[Obj]:
    """tolerations.go MergeTolerations: both lists, without the ones another already covers."""
    every = [*first, *second]
    merged: list[Obj] = []
    for i, t in enumerate(every):
        if any(is_superset(m, t) for m in merged):
            continue
        if any(_norm(t) != _norm(t2) and is_superset(t2, t) for t2 in every[i + 1 :]):
            continue
        merged.append(t)
    return merged


def _ns_tolerations(ns_obj: Obj, key: str) -> list[Obj] | None:
    """extractNSTolerations: None when the annotation is absent, [] when it is empty."""
    ann = u.dig(ns_obj, "metadata", "annotations") or {}
    if key not in ann:
        return None
    if not ann[key]:
        return []
    try:
        value = json.loads(ann[key])
    except ValueError as exc:
        raise ApiError(500, "InternalError", f"Internal error occurred: {exc}") from exc
    if not isinstance(value, list):
        raise ApiError(
            500,
            "InternalError",
            "Internal error occurred: json: cannot unmarshal object into Go value of type []v1.Toleration",
        )
    return value


def toleration_restriction(pod: Obj, ns_obj: Obj, qos: str) -> None:
    """PodTolerationRestriction Admit (merge the namespace defaults, plus memory-pressure for pods that
    are not BestEffort) and Validate (every toleration within the namespace whitelist). The refusal is
    a plain error in the real plugin: the API server answers it as a 500 with reason Unknown."""
    spec = pod.setdefault("spec", {})
    extra = list(_ns_tolerations(ns_obj, NS_DEFAULT_TOLERATIONS) or [])
    if qos != "BestEffort":
        extra.append(
            {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}
        )
    if extra:
        spec["tolerations"] = merge_tolerations(spec.get("tolerations") or [], extra)
    tolerations = spec.get("tolerations") or []
    whitelist = _ns_tolerations(ns_obj, NS_TOLERATIONS_WHITELIST)
    if tolerations and whitelist:
        for t in tolerations:
            if not any(is_superset(w, t) for w in whitelist):
                raise ApiError(
                    500,
                    "Unknown",
                    "pod tolerations (possibly merged with namespace default tolerations) conflict with "
                    "its namespace whitelist",
                )


def node_selector_restriction(pod: Obj, ns_obj: Obj, name: str) -> None:
    """PodNodeSelector Admit: the namespace's node selector may not be contradicted, and is merged."""
    text = (u.dig(ns_obj, "metadata", "annotations") or {}).get(NS_NODE_SELECTOR)
    if not text:
        return
    want: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        k, eq, v = part.partition("=")
        if not eq:
            raise _forbidden("pods", name, f"invalid label selector in {NS_NODE_SELECTOR}: {text}")
        want[k.strip()] = v.strip()
    spec = pod.setdefault("spec", {})
    have = spec.get("nodeSelector") or {}
    if any(k in have and have[k] != v for k, v in want.items()):
        raise _forbidden(
            "pods", name, "pod node label selector conflicts with its namespace node label selector"
        )
    spec["nodeSelector"] = {**want, **have}


# ------------------------------------------------------------------------------------ quota


def _container_usage(requests: dict[str, Any], limits: dict[str, Any]) -> dict[str, Quantity]:
    """pods.go podComputeUsageHelper for one set of requests and limits."""
    out: dict[str, Quantity] = {"pods": _q(1)}
    for r in NATIVE_COMPUTE:
        if r in requests:
            out[f"requests.{r}"] = _q(requests[r])
            if r != "ephemeral-storage":
                out[r] = _q(requests[r])
        if r in limits:
            out[f"limits.{r}"] = _q(limits[r])
    for k, v in requests.items():
        if is_extended(k) or k.startswith("hugepages-"):
            out[f"requests.{k}"] = _q(v)
    return out


def _pod_requests(spec: Obj, key: str) -> dict[str, Quantity]:
    """resourcehelper.PodRequests/PodLimits: containers summed, then the largest init container."""
    total: dict[str, Quantity] = {}
    for c in spec.get("containers") or []:
        total = _sum(total, {k: _q(v) for k, v in (u.dig(c, "resources", key) or {}).items()})
    for c in spec.get("initContainers") or []:
        for k, v in (u.dig(c, "resources", key) or {}).items():
            if k not in total or _q(v).value > total[k].value:
                total[k] = _q(v)
    return total


def pod_terminal(pod: Obj) -> bool:
    """pods.go QuotaV1Pod is false: finished, or deleted and past its grace period."""
    if u.dig(pod, "status", "phase") in ("Succeeded", "Failed"):
        return True
    deleted = u.parse_iso(u.dig(pod, "metadata", "deletionTimestamp"))
    return deleted is not None and u.now() > deleted


def pod_usage(pod: Obj) -> dict[str, Quantity]:
    """pods.go PodUsageFunc: count/pods always; compute resources only while the pod is not terminal."""
    out: dict[str, Quantity] = {"count/pods": _q(1)}
    if pod_terminal(pod):
        return out
    spec = pod.get("spec") or {}
    req = {k: str(v) for k, v in _pod_requests(spec, "requests").items()}
    lim = {k: str(v) for k, v in _pod_requests(spec, "limits").items()}
    return {**out, **_container_usage(req, lim)}


def _quota_matches(quota: Obj, pod: Obj, qos: str) -> bool:
    """pods.go podMatchesScopeFunc for the quota's scopes and scopeSelector."""
    spec = pod.get("spec") or {}
    reqs = [{"scopeName": s, "operator": "Exists"} for s in u.dig(quota, "spec", "scopes") or []]
    reqs += u.dig(quota, "spec", "scopeSelector", "matchExpressions") or []
    for r in reqs:
        scope, op = r.get("scopeName"), r.get("operator")
        if scope == "Terminating":
            ok = spec.get("activeDeadlineSeconds") is not None
        elif scope == "NotTerminating":
            ok = spec.get("activeDeadlineSeconds") is None
        elif scope == "BestEffort":
            ok = qos == "BestEffort"
        elif scope == "NotBestEffort":
            ok = qos != "BestEffort"
        elif scope == "PriorityClass":
            pc = spec.get("priorityClassName") or ""
            ok = {
                "In": pc in (r.get("values") or []),
                "NotIn": pc not in (r.get("values") or []),
                "Exists": bool(pc),
                "DoesNotExist": not pc,
            }.get(op, False)
            if ok:
                continue
            return False
        else:
            return False
        if not ok:
            return False
    return True


def _pretty(items: dict[str, Quantity]) -> str:
    return ",".join(f"{k}={items[k]}" for k in sorted(items))


def _matching(hard: dict[str, Any]) -> list[str]:
    """The hard resources the pod evaluator counts (podResources, requests.<extended>, hugepages)."""
    known = {"pods", "count/pods", *NATIVE_COMPUTE}
    known |= {f"requests.{r}" for r in NATIVE_COMPUTE} | {f"limits.{r}" for r in NATIVE_COMPUTE}
    return [
        r
        for r in hard
        if r in known
        or (r.startswith("requests.") and (is_extended(r[9:]) or r[9:].startswith("hugepages-")))
    ]


def _constraints(pod: Obj, required: list[str]) -> str | None:
    """pods.go Constraints: every container must state the cpu/memory the quota limits."""
    req_set = set(required) & MUST_SPECIFY
    if not req_set:
        return None
    missing: dict[str, list[str]] = {}
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        have = set(
            _container_usage(u.dig(c, "resources", "requests") or {}, u.dig(c, "resources", "limits") or {})
        )
        for r in sorted(req_set - have):
            missing.setdefault(r, []).append(c.get("name", ""))
    if not missing:
        return None
    return "; ".join(f"must specify {r} for: {','.join(sorted(missing[r]))}" for r in sorted(missing))


def resource_quota(store: Store, pod: Obj, ns: str, name: str, qos: str) -> None:
    """checkRequest: the pod must fit every matching quota; its usage is then charged to their
    status.used (as the real plugin writes the quota before the pod is stored)."""
    res = store.res("resourcequotas")
    with store.lock:
        quotas = store.list(res, ns)
        delta = pod_usage(pod)
        charged: list[tuple[Obj, dict[str, Quantity]]] = []
        for quota in quotas:
            if not _quota_matches(quota, pod, qos):
                continue
            qname = quota["metadata"]["name"]
            hard = u.dig(quota, "status", "hard") or {}
            required = _matching(hard)
            why = _constraints(pod, required)
            if why:
                raise _forbidden("pods", name, f"failed quota: {qname}: {why}")
            used_raw = u.dig(quota, "status", "used") or {}
            if any(r not in used_raw for r in required):
                raise _forbidden("pods", name, f"status unknown for quota: {qname}")
            requested = {r: delta[r] for r in required if r in delta}
            if not requested:
                continue
            used = {r: _q(used_raw[r]) for r in required}
            new = _sum(used, requested)
            exceeded = sorted(r for r in requested if new[r].value > _q(hard[r]).value)
            if exceeded:
                raise _forbidden(
                    "pods",
                    name,
                    f"exceeded quota: {qname}, requested: {_pretty({r: requested[r] for r in exceeded})}, "
                    f"used: {_pretty({r: used[r] for r in exceeded})}, "
                    f"limited: {_pretty({r: _q(hard[r]) for r in exceeded})}",
                )
            charged.append((quota, {**{k: _q(v) for k, v in used_raw.items()}, **new}))
        for quota, new_used in charged:
            store.patch(
                res,
                ns,
                quota["metadata"]["name"],
                {"status": {"used": {k: str(v) for k, v in new_used.items()}}},
                subresource="status",
            )


def quota_status(store: Store, quota: Obj) -> Obj:
    """What the resource quota controller writes: status.hard = spec.hard, status.used = the usage of
    the namespace's pods for each hard resource the pod evaluator counts (others stay unset)."""
    hard = dict(u.dig(quota, "spec", "hard") or {})
    ns = quota["metadata"]["namespace"]
    total: dict[str, Quantity] = {}
    from .kube_store import _qos

    for pod in store.list(store.res("pods"), ns):
        if _quota_matches(quota, pod, _qos(pod.get("spec") or {})):
            total = _sum(total, pod_usage(pod))
    used = {r: str(total.get(r, Quantity(Fraction(0)))) for r in _matching(hard)}
    return {"hard": hard, "used": used}


def sync_quotas(store: Store) -> None:
    """One pass of the resource quota controller over every ResourceQuota."""
    res = store.res("resourcequotas")
    for quota in store.list(res):
        want = quota_status(store, quota)
        if (quota.get("status") or {}) != want:

            def write(o: Obj, want: Obj = want) -> None:
                o["status"] = want

            store.mutate(res, quota["metadata"]["namespace"], quota["metadata"]["name"], write, "status")


def describe_quota(quota: Obj) -> str:
    """kubectl describe quota (k8s.io/kubectl pkg/describe describeQuota): Resource / Used / Hard."""
    hard = u.dig(quota, "status", "hard") or {}
    used = u.dig(quota, "status", "used") or {}
    rows = [["Resource", "Used", "Hard"], ["--------", "----", "----"]]
    rows += [[r, str(used.get(r, "")), str(hard[r])] for r in sorted(hard)]
    meta = quota["metadata"]
    head = f"Name:{' ' * 12}{meta['name']}\nNamespace:{' ' * 7}{meta.get('namespace')}\n"
    return head + u.table(rows, padding=2)


# ------------------------------------------------------------------------------------ the chain


def admit_pod(store: Store, plugins: set[str], doc: Obj, ns: str) -> Obj:
    """The create-time admission chain for a pod, in kube-apiserver's plugin order: mutating plugins,
    then validating ones. Returns the pod as it will be stored; raises the ApiError the real server
    answers with."""
    from .kube_store import _qos

    pod = copy.deepcopy(doc)
    meta = pod.setdefault("metadata", {})
    ns = ns or meta.get("namespace") or "default"
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + u.rand_suffix()  # named before validating admission
    name = meta.get("name") or ""
    default_requests_from_limits(pod)
    ns_obj = store.find(store.res("namespaces"), "", ns) or {}
    if "LimitRanger" in plugins:
        limit_ranger_mutate(store, pod, ns)
    if "PodNodeSelector" in plugins:
        node_selector_restriction(pod, ns_obj, name)
    if "DefaultTolerationSeconds" in plugins:
        default_toleration_seconds(pod)
    qos = _qos(pod.get("spec") or {})
    if "PodTolerationRestriction" in plugins:
        toleration_restriction(pod, ns_obj, qos)
    if "LimitRanger" in plugins:
        limit_ranger_validate(store, pod, ns, name)
    if "ResourceQuota" in plugins:
        resource_quota(store, pod, ns, name, qos)
    return pod
