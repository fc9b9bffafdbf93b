"""This node's DCGM exporter (dcgm-exporter.json): its pods on the node and, when one runs, the metrics
page it serves."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from provisioner.probes.base import ERROR, SKIP, HostFacts, ParseError, Probe, Unavailable, parse_json_object
from provisioner.probes.prometheus import Sample, parse_prometheus_text

# The DCGM exporter of this node, scraped from the node itself. The GPU Operator runs it with no host
# port: containerPort 9400 ("metrics") behind a ClusterIP Service (NVIDIA/gpu-operator v25.10.0
# assets/state-dcgm-exporter 0400_service.yaml, 0800_daemonset.yaml), so the probe asks the API server
# for the exporter pod on this node and GETs http://<pod IP>:<port>/metrics (pod IPs are reachable from
# every node: the Kubernetes network model). It reads with the kubelet's own credentials, which the Node
# authorizer lets list pods only with the field selector spec.nodeName=<this node> (kubernetes/kubernetes
# plugin/pkg/auth/authorizer/node/node_authorizer.go, authorizePod: "can only list/watch pods with
# spec.nodeName field selector"; selector authorization is on by default from v1.32 and GA in v1.34), and
# that is the query made here; a label selector narrows it further. The kubelet's identity is
# system:node:<node name>, the node name being the host name as kubeadm registers it (lower-cased), the
# name the kube-node.json probe reads too. Standard library only (Python 3.8+), no proxy, bounded time
# and size; the pod IP is checked to be an IP address before it becomes a URL. Prints one JSON object:
# {"node", "kubeconfig", "pods": [{"namespace", "name", "phase", "ready", "reason", "ip", "port"}],
# "scrape": null | {"pod", "url", "status", "error", "truncated"}, "metrics": text}.
DCGM_EXPORTER = "dcgm-exporter.json"
DCGM_EXPORTER_LABEL = "app=nvidia-dcgm-exporter"
DCGM_EXPORTER_MAX_BYTES = 8 * 1024 * 1024
_DCGM_EXPORTER_PY = r"""
import ipaddress, json, subprocess, sys, urllib.error, urllib.request

kubeconfig, node, selector, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cmd = ["kubectl", "--kubeconfig", kubeconfig, "--request-timeout=15s", "get", "pods", "-A", "-l", selector,
       "--field-selector", "spec.nodeName=" + node, "-o", "json"]
try:
    run = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         timeout=25)
except subprocess.TimeoutExpired:
    sys.stderr.write("kubectl get pods timed out\n")
    sys.exit(124)
if run.returncode != 0:
    sys.stderr.write(run.stderr.decode("utf-8", "replace")[-2000:])
    sys.exit(run.returncode if 0 < run.returncode < 126 else 1)
pods = []
for item in json.loads(run.stdout.decode("utf-8", "replace")).get("items") or []:
    meta, status, spec = item.get("metadata") or {}, item.get("status") or {}, item.get("spec") or {}
    conditions, containers = status.get("conditions") or [], status.get("containerStatuses") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason") for c in containers]
    port = 9400
    for container in spec.get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == "metrics" and isinstance(p.get("containerPort"), int):
                port = p["containerPort"]
    pods.append({"namespace": meta.get("namespace"), "name": meta.get("name"), "phase": status.get("phase"),
                 "ready": ready, "reason": status.get("reason") or next((w for w in waiting if w), None),
                 "ip": status.get("podIP"), "port": port})
out = {"node": node, "kubeconfig": kubeconfig, "pods": pods, "scrape": None, "metrics": ""}
target = next((p for p in pods if p["phase"] == "Running" and p["ip"]), None)
if target is not None:
    scrape = {"pod": "%s/%s" % (target["namespace"], target["name"]), "url": None, "status": None,
              "error": None, "truncated": False}
    out["scrape"] = scrape
    try:
        ip = ipaddress.ip_address(str(target["ip"]))
    except ValueError:
        scrape["error"] = "the pod IP is not an IP address"
        ip = None
    if ip is not None and 0 < target["port"] < 65536:
        scrape["url"] = "http://%s:%d/metrics" % ("[%s]" % ip if ip.version == 6 else ip, target["port"])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        body = b""
        try:
            with opener.open(scrape["url"], timeout=10) as resp:
                scrape["status"] = resp.status
                body = resp.read(limit + 1)
        except urllib.error.HTTPError as exc:
            scrape["status"], scrape["error"] = exc.code, "HTTP %d" % exc.code
        except (urllib.error.URLError, OSError) as exc:
            scrape["error"] = str(getattr(exc, "reason", exc))[:300]
        scrape["truncated"] = len(body) > limit
        out["metrics"] = body[:limit].decode("utf-8", "replace")
