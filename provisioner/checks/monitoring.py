"""GPU monitoring: the DCGM exporter serves this node's GPUs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from provisioner.checks.cluster import node_object
from provisioner.checks.model import ERROR, FAIL, PASS, SKIP, Finding, Unavailable, check, outcome
from provisioner.expectations import Expectations
from provisioner.hostnumbers import is_index
from provisioner.hosttext import short_safe_text
from provisioner.probes import exporter, host, smi
from provisioner.probes.base import HostFacts
from provisioner.probes.exporter import DCGM_EXPORTER, DCGM_EXPORTER_LABEL, DCGM_EXPORTER_MAX_BYTES
from provisioner.probes.host import HOST_FACTS
from provisioner.probes.kubernetes import KUBE_NODE
from provisioner.probes.prometheus import Sample
from provisioner.probes.smi import SMI_XML

# The series a working exporter has for every GPU: all four are in the collectors the GPU Operator runs it
# with (NVIDIA/dcgm-exporter 4.4.1-4.6.0, the chart's default image: etc/dcp-metrics-included.csv).
REQUIRED_METRICS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_XID_ERRORS",
)
# The GPU Operator labels a node with nvidia.com/gpu.deploy.dcgm-exporter=true where it runs the exporter
# (its DaemonSet's nodeSelector: NVIDIA/gpu-operator v25.10.0 assets/state-dcgm-exporter/0800_daemonset.yaml).
DEPLOY_LABEL = "nvidia.com/gpu.deploy.dcgm-exporter"
# The labels dcgm-exporter puts on a GPU's series (internal/pkg/rendermetrics/render_metrics.go): gpu (the
# index), UUID (the name is configurable; older releases wrote uuid), and for a MIG device GPU_I_ID.
_UUID_LABELS = ("UUID", "uuid")


def _expected(facts: HostFacts, exp: Expectations) -> tuple[str, dict[str, Any]]:
    """The node's name and object when the exporter is expected here; skip otherwise."""
    host.require_gpu(facts)
    if exp.dcgm_exporter is False:
        raise Unavailable(SKIP, f"not expected on this host ({exp.source('monitoring.dcgm_exporter')})")
    node = node_object(facts, exp)
    name = str((node.get("metadata") or {}).get("name", "?"))
    labels = (node.get("metadata") or {}).get("labels") or {}
    if exp.dcgm_exporter is None and labels.get(DEPLOY_LABEL) != "true":
        raise Unavailable(
            SKIP,
            f"no expectation: monitoring.dcgm_exporter is not declared and node {name} has no "
            f"{DEPLOY_LABEL}=true label (the GPU Operator does not run the exporter there)",
        )
    return name, node


def _where(exp: Expectations) -> str:
    if exp.dcgm_exporter:
        return exp.source("monitoring.dcgm_exporter")
    return f"node label {DEPLOY_LABEL}=true, set by the GPU Operator"


@check("monitoring.dcgm_exporter", probes=(DCGM_EXPORTER, KUBE_NODE, HOST_FACTS, SMI_XML), severity="medium")
def dcgm_exporter(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """the node's DCGM exporter serves utilization, memory, temperature and Xid series for every GPU"""
    node, _ = _expected(facts, exp)
    where = f"({_where(exp)})"
    probe = exporter.exporter_probe(facts)
    if not probe.pods:
        if exp.dcgm_exporter is None:
            # The operator labels every GPU node for its exporter whether or not the ClusterPolicy runs one
            # (dcgmExporter.enabled: false leaves the label): without a declaration, no pod is no verdict.
            raise Unavailable(
                SKIP,
                f"no DCGM exporter pod on node {node}, and monitoring.dcgm_exporter is not declared (the "
                "GPU Operator may run without its exporter; declare it to have this judged)",
            )
        return [outcome(FAIL, f"no DCGM exporter pod ({DCGM_EXPORTER_LABEL}) on node {node} {where}")]
    scrape = probe.scrape
    if scrape is None:
        pod = probe.pods[0]
        why = f" ({short_safe_text(pod.reason, 60)})" if pod.reason else ""
        return [
            outcome(
                FAIL,
                f"DCGM exporter pod {short_safe_text(pod.namespace, 63)}/{short_safe_text(pod.name, 63)} "
                f"on node {node} is {short_safe_text(pod.phase or 'in no phase', 20)}{why}, not Running "
                + where,
            )
        ]
    pod, url = short_safe_text(scrape.pod, 130), short_safe_text(scrape.url, 80)
    if scrape.error or scrape.status != 200:
        why = short_safe_text(scrape.error or f"HTTP {scrape.status}", 120)
        return [outcome(FAIL, f"DCGM exporter pod {pod}: GET {url or '/metrics'} failed: {why} {where}")]
    if scrape.truncated:
        return [
            outcome(
                ERROR, f"DCGM exporter pod {pod}: /metrics is larger than {DCGM_EXPORTER_MAX_BYTES} bytes"
            )
        ]
    samples = exporter.exporter_samples(facts)
    return _judge(facts, node, pod, samples, where)


def _judge(facts: HostFacts, node: str, pod: str, samples: list[Sample], where: str) -> list[Finding]:
    """One series per GPU (per MIG device on a MIG-enabled GPU) for each required metric."""
    try:
        gpus = [(g.index, g.uuid, g.bus_id) for g in smi.smi_log(facts).gpus]
    except Unavailable:
        gpus = [(i, "", d.address) for i, d in enumerate(host.pci_gpus(facts))]
    by_uuid = {uuid: index for index, uuid, _ in gpus if uuid}
    indexes = {index for index, _, _ in gpus}
    series: dict[str, Counter[tuple[int, str]]] = {m: Counter() for m in REQUIRED_METRICS}
    strangers: set[str] = set()
    for s in samples:
        if s.name not in series:
            continue
        uuid = next((s.labels[k] for k in _UUID_LABELS if k in s.labels), "")
        index = by_uuid.get(uuid) if uuid else None
        if index is None and not uuid and is_index(s.labels.get("gpu", "")):
            index = int(s.labels["gpu"]) if int(s.labels["gpu"]) in indexes else None
        if index is None:
            strangers.add(short_safe_text(uuid or f"gpu {s.labels.get('gpu', '?')}", 60))
            continue
        series[s.name][(index, s.labels.get("GPU_I_ID", ""))] += 1
    findings: list[Finding] = []
    missing = [m for m, counts in series.items() if not counts]
    if missing:
        findings.append(outcome(FAIL, f"DCGM exporter pod {pod} serves no {', '.join(missing)} {where}"))
    for index, _uuid, bus in gpus:
        lacking = [m for m, counts in series.items() if counts and not any(k[0] == index for k in counts)]
        doubled = [
            m for m, counts in series.items() if any(k[0] == index and n > 1 for k, n in counts.items())
        ]
        problems = []
        if lacking:
            problems.append(f"no {', '.join(lacking)} series")
        if doubled:
            problems.append(f"more than one {', '.join(doubled)} series")
        if problems:
            findings.append(
                outcome(
                    FAIL, f"GPU {index}: {'; '.join(problems)} from exporter pod {pod}", gpu=index, bus_id=bus
                )
            )
    if strangers:
        findings.append(
            outcome(
                FAIL,
                f"exporter pod {pod} serves series for GPUs this host does not have: {sorted(strangers)[:4]}",
            )
        )
    if findings:
        return findings
    return [
        outcome(
            PASS,
            f"DCGM exporter pod {pod} on node {node} serves {len(REQUIRED_METRICS)} metrics for each of "
            f"{len(gpus)} GPU(s)",
            pod=pod,
            gpus=len(gpus),
        )
    ]
