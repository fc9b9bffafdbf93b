"""The host as Kubernetes sees it: its Node object (kube-node.json), and on the control plane the
namespaces, ResourceQuotas and LimitRanges the declared GPU tenants need (kube-tenants.json)."""

from __future__ import annotations

from typing import Any

from provisioner.probes.base import ERROR, SKIP, HostFacts, ParseError, Probe, Unavailable, parse_json_object

KUBE_NODE = "kube-node.json"

_KUBE_NODE = r"""
    if [ -r /etc/kubernetes/admin.conf ]; then kc=/etc/kubernetes/admin.conf
    elif [ -r /etc/kubernetes/kubelet.conf ]; then kc=/etc/kubernetes/kubelet.conf
    else echo "not a Kubernetes node: no /etc/kubernetes/admin.conf or kubelet.conf" >&2; return 200; fi
    command -v kubectl >/dev/null 2>&1 || {
      echo "kubectl not found (kubeconfig $kc present)" >&2; return 127; }
    read n </proc/sys/kernel/hostname; n=$(printf '%s' "$n" | tr 'A-Z' 'a-z')
    t 30 kubectl --kubeconfig "$kc" --request-timeout=20s get node "$n" -o json
"""

# The cluster's namespaces, ResourceQuotas and LimitRanges, for the declared GPU tenants: read on the
# control plane with its admin kubeconfig (a kubelet may not read them), in one request.
KUBE_TENANTS = "kube-tenants.json"
_KUBE_TENANTS = r"""
    [ -r /etc/kubernetes/admin.conf ] || {
      echo "not the control plane: no /etc/kubernetes/admin.conf" >&2; return 200; }
    command -v kubectl >/dev/null 2>&1 || { echo "kubectl not found" >&2; return 127; }
    t 30 kubectl --kubeconfig /etc/kubernetes/admin.conf --request-timeout=20s \
      get namespaces,resourcequotas,limitranges -A -o json
"""

PROBES: tuple[Probe, ...] = (
    Probe(KUBE_NODE, _KUBE_NODE, 35, "this host's Kubernetes Node object"),
    Probe(KUBE_TENANTS, _KUBE_TENANTS, 35, "namespaces, ResourceQuotas and LimitRanges (control plane)"),
)


def parse_kube_node(text: str) -> dict[str, Any]:
    node = parse_json_object(text, KUBE_NODE)
    if node.get("kind") != "Node":
        raise ParseError(f"{KUBE_NODE}: not a Node object (kind {node.get('kind')!r})")
    return node


def kube_node(facts: HostFacts) -> dict[str, Any]:
    """The host's Node object, from a probe that succeeded: what a probe that did not means (no node, not
    registered, kubectl failing) is the checks' to judge."""
    return facts.parsed("kube-node", lambda: parse_kube_node(facts.ok_text(KUBE_NODE)))


class Cluster:
    """The namespaces, ResourceQuotas and LimitRanges of the probe's List."""

    def __init__(self, doc: dict[str, Any]) -> None:
        items = doc.get("items")
        if doc.get("kind") != "List" or not isinstance(items, list):
            raise Unavailable(ERROR, f"{KUBE_TENANTS}: not a List of objects (kind {doc.get('kind')!r})")
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.quotas: dict[str, list[dict[str, Any]]] = {}
        self.limit_ranges: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict):
                raise Unavailable(ERROR, f"{KUBE_TENANTS}: an item is not a Kubernetes object")
            meta = item["metadata"]
            kind = item.get("kind")
            if kind == "Namespace":
                self.namespaces[str(meta.get("name"))] = item
            elif kind == "ResourceQuota":
                self.quotas.setdefault(str(meta.get("namespace")), []).append(item)
            elif kind == "LimitRange":
                self.limit_ranges.setdefault(str(meta.get("namespace")), []).append(item)


def tenant_objects(facts: HostFacts) -> Cluster:
    """The cluster's tenant objects; skip on a host that is not the control plane."""
    res = facts.result(KUBE_TENANTS)
    if res.not_applicable:
        raise Unavailable(SKIP, f"{res.reason()} (tenants are checked on the control plane)")
    if not res.ok:
        raise Unavailable(ERROR, f"kubectl get namespaces,resourcequotas,limitranges failed: {res.reason()}")
    return facts.parsed("kube-tenants", lambda: Cluster(parse_json_object(res.stdout, KUBE_TENANTS)))