sys.stdout.write(json.dumps(out))
"""


def _dcgm_exporter_body() -> str:
    import base64

    encoded = base64.b64encode(textwrap.dedent(_DCGM_EXPORTER_PY).encode()).decode()
    return (
        "if [ -r /etc/kubernetes/kubelet.conf ]; then kc=/etc/kubernetes/kubelet.conf\n"
        "elif [ -r /etc/kubernetes/admin.conf ]; then kc=/etc/kubernetes/admin.conf\n"
        'else echo "not a Kubernetes node: no /etc/kubernetes/kubelet.conf or admin.conf" >&2\n'
        "  return 200; fi\n"
        "command -v kubectl >/dev/null 2>&1 || {\n"
        '  echo "kubectl not found (kubeconfig $kc present)" >&2; return 127; }\n'
        'command -v python3 >/dev/null 2>&1 || { echo "python3 not found" >&2; return 127; }\n'
        "read n </proc/sys/kernel/hostname; n=$(printf '%s' \"$n\" | tr 'A-Z' 'a-z')\n"
        f"printf '%s' '{encoded}' | base64 -d | t 45 python3 - \"$kc\" \"$n\" "
        f"{DCGM_EXPORTER_LABEL} {DCGM_EXPORTER_MAX_BYTES}"
    )


PROBES: tuple[Probe, ...] = (
    Probe(DCGM_EXPORTER, _dcgm_exporter_body(), 50, "this node's DCGM exporter pod and its /metrics"),
)


@dataclass(frozen=True)
class ExporterPod:
    namespace: str
    name: str
    phase: str
    ready: bool
    reason: str
    ip: str


@dataclass(frozen=True)
class ExporterScrape:
    pod: str
    url: str
    status: int | None
    error: str
    truncated: bool


@dataclass(frozen=True)
class ExporterProbe:
    """dcgm-exporter.json: the exporter pods on the node and, when one runs, what its /metrics said."""

    node: str
    pods: list[ExporterPod]
    scrape: ExporterScrape | None
    metrics: str


def _str_field(doc: dict[str, Any], key: str, where: str, optional: bool = True) -> str:
    value = doc.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise ParseError(f"{DCGM_EXPORTER}: {where}.{key} is not a string")
    return value


def parse_dcgm_exporter(text: str) -> ExporterProbe:
    """The probe's JSON, checked field by field (the pod list and the page come from the cluster)."""
    doc = parse_json_object(text, DCGM_EXPORTER)
    pods_raw = doc.get("pods")
    if not isinstance(pods_raw, list):
        raise ParseError(f"{DCGM_EXPORTER}: pods is not a list")
    pods = []
    for i, raw in enumerate(pods_raw):
        if not isinstance(raw, dict):
            raise ParseError(f"{DCGM_EXPORTER}: pods[{i}] is not an object")
        w = f"pods[{i}]"
        pods.append(
            ExporterPod(
                _str_field(raw, "namespace", w),
                _str_field(raw, "name", w),
                _str_field(raw, "phase", w),
                raw.get("ready") is True,
                _str_field(raw, "reason", w),
                _str_field(raw, "ip", w),
            )
        )
    scrape: ExporterScrape | None = None
    raw_scrape = doc.get("scrape")
    if raw_scrape is not None:
        if not isinstance(raw_scrape, dict):
            raise ParseError(f"{DCGM_EXPORTER}: scrape is not an object")
        status = raw_scrape.get("status")
        if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
            raise ParseError(f"{DCGM_EXPORTER}: scrape.status is not an HTTP status")
        scrape = ExporterScrape(
            _str_field(raw_scrape, "pod", "scrape"),
            _str_field(raw_scrape, "url", "scrape"),
            status,
            _str_field(raw_scrape, "error", "scrape"),
            raw_scrape.get("truncated") is True,
        )
    return ExporterProbe(_str_field(doc, "node", "probe"), pods, scrape, _str_field(doc, "metrics", "probe"))


def exporter_probe(facts: HostFacts) -> ExporterProbe:
    res = facts.result(DCGM_EXPORTER)
    if res.not_applicable:
        raise Unavailable(SKIP, res.reason())
    if not res.ok:
        text = res.stderr + res.stdout
        hint = " (the node's credentials may list only its own pods)" if "Forbidden" in text else ""
        raise Unavailable(ERROR, f"listing the exporter pods failed: {res.reason()}{hint}")
    return facts.parsed("dcgm-exporter", lambda: parse_dcgm_exporter(res.stdout))


def exporter_samples(facts: HostFacts) -> list[Sample]:
    """The samples of the page the exporter served."""
    probe = exporter_probe(facts)
    return facts.parsed("dcgm-exporter-metrics", lambda: parse_prometheus_text(probe.metrics))
