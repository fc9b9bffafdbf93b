"""The object store of the SIMULATED API server: every object of the one cluster, the resource types it
knows (built in, plus those that CustomResourceDefinitions add), API semantics (names, namespaces,
resourceVersion, generation, defaults) and persistence to the control plane's disk."""

from __future__ import annotations

import copy
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import kube_util as u

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    kind: str
    plural: str
    group: str
    version: str
    namespaced: bool
    short: tuple[str, ...] = ()
    singular: str = ""
    status_sub: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def rid(self) -> str:
        """plural[.group]: the resource's full name (also what error messages say)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


def _r(
    kind: str, plural: str, group: str, version: str, namespaced: bool, *short: str, status: bool = False
) -> Resource:
    return Resource(kind, plural, group, version, namespaced, tuple(short), kind.lower(), status)


BUILTIN: list[Resource] = [
    _r("Namespace", "namespaces", "", "v1", False, "ns", status=True),
    _r("Node", "nodes", "", "v1", False, "no", status=True),
    _r("Pod", "pods", "", "v1", True, "po", status=True),
    _r("Service", "services", "", "v1", True, "svc", status=True),
    _r("ServiceAccount", "serviceaccounts", "", "v1", True, "sa"),
    _r("ConfigMap", "configmaps", "", "v1", True, "cm"),
    _r("Secret", "secrets", "", "v1", True),
    _r("Endpoints", "endpoints", "", "v1", True, "ep"),
    _r("Event", "events", "", "v1", True, "ev"),
    _r("PersistentVolumeClaim", "persistentvolumeclaims", "", "v1", True, "pvc", status=True),
    _r("PersistentVolume", "persistentvolumes", "", "v1", False, "pv", status=True),
    _r("ResourceQuota", "resourcequotas", "", "v1", True, "quota", status=True),
    _r("LimitRange", "limitranges", "", "v1", True, "limits"),
    _r("DaemonSet", "daemonsets", "apps", "v1", True, "ds", status=True),
    _r("Deployment", "deployments", "apps", "v1", True, "deploy", status=True),
    _r("ReplicaSet", "replicasets", "apps", "v1", True, "rs", status=True),
    _r("StatefulSet", "statefulsets", "apps", "v1", True, "sts", status=True),
    _r("ControllerRevision", "controllerrevisions", "apps", "v1", True),
    _r("Job", "jobs", "batch", "v1", True, status=True),
    _r("CronJob", "cronjobs", "batch", "v1", True, "cj", status=True),
    _r("PodDisruptionBudget", "poddisruptionbudgets", "policy", "v1", True, "pdb", status=True),
    _r("ClusterRole", "clusterroles", "rbac.authorization.k8s.io", "v1", False),
    _r("ClusterRoleBinding", "clusterrolebindings", "rbac.authorization.k8s.io", "v1", False),
    _r("Role", "roles", "rbac.authorization.k8s.io", "v1", True),
    _r("RoleBinding", "rolebindings", "rbac.authorization.k8s.io", "v1", True),
    _r(
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificates.k8s.io",
        "v1",
        False,
        "csr",
        status=True,
    ),
    _r("Lease", "leases", "coordination.k8s.io", "v1", True),
    _r("RuntimeClass", "runtimeclasses", "node.k8s.io", "v1", False),
    _r("PriorityClass", "priorityclasses", "scheduling.k8s.io", "v1", False, "pc"),
    _r(
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "apiextensions.k8s.io",
        "v1",
        False,
        "crd",
        "crds",
        status=True,
    ),
    _r("StorageClass", "storageclasses", "storage.k8s.io", "v1", False, "sc"),
    _r("CSIDriver", "csidrivers", "storage.k8s.io", "v1", False),
    _r("NetworkPolicy", "networkpolicies", "networking.k8s.io", "v1", True, "netpol"),
    _r("Ingress", "ingresses", "networking.k8s.io", "v1", True, "ing", status=True),
    _r("IngressClass", "ingressclasses", "networking.k8s.io", "v1", False),
    _r(
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        "v1",
        False,
    ),
    _r(
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        "v1",
        False,
    ),
    _r("APIService", "apiservices", "apiregistration.k8s.io", "v1", False, status=True),
    _r("EndpointSlice", "endpointslices", "discovery.k8s.io", "v1", True),
    _r("HorizontalPodAutoscaler", "horizontalpodautoscalers", "autoscaling", "v2", True, "hpa", status=True),
]
# Resources that are not stored objects but answer verbs (eviction is a pod subresource).
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PRIORITY = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}


class ApiError(Exception):
    """An API failure as the server reports it (a metav1.Status)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        st: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            st["details"] = self.details
        return st


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{res.rid} "{name}" not found',
        {"name": name, "group": res.group, "kind": res.plural},
    )


