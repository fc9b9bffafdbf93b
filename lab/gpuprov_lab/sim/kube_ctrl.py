"""Controllers of the SIMULATED control plane, run in the API server process: node lifecycle (heartbeat
timeouts, taints, pod CIDRs), bootstrap tokens (cluster-info signing, expiry), kubelet certificate
requests, Deployments/ReplicaSets, DaemonSets, the scheduler, garbage collection, namespace deletion,
PodDisruptionBudgets and evictions, and two add-on controllers that real clusters run as pods: the
node-feature-discovery master and the NVIDIA GPU Operator (both act only while their pod runs)."""

from __future__ import annotations

import base64
import contextlib
import copy
import ipaddress
import threading
import time
from typing import TYPE_CHECKING, Any

from . import kube_pki as pki
from . import kube_util as u
from .kube_store import ApiError, Obj, Resource

if TYPE_CHECKING:
    from .kube_api import ApiServer, User

NODE_GRACE = 40.0  # node-monitor-grace-period
DS_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
GPU_NODE_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
NFD_PREFIX = "feature.node.kubernetes.io/"
NFD_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"


# --------------------------------------------------------------------------------------- scheduling


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _term_matches(term: Obj, node: Obj) -> bool:
    labels = u.dig(node, "metadata", "labels") or {}
    for e in term.get("matchExpressions") or []:
        key, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        have = labels.get(key)
        ok = {
            "In": have in vals,
            "NotIn": have not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "Gt": have is not None and vals and have.isdigit() and int(have) > int(vals[0]),
            "Lt": have is not None and vals and have.isdigit() and int(have) < int(vals[0]),
        }.get(op, False)
        if not ok:
            return False
    for e in term.get("matchFields") or []:
        if e.get("key") == "metadata.name":
            name = node["metadata"]["name"]
            if (e.get("operator") == "In") != (name in (e.get("values") or [])):
                return False
    return True


def node_fits(pod_spec: Obj, node: Obj) -> str | None:
    """None when the pod may run on the node, else why not (scheduler vocabulary)."""
    labels = u.dig(node, "metadata", "labels") or {}
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return "didn't match Pod's node affinity/selector"
    terms = u.dig(
        pod_spec,
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    )
    if terms and not any(_term_matches(t, node) for t in terms):
        return "didn't match Pod's node affinity/selector"
    for taint in u.dig(node, "spec", "taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
            pod_spec.get("tolerations") or [], taint
        ):
            return f"had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}".replace(": }", "}")
    return None


def preference(pod_spec: Obj, node: Obj) -> int:
    """Sum of the weights of the pod's preferred node-affinity terms the node matches."""
    terms = (
        u.dig(pod_spec, "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution") or []
    )
    return sum(int(t.get("weight", 0)) for t in terms if _term_matches(t.get("preference") or {}, node))


def node_condition(node: Obj, ctype: str) -> Obj:
    for c in u.dig(node, "status", "conditions") or []:
        if c.get("type") == ctype:
            return c
    return {}


def node_ready(node: Obj) -> bool:
    return node_condition(node, "Ready").get("status") == "True"


def pod_ready(pod: Obj) -> bool:
    if u.dig(pod, "metadata", "deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in u.dig(pod, "status", "conditions") or []
    )


def pod_requests(pod: Obj, resource: str) -> int:
    total = 0
    for c in u.dig(pod, "spec", "containers") or []:
        r = c.get("resources") or {}
        total += u.quantity_to_int(
            (r.get("limits") or {}).get(resource) or (r.get("requests") or {}).get(resource)
        )
    return total


def _extended_requests(pod: Obj) -> dict[str, int]:
    """The nvidia.com/* resources a pod's containers ask for (limits, else requests)."""
    names = {
        k
        for c in u.dig(pod, "spec", "containers") or []
        for part in ("limits", "requests")
        for k in (c.get("resources") or {}).get(part) or {}
        if str(k).startswith("nvidia.com/")
    }
    return {n: q for n in names if (q := pod_requests(pod, n))}