def already_exists(res: Resource, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{res.rid} "{name}" already exists',
        {"name": name, "group": res.group, "kind": res.plural},
    )


def invalid(res: Resource, name: str, msg: str) -> ApiError:
    return ApiError(
        422, "Invalid", f'{res.kind} "{name}" is invalid: {msg}', {"name": name, "kind": res.kind}
    )


class Store:
    """All objects, keyed (resource id, namespace, name); thread-safe; persisted as one JSON file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.rv = 0
        self.changed = threading.Condition(self.lock)
        self._dirty = False
        self.hooks: list[Callable[[str, Resource, Obj], None]] = []
        if path is not None and path.exists():
            doc = json.loads(path.read_text())
            self.rv = int(doc.get("resourceVersion", 0))
            for o in doc.get("objects", []):
                res = self.resource_for(o["apiVersion"], o["kind"])
                if res is not None:
                    self.objects[(res.rid, o["metadata"].get("namespace", ""), o["metadata"]["name"])] = o
        for ns in SYSTEM_NAMESPACES:
            if ("namespaces", "", ns) not in self.objects:
                self.create(
                    self.res("namespaces"),
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                )

    # ------------------------------------------------------------------------------------ types
    def resources(self) -> list[Resource]:
        out = list(BUILTIN)
        for crd in self._raw_list("customresourcedefinitions.apiextensions.k8s.io"):
            spec = crd.get("spec") or {}
            names = spec.get("names") or {}
            served = [v for v in spec.get("versions") or [] if v.get("served", True)]
            storage = next((v for v in served if v.get("storage")), served[0] if served else None)
            if not storage or not names.get("plural") or not names.get("kind"):
                continue
            has_status = bool(u.dig(storage, "subresources", "status") is not None)
            out.append(
                Resource(
                    names["kind"],
                    names["plural"],
                    spec.get("group", ""),
                    storage["name"],
                    spec.get("scope") == "Namespaced",
                    tuple(names.get("shortNames") or []),
                    names.get("singular") or names["kind"].lower(),
                    has_status,
                )
            )
        return out

    def res(self, name: str) -> Resource:
        found = self.lookup(name)
        if found is None:
            raise KeyError(name)
        return found

    def lookup(self, name: str) -> Resource | None:
        """A resource by plural, singular, short name, kind or plural.group (as kubectl resolves them)."""
        name_l = name.lower()
        plain, _, group = name_l.partition(".")
        for r in self.resources():
            if group:
                if r.group == group and plain in (r.plural, r.singular, r.kind.lower()):
                    return r
                if name_l == r.rid:
                    return r
            elif name_l in (r.plural, r.singular, r.kind.lower(), *r.short):
                return r
        return None

    def resource_for(self, api_version: str, kind: str) -> Resource | None:
        group = api_version.rpartition("/")[0]
        for r in self.resources():
            if r.kind == kind and r.group == group:
                return r
        return None

    def resource_by_path(self, group: str, version: str, plural: str) -> Resource | None:
        for r in self.resources():
            if r.group == group and r.plural == plural:
                return r
        return None

    # ----------------------------------------------------------------------------------- reads
    def _raw_list(self, rid: str) -> list[Obj]:
        return [o for (r, _ns, _n), o in self.objects.items() if r == rid]

    def get(self, res: Resource, namespace: str, name: str) -> Obj:
        with self.lock:
            o = self.objects.get((res.rid, namespace if res.namespaced else "", name))
            if o is None:
                raise not_found(res, name)
            return copy.deepcopy(o)

    def find(self, res: Resource, namespace: str, name: str) -> Obj | None:
        try:
            return self.get(res, namespace, name)
        except ApiError:
            return None

    def list(
        self, res: Resource, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[Obj]:
        lreq = u.parse_label_selector(label_selector) if label_selector else []
        freq = u.parse_field_selector(field_selector) if field_selector else []
        with self.lock:
            out = []
            for (rid, ns, _name), o in sorted(self.objects.items()):
                if rid != res.rid or (namespace and res.namespaced and ns != namespace):
                    continue
                if lreq and not u.labels_match(lreq, o["metadata"].get("labels")):
                    continue
                if freq and not u.fields_match(freq, o):
                    continue
                out.append(copy.deepcopy(o))
            return out

    def iter(self, rid: str) -> Iterator[Obj]:
        with self.lock:
            items = [copy.deepcopy(o) for o in self._raw_list(rid)]
        yield from items

    # ---------------------------------------------------------------------------------- writes
    def _bump(self, o: Obj) -> None:
        self.rv += 1
        o["metadata"]["resourceVersion"] = str(self.rv)
        self._dirty = True
        self.changed.notify_all()

    def create(self, res: Resource, obj: Obj, namespace: str | None = None) -> Obj:
        with self.lock:
            o = copy.deepcopy(obj)
            o["apiVersion"], o["kind"] = res.api_version, res.kind
            meta = o.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + u.rand_suffix()
            name = meta.get("name") or ""
            if not name:
                raise invalid(res, "", "metadata.name: Required value: name or generateName is required")
            if (
                res.kind != "Node"
                and not u.DNS1123_SUBDOMAIN.match(name)
                and not res.group.endswith(".k8s.io")
            ):
                raise invalid(
                    res,
                    name,
                    f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                    f"of lower "
                    "case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                    "character",
                )
            ns = ""
            if res.namespaced:
                ns = namespace or meta.get("namespace") or "default"
                nsobj = self.objects.get(("namespaces", "", ns))
                if nsobj is None:
                    raise ApiError(
                        404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}
                    )
                if (nsobj.get("status") or {}).get("phase") == "Terminating":
                    raise ApiError(
                        403,
                        "Forbidden",
                        f'{res.plural} "{name}" is forbidden: unable to create new content in namespace {ns} '
                        "because it is being terminated",
                    )
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            key = (res.rid, ns, name)
            if key in self.objects:
                raise already_exists(res, name)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = u.iso()
            meta.pop("deletionTimestamp", None)
            meta["generation"] = 1
            self._defaults(res, o)
            self.objects[key] = o
            self._bump(o)
            self._fire("ADDED", res, o)
            return copy.deepcopy(o)

    def replace(self, res: Resource, obj: Obj, subresource: str = "", check_rv: bool = True) -> Obj:
        with self.lock:
            meta = obj.get("metadata") or {}
            ns = meta.get("namespace", "") if res.namespaced else ""
            key = (res.rid, ns, meta.get("name", ""))
            old = self.objects.get(key)
            if old is None:
                raise not_found(res, meta.get("name", ""))
            want_rv = meta.get("resourceVersion")
            if check_rv and want_rv and want_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.rid} "{meta.get("name")}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            new = copy.deepcopy(obj)
            new["apiVersion"], new["kind"] = res.api_version, res.kind
            for k in (
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if k in old["metadata"]:
                    new["metadata"][k] = old["metadata"][k]
                else:
                    new["metadata"].pop(k, None)
            if subresource == "status":
                keep = copy.deepcopy(old)
                keep["status"] = new.get("status", {})
                new = keep
            elif res.status_sub:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            if subresource != "status" and _spec_of(new) != _spec_of(old):
                new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
            if _without_rv(new) == _without_rv(old):
                return copy.deepcopy(old)
            self.objects[key] = new
            self._bump(new)
            self._fire("MODIFIED", res, new)
            return copy.deepcopy(new)

    def patch(self, res: Resource, namespace: str, name: str, patch: Obj, subresource: str = "") -> Obj:
        with self.lock:
            cur = self.get(res, namespace, name)
            new = u.merge_patch(cur, patch)
            new.setdefault("metadata", {})
            new["metadata"]["name"], new["metadata"]["resourceVersion"] = (
                name,
                cur["metadata"]["resourceVersion"],
            )
            if res.namespaced:
                new["metadata"]["namespace"] = cur["metadata"]["namespace"]
            if subresource != "status" and res.status_sub and "status" in patch:
                new["status"] = cur.get("status", {})
            return self.replace(res, new, subresource=subresource, check_rv=False)

    def mutate(
        self, res: Resource, namespace: str, name: str, fn: Callable[[Obj], None], subresource: str = ""
    ) -> Obj:
        """Read-modify-write under the store lock."""
        with self.lock:
            cur = self.get(res, namespace, name)
            fn(cur)
            return self.replace(res, cur, subresource=subresource, check_rv=False)

    def delete(self, res: Resource, namespace: str, name: str, grace: int | None = None) -> Obj:
        """Delete; a pod bound to a node is only marked (the kubelet finishes it) unless grace is 0."""
        with self.lock:
            ns = namespace if res.namespaced else ""
            key = (res.rid, ns, name)
            o = self.objects.get(key)
            if o is None:
                raise not_found(res, name)
            if res.kind == "Pod" and (o.get("spec") or {}).get("nodeName") and grace != 0:
                phase = (o.get("status") or {}).get("phase")
                if phase not in ("Succeeded", "Failed"):
                    if not o["metadata"].get("deletionTimestamp"):
                        g = (
                            grace
                            if grace is not None
                            else int(o["spec"].get("terminationGracePeriodSeconds", 30))
                        )
                        o["metadata"]["deletionTimestamp"] = u.iso(u.now() + g)
                        o["metadata"]["deletionGracePeriodSeconds"] = g
                        self._bump(o)
                        self._fire("MODIFIED", res, o)
                    return copy.deepcopy(o)
            if res.kind == "Namespace":
                if name in SYSTEM_NAMESPACES:
                    raise ApiError(
                        403,
                        "Forbidden",
                        f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                    )
                if (o.get("status") or {}).get("phase") != "Terminating":
                    o["metadata"]["deletionTimestamp"] = u.iso()
                    o.setdefault("status", {})["phase"] = "Terminating"
                    self._bump(o)
                    self._fire("MODIFIED", res, o)
                return copy.deepcopy(o)
            del self.objects[key]
            self.rv += 1
            self._dirty = True
            self.changed.notify_all()
            self._fire("DELETED", res, o)
            return copy.deepcopy(o)

    def remove_now(self, res: Resource, namespace: str, name: str) -> None:
        """Final removal (a namespace once empty, a pod its kubelet stopped)."""
        with self.lock:
            o = self.objects.pop((res.rid, namespace if res.namespaced else "", name), None)
            if o is not None:
                self.rv += 1
                self._dirty = True
                self.changed.notify_all()
                self._fire("DELETED", res, o)

    def _fire(self, event: str, res: Resource, o: Obj) -> None:
        for hook in self.hooks:
            hook(event, res, o)

    # -------------------------------------------------------------------------------- defaults
    def _defaults(self, res: Resource, o: Obj) -> None:
        meta = o["metadata"]
        if res.kind == "Namespace":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            o["spec"] = {"finalizers": ["kubernetes"]}
            o["status"] = {"phase": "Active"}
        elif res.kind == "Pod":
            spec = o.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
            spec.setdefault("securityContext", {})
            if spec.get("priorityClassName") in PRIORITY:
                spec.setdefault("priority", PRIORITY[spec["priorityClassName"]])
            else:
                spec.setdefault("priority", 0)
            tol = spec.setdefault("tolerations", [])
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(t.get("key") == key and t.get("effect") == "NoExecute" for t in tol) and not any(
                    t.get("operator") == "Exists" and not t.get("key") for t in tol
                ):
                    tol.append(
                        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                    )
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                c.setdefault(
                    "imagePullPolicy",
                    "Always" if str(c.get("image", "")).endswith(":latest") else "IfNotPresent",
                )
                c.setdefault("terminationMessagePath", "/dev/termination-log")
                c.setdefault("terminationMessagePolicy", "File")
                c.setdefault("resources", {})
            o["status"] = {"phase": "Pending", "qosClass": _qos(spec)}
        elif res.kind in ("DaemonSet", "Deployment", "ReplicaSet", "StatefulSet"):
            spec = o.setdefault("spec", {})
            if res.kind != "DaemonSet":
                spec.setdefault("replicas", 1)
            spec.setdefault("revisionHistoryLimit", 10)
            o.setdefault("status", {})
        elif res.kind == "Service":
            spec = o.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if not spec.get("clusterIP"):
                spec["clusterIP"] = self._allocate_cluster_ip()
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            o.setdefault("status", {"loadBalancer": {}})
        elif res.kind == "Secret":
            o.setdefault("type", "Opaque")
        elif res.kind == "PodDisruptionBudget":
            o.setdefault(
                "status",
                {
                    "currentHealthy": 0,
                    "desiredHealthy": 0,
                    "disruptionsAllowed": 0,
                    "expectedPods": 0,
                    "observedGeneration": 1,
                },
            )
        elif res.kind == "CustomResourceDefinition":
            names = u.dig(o, "spec", "names") or {}
            o["status"] = {
                "acceptedNames": names,
                "conditions": [
                    {
                        "type": "NamesAccepted",
                        "status": "True",
                        "reason": "NoConflicts",
                        "message": "no conflicts found",
                        "lastTransitionTime": u.iso(),
                    },
                    {
                        "type": "Established",
                        "status": "True",
                        "reason": "InitialNamesAccepted",
                        "message": "the initial names have been accepted",
                        "lastTransitionTime": u.iso(),
                    },
                ],
                "storedVersions": [
                    v["name"] for v in u.dig(o, "spec", "versions", default=[]) if v.get("storage")
                ],
            }

    def _allocate_cluster_ip(self) -> str:
        cidr = getattr(self, "service_cidr", "10.96.0.0/12")
        import ipaddress

        net = ipaddress.ip_network(cidr, strict=False)
        used = {u.dig(o, "spec", "clusterIP") for o in self._raw_list("services")}
        for i, addr in enumerate(net.hosts()):
            if i < 20:  # .1 is kubernetes, .10 is kube-dns; dynamic addresses start above them
                continue
            if str(addr) not in used:
                return str(addr)
        raise ApiError(500, "InternalError", "no service IP left")

    # ------------------------------------------------------------------------------- persistence
    def flush(self) -> None:
        if self.path is None or not self._dirty:
            return
        with self.lock:
            doc = {"resourceVersion": self.rv, "objects": list(self.objects.values())}
            data = json.dumps(doc, separators=(",", ":"))
            self._dirty = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(data)
        os.replace(tmp, self.path)


def _without_rv(o: Obj) -> Obj:
    return {**o, "metadata": {k: v for k, v in o["metadata"].items() if k != "resourceVersion"}}


def _spec_of(o: Obj) -> Any:
    return {k: v for k, v in o.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _qos(spec: Obj) -> str:
    containers = spec.get("containers") or []
    if not any(
        (c.get("resources") or {}).get("requests") or (c.get("resources") or {}).get("limits")
        for c in containers
    ):
        return "BestEffort"
    for c in containers:
        r = c.get("resources") or {}
        lim = r.get("limits") or {}
        req = r.get("requests") or lim
        if (
            not lim
            or set(("cpu", "memory")) - set(lim)
            or any(req.get(k) != lim.get(k) for k in ("cpu", "memory"))
        ):
            return "Burstable"
    return "Guaranteed"