def owner_ref(owner: Obj) -> Obj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(o: Obj) -> str | None:
    for ref in u.dig(o, "metadata", "ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def _pct_or_int(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        import math

        frac = int(value[:-1]) * total / 100
        return math.ceil(frac) if round_up else math.floor(frac)
    return int(value or 0)


class Controllers:
    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.store = api.store
        self.host = api.host
        self.settings = api.settings
        self.R = self.store.res
        self._ca: pki.CertKey | None = None
        self.kick = threading.Event()
        self.store.hooks.append(lambda *_: self.kick.set())
        # Pod lists by namespace (None: all), valid while the store's resourceVersion stays the same. A pass
        # of the controllers asks for the same pods once per DaemonSet, ReplicaSet and budget; copying the
        # whole store each time kept an idle lab's control plane busy.
        self._pods_cache: dict[str | None, list[Obj]] = {}
        self._pods_cache_rv = -1

    # ----------------------------------------------------------------------------------- loop
    def run(self) -> None:
        while not self.api.stopping.is_set():
            self.kick.clear()
            try:
                self.reconcile()
            except ApiError:
                pass  # a conflicting write; the next pass sees the new state
            except Exception as exc:  # keep the control plane alive; say what broke
                import sys
                import traceback

                sys.stderr.write(f"kube-controller-manager (SIMULATED): {exc!r}\n{traceback.format_exc()}")
            self.kick.wait(1.0)
            time.sleep(0.05)

    def reconcile(self) -> None:
        self.namespaces()
        self.nodes()
        self.bootstrap_tokens()
        self.csrs()
        self.gpu_operator()
        self.nfd_master()
        self.deployments()
        self.replicasets()
        self.daemonsets()
        self.schedule()
        self.garbage()
        self.pdb_status()
        self.resource_quotas()

    def bootstrap(self) -> None:
        """Objects the control plane makes for itself on start."""
        st = self.settings
        svc_ip = str(next(ipaddress.ip_network(st.service_cidr, strict=False).hosts()))
        s = self.store
        if s.find(self.R("services"), "default", "kubernetes") is None:
            s.create(
                self.R("services"),
                {
                    "metadata": {
                        "name": "kubernetes",
                        "namespace": "default",
                        "labels": {"component": "apiserver", "provider": "kubernetes"},
                    },
                    "spec": {
                        "clusterIP": svc_ip,
                        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": st.port}],
                    },
                },
            )
        for name, value in (("system-node-critical", 2000001000), ("system-cluster-critical", 2000000000)):
            if s.find(self.R("priorityclasses"), "", name) is None:
                s.create(
                    self.R("priorityclasses"),
                    {
                        "metadata": {"name": name},
                        "value": value,
                        "globalDefault": False,
                        "description": "Used for system critical pods that must not be moved from their "
                        "current node."
                        if name == "system-node-critical"
                        else "Used for system critical pods that must run in the cluster, "
                        "but can be moved to another node if necessary.",
                        "preemptionPolicy": "PreemptLowerPriority",
                    },
                )

    # -------------------------------------------------------------------------------- namespaces
    def namespaces(self) -> None:
        s = self.store
        for ns in s.list(self.R("namespaces")):
            name = ns["metadata"]["name"]
            if (ns.get("status") or {}).get("phase") == "Terminating":
                left = 0
                for res in s.resources():
                    if not res.namespaced:
                        continue
                    for o in s.list(res, name):
                        left += 1
                        if not o["metadata"].get("deletionTimestamp"):
                            s.delete(res, name, o["metadata"]["name"])
                if not left:
                    s.remove_now(self.R("namespaces"), "", name)
                continue
            if s.find(self.R("serviceaccounts"), name, "default") is None:
                s.create(self.R("serviceaccounts"), {"metadata": {"name": "default", "namespace": name}})

    # ------------------------------------------------------------------------------------- nodes
    def nodes(self) -> None:
        s = self.store
        now = u.now()
        nodes = s.list(self.R("nodes"))
        used = {n["spec"].get("podCIDR") for n in nodes if (n.get("spec") or {}).get("podCIDR")}
        for node in nodes:
            name = node["metadata"]["name"]
            spec = node.setdefault("spec", {})
            if self.settings.allocate_cidrs and self.settings.cluster_cidr and not spec.get("podCIDR"):
                cidr = self._free_cidr(used)
                if cidr:
                    used.add(cidr)
                    s.patch(self.R("nodes"), "", name, {"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}})
            ready = node_condition(node, "Ready")
            beat = u.parse_iso(ready.get("lastHeartbeatTime")) or 0
            if ready and ready.get("status") != "Unknown" and now - beat > NODE_GRACE:

                def unknown(n: Obj) -> None:
                    for c in n["status"].get("conditions", []):
                        c["status"] = "Unknown"
                        c["reason"] = "NodeStatusUnknown"
                        c["message"] = "Kubelet stopped posting node status."
                        c["lastTransitionTime"] = u.iso()

                node = s.mutate(self.R("nodes"), "", name, unknown, subresource="status")
                ready = node_condition(node, "Ready")
            want: list[Obj] = []
            state = ready.get("status")
            if state == "False" or not ready:
                want += [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
            elif state == "Unknown":
                want += [
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                ]
            if spec.get("unschedulable"):
                want.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
            managed = {
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
                "node.kubernetes.io/unschedulable",
            }
            taints = [t for t in spec.get("taints") or [] if t.get("key") not in managed]
            old_managed = [t for t in spec.get("taints") or [] if t.get("key") in managed]
            keep = {(t["key"], t["effect"]): t for t in old_managed}
            for t in want:
                taints.append(keep.get((t["key"], t["effect"])) or {**t, "timeAdded": u.iso()})
            if taints != (spec.get("taints") or []):
                s.patch(self.R("nodes"), "", name, {"spec": {"taints": taints or None}})

    def _free_cidr(self, used: set[str]) -> str | None:
        net = ipaddress.ip_network(self.settings.cluster_cidr, strict=False)
        mask = max(self.settings.node_cidr_mask, net.prefixlen)
        for sub in net.subnets(new_prefix=mask):
            if str(sub) not in used:
                return str(sub)
        return None

    # -------------------------------------------------------------------------- bootstrap tokens
    def _tokens(self) -> list[dict[str, str]]:
        out = []
        for sec in self.store.list(self.R("secrets"), "kube-system"):
            if sec.get("type") != "bootstrap.kubernetes.io/token":
                continue
            data = {k: base64.b64decode(v).decode() for k, v in (sec.get("data") or {}).items()}
            for k, v in (sec.get("stringData") or {}).items():
                data[k] = v
            data["_name"] = sec["metadata"]["name"]
            out.append(data)
        return out

    @staticmethod
    def _token_valid(t: dict[str, str]) -> bool:
        exp = u.parse_iso(t.get("expiration"))
        return not (exp is not None and exp < u.now())

    def bootstrap_token_user(self, token: str) -> User | None:
        from .kube_api import User

        m = pki.TOKEN_RE.match(token)
        if not m:
            return None
        for t in self._tokens():
            if (
                t.get("token-id") == m.group(1)
                and t.get("token-secret") == m.group(2)
                and t.get("usage-bootstrap-authentication") == "true"
                and self._token_valid(t)
            ):
                extra = [g for g in (t.get("auth-extra-groups") or "").split(",") if g]
                return User(
                    f"system:bootstrap:{m.group(1)}", ["system:bootstrappers", *extra, "system:authenticated"]
                )
        return None

    def bootstrap_tokens(self) -> None:
        s = self.store
        tokens = self._tokens()
        for t in tokens:
            if not self._token_valid(t):
                s.delete(self.R("secrets"), "kube-system", t["_name"])
        info = s.find(self.R("configmaps"), "kube-public", "cluster-info")
        if info is None:
            return
        data = dict(info.get("data") or {})
        payload = data.get("kubeconfig", "")
        want = {
            f"jws-kubeconfig-{t['token-id']}": pki.jws_detached(payload, t["token-id"], t["token-secret"])
            for t in tokens
            if self._token_valid(t) and t.get("usage-bootstrap-signing") == "true" and t.get("token-id")
        }
        new = {k: v for k, v in data.items() if not k.startswith("jws-kubeconfig-")}
        new.update(want)
        if new != data:
            info["data"] = new
            s.replace(self.R("configmaps"), info, check_rv=False)

    # ------------------------------------------------------------------------------------- CSRs
    def ca(self) -> pki.CertKey:
        if self._ca is None:
            cert = self.host.read(self.settings.signing_cert)
            key = self.host.read(self.settings.signing_key)
            if not cert or not key:
                raise ApiError(500, "InternalError", "the cluster signing certificate/key are not readable")
            self._ca = pki.CertKey(cert, key)
        return self._ca

    def csrs(self) -> None:
        s = self.store
        for csr in s.list(self.R("certificatesigningrequests")):
            status = csr.get("status") or {}
            spec = csr.get("spec") or {}
            if status.get("certificate"):
                continue
            if spec.get("signerName") != "kubernetes.io/kube-apiserver-client-kubelet":
                continue
            groups = spec.get("groups") or []
            if not ({"system:bootstrappers", "system:nodes"} & set(groups)):
                continue
            request = base64.b64decode(spec.get("request", "")).decode()
            cn, orgs = pki.csr_subject(self.host, request)
            name = csr["metadata"]["name"]
            conds = status.get("conditions") or []
            if not cn.startswith("system:node:") or orgs != ["system:nodes"]:
                if not any(c.get("type") == "Denied" for c in conds):
                    conds.append(
                        {
                            "type": "Denied",
                            "status": "True",
                            "reason": "InvalidSubject",
                            "message": "subject must be O=system:nodes, CN=system:node:<name>",
                            "lastUpdateTime": u.iso(),
                            "lastTransitionTime": u.iso(),
                        }
                    )
                    s.patch(
                        self.R("certificatesigningrequests"),
                        "",
                        name,
                        {"status": {"conditions": conds}},
                        subresource="status",
                    )
                continue
            if not any(c.get("type") == "Approved" for c in conds):
                conds.append(
                    {
                        "type": "Approved",
                        "status": "True",
                        "reason": "AutoApproved",
                        "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
                        "lastUpdateTime": u.iso(),
                        "lastTransitionTime": u.iso(),
                    }
                )
            cert = pki.sign_csr(self.host, self.ca(), request, server=False, client=True)
            s.patch(
                self.R("certificatesigningrequests"),
                "",
                name,
                {"status": {"conditions": conds, "certificate": pki.b64(cert)}},
                subresource="status",
            )

    def admit_create(self, res: Resource, doc: Obj, ns: str, user: User) -> Obj:
        from . import kube_admission

        if res.kind == "CertificateSigningRequest":
            doc = copy.deepcopy(doc)
            doc.setdefault("spec", {})["username"] = user.name
            doc["spec"]["groups"] = user.groups
        elif res.kind == "Pod":
            doc = kube_admission.admit_pod(self.store, self.admission_plugins(), doc, ns)
        elif res.kind == "LimitRange":
            doc = kube_admission.default_limit_range(doc)  # API defaulting of the stored object
        return doc

    def admission_plugins(self) -> set[str]:
        """The admission plugins the API server's flags turn on (kube_admission.enabled_plugins)."""
        from . import kube_admission

        st = self.settings
        return kube_admission.enabled_plugins(
            getattr(st, "admission_enable", ""), getattr(st, "admission_disable", "")
        )

    # ---------------------------------------------------------------------------- resource quota
    def resource_quotas(self) -> None:
        """The resource quota controller: status.hard/used of every ResourceQuota kept current."""
        from . import kube_admission

        kube_admission.sync_quotas(self.store)

    # --------------------------------------------------------------------------------- workloads
    def _pods(self, ns: str | None = None) -> list[Obj]:
        """The pods (of a namespace), as of the store's current version. Shared between the callers of a
        pass: read them, never change them (writes go through the store, which starts a new version)."""
        rv = self.store.rv
        if rv != self._pods_cache_rv:
            self._pods_cache, self._pods_cache_rv = {}, rv
        if ns not in self._pods_cache:
            self._pods_cache[ns] = self.store.list(self.R("pods"), ns)
        return self._pods_cache[ns]

    def _new_pod(self, owner: Obj, template: Obj, name: str, extra_labels: dict[str, str]) -> Obj:
        tmpl = copy.deepcopy(template or {})
        meta = tmpl.get("metadata") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": owner["metadata"]["namespace"],
                "labels": {**(meta.get("labels") or {}), **extra_labels},
                "annotations": meta.get("annotations") or {},
                "ownerReferences": [owner_ref(owner)],
            },
            "spec": tmpl.get("spec") or {},
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        return pod

    def deployments(self) -> None:
        s = self.store
        for d in s.list(self.R("deployments")):
            ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
            if d["metadata"].get("deletionTimestamp"):
                continue
            template = (d.get("spec") or {}).get("template") or {}
            h = u.stable_hash(template)
            rs_name = f"{name}-{h}"
            owned = [
                r for r in s.list(self.R("replicasets"), ns) if controller_uid(r) == d["metadata"]["uid"]
            ]
            want = int(d["spec"].get("replicas", 1))
            if not any(r["metadata"]["name"] == rs_name for r in owned):
                tmpl = copy.deepcopy(template)
                tmpl.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = h
                sel = copy.deepcopy(d["spec"].get("selector") or {})
                sel.setdefault("matchLabels", {})["pod-template-hash"] = h
                s.create(
                    self.R("replicasets"),
                    {
                        "metadata": {
                            "name": rs_name,
                            "namespace": ns,
                            "labels": {
                                **(u.dig(template, "metadata", "labels") or {}),
                                "pod-template-hash": h,
                            },
                            "annotations": {"deployment.kubernetes.io/revision": str(len(owned) + 1)},
                            "ownerReferences": [owner_ref(d)],
                        },
                        "spec": {"replicas": want, "selector": sel, "template": tmpl},
                    },
                )
                owned = [
                    r for r in s.list(self.R("replicasets"), ns) if controller_uid(r) == d["metadata"]["uid"]
                ]
            for r in owned:
                target = want if r["metadata"]["name"] == rs_name else 0
                if int(r["spec"].get("replicas", 0)) != target:
                    s.patch(self.R("replicasets"), ns, r["metadata"]["name"], {"spec": {"replicas": target}})
            pods = [p for p in self._pods(ns) if controller_uid(p) in {r["metadata"]["uid"] for r in owned}]
            new_rs = next((r for r in owned if r["metadata"]["name"] == rs_name), None)
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            updated = [p for p in live if new_rs and controller_uid(p) == new_rs["metadata"]["uid"]]
            ready = [p for p in live if pod_ready(p)]
            max_unavail = _pct_or_int(
                u.dig(d, "spec", "strategy", "rollingUpdate", "maxUnavailable", default="25%"),
                want,
                round_up=False,
            )
            available = len(ready) >= want - max_unavail
            status = {
                "observedGeneration": d["metadata"].get("generation", 1),
                "replicas": len(live),
                "updatedReplicas": len(updated),
                "readyReplicas": len(ready),
                "availableReplicas": len(ready),
                "unavailableReplicas": max(0, want - len(ready)),
                "conditions": [
                    self._cond(
                        d,
                        "Available",
                        available,
                        "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                        "Deployment has minimum availability."
                        if available
                        else "Deployment does not have minimum availability.",
                    ),
                    self._cond(
                        d,
                        "Progressing",
                        True,
                        "NewReplicaSetAvailable"
                        if len(updated) == want and len(ready) == want
                        else "ReplicaSetUpdated",
                        f'ReplicaSet "{rs_name}" has successfully progressed.'
                        if len(ready) == want
                        else f'ReplicaSet "{rs_name}" is progressing.',
                    ),
                ],
            }
            for k in ("readyReplicas", "availableReplicas", "updatedReplicas", "unavailableReplicas"):
                if not status[k]:
                    del status[k]
            if status != d.get("status"):
                s.patch(
                    self.R("deployments"),
                    ns,
                    name,
                    {"status": _replace_all(d.get("status"), status)},
                    subresource="status",
                )

    @staticmethod
    def _cond(o: Obj, ctype: str, ok: bool, reason: str, message: str) -> Obj:
        prev = next((c for c in u.dig(o, "status", "conditions") or [] if c.get("type") == ctype), {})
        status = "True" if ok else "False"
        same = prev.get("status") == status
        return {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastUpdateTime": prev.get("lastUpdateTime")
            if same and prev.get("reason") == reason
            else u.iso(),
            "lastTransitionTime": prev.get("lastTransitionTime") if same else u.iso(),
        }

    def replicasets(self) -> None:
        s = self.store
        for rs in s.list(self.R("replicasets")):
            ns, name = rs["metadata"]["namespace"], rs["metadata"]["name"]
            want = int(rs["spec"].get("replicas", 1))
            pods = [p for p in self._pods(ns) if controller_uid(p) == rs["metadata"]["uid"]]
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            for _ in range(want - len(live)):
                s.create(
                    self.R("pods"),
                    self._new_pod(rs, rs["spec"].get("template") or {}, f"{name}-{u.rand_suffix()}", {}),
                )
            if len(live) > want:
                victims = sorted(live, key=lambda p: (pod_ready(p), bool(p["spec"].get("nodeName"))))[
                    : len(live) - want
                ]
                for p in victims:
                    s.delete(self.R("pods"), ns, p["metadata"]["name"])
            ready = sum(1 for p in live if pod_ready(p))
            status = {"replicas": len(live), "observedGeneration": rs["metadata"]["generation"]}
            if ready:
                status.update({"readyReplicas": ready, "availableReplicas": ready})
            status["fullyLabeledReplicas"] = status["replicas"]
            if status != rs.get("status"):
                s.patch(
                    self.R("replicasets"),
                    ns,
                    name,
                    {"status": _replace_all(rs.get("status"), status)},
                    subresource="status",
                )

    def daemonsets(self) -> None:
        s = self.store
        nodes = s.list(self.R("nodes"))
        for ds in s.list(self.R("daemonsets")):
            ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
            gen = str(ds["metadata"].get("generation", 1))
            template = copy.deepcopy(u.dig(ds, "spec", "template") or {})
            tspec = template.setdefault("spec", {})
            tol = tspec.setdefault("tolerations", [])
            for t in DS_TOLERATIONS + (
                [
                    {
                        "key": "node.kubernetes.io/network-unavailable",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                    }
                ]
                if tspec.get("hostNetwork")
                else []
            ):
                if t not in tol:
                    tol.append(t)
            h = u.stable_hash(template)
            eligible = {n["metadata"]["name"] for n in nodes if node_fits(tspec, n) is None}
            pods = [p for p in self._pods(ns) if controller_uid(p) == ds["metadata"]["uid"]]
            by_node: dict[str, list[Obj]] = {}
            for p in pods:
                by_node.setdefault(p["spec"].get("nodeName", ""), []).append(p)
            on_delete = u.dig(ds, "spec", "updateStrategy", "type") == "OnDelete"
            for node_name, plist in by_node.items():
                for p in plist:
                    if p["metadata"].get("deletionTimestamp"):
                        continue
                    stale = (
                        p["metadata"].get("labels", {}).get("controller-revision-hash") != h and not on_delete
                    )
                    if (
                        node_name not in eligible
                        or stale
                        or len([q for q in plist if not q["metadata"].get("deletionTimestamp")]) > 1
                    ):
                        s.delete(self.R("pods"), ns, p["metadata"]["name"])
                        break  # one at a time per node
            for node_name in sorted(eligible):
                if node_name in by_node:
                    continue
                pod = self._new_pod(
                    ds,
                    template,
                    f"{name}-{u.rand_suffix()}",
                    {"controller-revision-hash": h, "pod-template-generation": gen},
                )
                pod["spec"]["nodeName"] = node_name
                # The DaemonSet controller pins its pod to the node through affinity, as the real one does.
                pod["spec"].setdefault("affinity", {})["nodeAffinity"] = {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [node_name]}
                                ]
                            }
                        ]
                    }
                }
                s.create(self.R("pods"), pod)
            pods = [p for p in self._pods(ns) if controller_uid(p) == ds["metadata"]["uid"]]
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            scheduled = [p for p in live if p["spec"].get("nodeName") in eligible]
            ready = [p for p in scheduled if pod_ready(p)]
            updated = [
                p for p in scheduled if p["metadata"].get("labels", {}).get("controller-revision-hash") == h
            ]
            status = {
                "currentNumberScheduled": len(scheduled),
                "desiredNumberScheduled": len(eligible),
                "numberMisscheduled": len([p for p in live if p["spec"].get("nodeName") not in eligible]),
                "numberReady": len(ready),
                "observedGeneration": ds["metadata"].get("generation", 1),
                "updatedNumberScheduled": len(updated),
                "numberAvailable": len(ready),
                "numberUnavailable": len(eligible) - len(ready),
            }
            for k in ("numberAvailable", "numberUnavailable", "updatedNumberScheduled"):
                if not status[k]:
                    del status[k]
            if status != ds.get("status"):
                s.patch(
                    self.R("daemonsets"),
                    ns,
                    name,
                    {"status": _replace_all(ds.get("status"), status)},
                    subresource="status",
                )

    def schedule(self) -> None:
        s = self.store
        nodes = s.list(self.R("nodes"))
        pods = self._pods()
        # Extended resources (nvidia.com/*: GPUs, MIG devices, shared replicas) in use per node.
        used: dict[str, dict[str, int]] = {}
        count: dict[str, int] = {}
        for p in pods:
            n = p["spec"].get("nodeName")
            if n and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                for r, q in _extended_requests(p).items():
                    used.setdefault(n, {})[r] = used.get(n, {}).get(r, 0) + q
                count[n] = count.get(n, 0) + 1
        for p in pods:
            if p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp"):
                continue
            if p["spec"].get("schedulerName", "default-scheduler") != "default-scheduler":
                continue
            reasons: dict[str, int] = {}
            best: Obj | None = None
            best_score: tuple[int, int] = (0, 0)
            need = _extended_requests(p)
            for n in nodes:
                name = n["metadata"]["name"]
                why = node_fits(p["spec"], n)
                if why is None and not node_ready(n):
                    why = "node(s) were not ready"
                alloc = u.dig(n, "status", "allocatable") or {}
                short = [
                    r
                    for r, q in sorted(need.items())
                    if u.quantity_to_int(alloc.get(r)) - used.get(name, {}).get(r, 0) < q
                ]
                if why is None and short:
                    why = f"Insufficient {short[0]}"
                if why is None and count.get(name, 0) >= u.quantity_to_int(alloc.get("pods") or 110):
                    why = "Too many pods"
                if why:
                    reasons[why] = reasons.get(why, 0) + 1
                    continue
                score = (preference(p["spec"], n), -count.get(name, 0))
                if best is None or score > best_score:
                    best, best_score = n, score
            ns, pname = p["metadata"]["namespace"], p["metadata"]["name"]
            if best is not None:
                node_name = best["metadata"]["name"]
                count[node_name] = count.get(node_name, 0) + 1
                for r, q in need.items():
                    used.setdefault(node_name, {})[r] = used.get(node_name, {}).get(r, 0) + q

                def bind(o: Obj, node_name: str = node_name) -> None:
                    o["spec"]["nodeName"] = node_name

                s.mutate(self.R("pods"), ns, pname, bind)
                s.patch(
                    self.R("pods"),
                    ns,
                    pname,
                    {
                        "status": {
                            "conditions": [
                                {"type": "PodScheduled", "status": "True", "lastTransitionTime": u.iso()}
                            ]
                        }
                    },
                    subresource="status",
                )
            else:
                detail = ", ".join(f"{v} {k}" for k, v in sorted(reasons.items()))
                msg = (
                    f"0/{len(nodes)} nodes are available: {detail}."
                    if nodes
                    else "no nodes available to schedule pods"
                )
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}
                old = next(
                    (c for c in u.dig(p, "status", "conditions") or [] if c.get("type") == "PodScheduled"), {}
                )
                if {k: old.get(k) for k in cond} != cond:
                    s.patch(
                        self.R("pods"),
                        ns,
                        pname,
                        {"status": {"conditions": [{**cond, "lastTransitionTime": u.iso()}]}},
                        subresource="status",
                    )

    def garbage(self) -> None:
        """Pods on nodes that no longer exist; objects whose controller is gone."""
        s = self.store
        node_names = {n["metadata"]["name"] for n in s.list(self.R("nodes"))}
        uids: set[str] = set()
        with s.lock:
            for o in s.objects.values():
                uids.add(o["metadata"]["uid"])
            orphans = []
            for (rid, ns, name), o in list(s.objects.items()):
                refs = o["metadata"].get("ownerReferences") or []
                if refs and not any(r.get("uid") in uids for r in refs):
                    orphans.append((rid, ns, name))
        for rid, ns, name in orphans:
            res = s.lookup(rid)
            if res is not None:
                with contextlib.suppress(ApiError):
                    s.delete(res, ns, name)
        for p in self._pods():
            node = p["spec"].get("nodeName")
            if node and node not in node_names:
                s.remove_now(self.R("pods"), p["metadata"]["namespace"], p["metadata"]["name"])

    # ------------------------------------------------------------------------------------- PDBs
    def _pdb_numbers(self, pdb: Obj, pods: list[Obj]) -> tuple[int, int, int, list[Obj]]:
        sel = u.dig(pdb, "spec", "selector")
        matched = [
            p
            for p in pods
            if u.match_label_selector(sel, p["metadata"].get("labels"))
            and not p["metadata"].get("deletionTimestamp")
        ]
        healthy = sum(1 for p in matched if pod_ready(p))
        expected = len(matched)
        spec = pdb.get("spec") or {}
        if spec.get("minAvailable") is not None:
            desired = _pct_or_int(spec["minAvailable"], expected, round_up=True)
        elif spec.get("maxUnavailable") is not None:
            desired = expected - _pct_or_int(spec["maxUnavailable"], expected, round_up=True)
        else:
            desired = expected
        return healthy, max(desired, 0), expected, matched

    def pdb_status(self) -> None:
        s = self.store
        for pdb in s.list(self.R("poddisruptionbudgets")):
            ns = pdb["metadata"]["namespace"]
            healthy, desired, expected, _ = self._pdb_numbers(pdb, self._pods(ns))
            allowed = max(0, healthy - desired)
            status = {
                "currentHealthy": healthy,
                "desiredHealthy": desired,
                "disruptionsAllowed": allowed,
                "expectedPods": expected,
                "observedGeneration": pdb["metadata"].get("generation", 1),
                "conditions": [
                    {
                        "type": "DisruptionAllowed",
                        "status": "True" if allowed else "False",
                        "reason": "SufficientPods" if allowed else "InsufficientPods",
                        "message": "",
                        "observedGeneration": pdb["metadata"].get("generation", 1),
                        "lastTransitionTime": u.dig(pdb, "status", "conditions", 0, "lastTransitionTime")
                        or u.iso(),
                    }
                ],
            }
            if status != pdb.get("status"):
                s.patch(
                    self.R("poddisruptionbudgets"),
                    ns,
                    pdb["metadata"]["name"],
                    {"status": _replace_all(pdb.get("status"), status)},
                    subresource="status",
                )

    def evict(self, res: Resource, ns: str, name: str, body: Obj) -> tuple[int, Obj]:
        s = self.store
        pod = s.get(res, ns, name)
        ok = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        if pod["metadata"].get("deletionTimestamp"):
            return 201, ok
        if not pod["spec"].get("nodeName") or (pod.get("status") or {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            s.delete(res, ns, name, 0)
            return 201, ok
        pdbs = [
            p
            for p in s.list(self.R("poddisruptionbudgets"), ns)
            if u.match_label_selector(u.dig(p, "spec", "selector"), pod["metadata"].get("labels"))
        ]
        if len(pdbs) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
                "support.",
            )
        if pdbs:
            healthy, desired, _expected, _ = self._pdb_numbers(pdbs[0], self._pods(ns))
            if (pod_ready(pod) and healthy - desired <= 0) or (not pod_ready(pod) and healthy < desired):
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdbs[0]['metadata']['name']} needs "
                                f"{desired} "
                                f"healthy pods and has {healthy} currently",
                            }
                        ]
                    },
                )
        grace = u.dig(body, "deleteOptions", "gracePeriodSeconds")
        s.delete(res, ns, name, grace)
        return 201, ok

    def pod_log(self, ns: str, name: str, container: str) -> str:
        pod = self.store.get(self.R("pods"), ns, name)
        lines = []
        for cs in (u.dig(pod, "status", "initContainerStatuses") or []) + (
            u.dig(pod, "status", "containerStatuses") or []
        ):
            if container and cs.get("name") != container:
                continue
            state = cs.get("state") or {}
            for kind, detail in state.items():
                msg = (detail or {}).get("message") or (detail or {}).get("reason") or kind
                lines.append(f"[{cs.get('name')}] {msg}")
        return "\n".join(lines) + ("\n" if lines else "")

    # --------------------------------------------------------------------- node-feature-discovery
    def _running(self, label_selector: str) -> list[Obj]:
        return [p for p in self.store.list(self.R("pods"), None, label_selector) if pod_ready(p)]

    def nfd_master(self) -> None:
        """nfd-master: node labels from the NodeFeature objects the workers publish."""
        s = self.store
        nf_res = s.lookup("nodefeatures.nfd.k8s-sigs.io")
        if nf_res is None or not self._running("app.kubernetes.io/name=node-feature-discovery,role=master"):
            return
        features: dict[str, dict[str, str]] = {}
        for nf in s.list(nf_res):
            node = (nf["metadata"].get("labels") or {}).get("nfd.node.kubernetes.io/node-name")
            if node:
                features.setdefault(node, {}).update(u.dig(nf, "spec", "labels") or {})
        for node in s.list(self.R("nodes")):
            name = node["metadata"]["name"]
            labels = node["metadata"].get("labels") or {}
            annotations = node["metadata"].get("annotations") or {}
            had = [x for x in (annotations.get(NFD_ANNOTATION) or "").split(",") if x]
            want = features.get(name, {})
            patch_labels: dict[str, Any] = {}
            for short in had:
                full = short if "/" in short else NFD_PREFIX + short
                if full not in want:
                    patch_labels[full] = None
            for k, v in want.items():
                if labels.get(k) != v:
                    patch_labels[k] = v
            names = ",".join(sorted(k[len(NFD_PREFIX) :] if k.startswith(NFD_PREFIX) else k for k in want))
            if patch_labels or annotations.get(NFD_ANNOTATION, "") != names:
                s.patch(
                    self.R("nodes"),
                    "",
                    name,
                    {
                        "metadata": {
                            "labels": patch_labels or None,
                            "annotations": {NFD_ANNOTATION: names or None},
                        }
                    },
                )

    # ------------------------------------------------------------------------------ GPU Operator
    def gpu_operator(self) -> None:
        from . import kube_operator

        kube_operator.reconcile(self)


def _replace_all(old: Any, new: Obj) -> Obj:
    """A merge patch that makes the target exactly ``new`` (keys of ``old`` not in new become null)."""
    patch: Obj = {k: None for k in (old or {}) if k not in new}
    patch.update(new)
    return patch
