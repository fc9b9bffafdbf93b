"""Kubernetes node state, DCGM diagnostics and the container smoke test."""

from __future__ import annotations

from typing import Any

from provisioner.checks.model import ERROR, FAIL, PASS, SKIP, WARN, Finding, Unavailable, check, outcome
from provisioner.expectations import Expectations
from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.hosttext import short_safe_text
from provisioner.probes import container, dcgm, host, kubernetes, mig, smi
from provisioner.probes.base import HostFacts
from provisioner.probes.container import SMOKE
from provisioner.probes.dcgm import DCGM_DIAG
from provisioner.probes.host import HOST_FACTS
from provisioner.probes.kubernetes import KUBE_NODE
from provisioner.probes.mig import SMI_LIST
from provisioner.probes.smi import SMI_XML


def _node(facts: HostFacts, exp: Expectations) -> dict[str, Any]:
    res = facts.result(KUBE_NODE)
    if res.not_applicable:
        if exp.k8s_node:
            raise Unavailable(FAIL, f"expected a Kubernetes node ({exp.source('k8s.node')}): {res.reason()}")
        raise Unavailable(SKIP, res.reason())
    if not res.ok:
        text = res.stderr + res.stdout
        if "NotFound" in text or ("not found" in text and "nodes" in text):
            raise Unavailable(FAIL, f"this host is not registered as a node: {res.reason()}")
        raise Unavailable(ERROR, f"kubectl get node failed: {res.reason()}")
    return kubernetes.kube_node(facts)


def node_object(facts: HostFacts, exp: Expectations) -> dict[str, Any]:
    """The host's Node object (kube-node.json); skip/fail/error as k8s.node_ready would say."""
    return _node(facts, exp)


@check("k8s.node_ready", probes=(KUBE_NODE,), severity="high")
def k8s_node_ready(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """the host's Kubernetes node is Ready"""
    node = _node(facts, exp)
    name = (node.get("metadata") or {}).get("name", "?")
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None)
    cordoned = " (cordoned)" if (node.get("spec") or {}).get("unschedulable") else ""
    if ready is None:
        return [outcome(ERROR, f"node {name}: no Ready condition reported")]
    if ready.get("status") == "True":
        return [outcome(PASS, f"node {name} Ready{cordoned}", node=name, cordoned=bool(cordoned))]
    why = ready.get("reason") or ""
    msg = ready.get("message") or ""
    return [outcome(FAIL, f"node {name} not Ready ({ready.get('status')}): {why} {msg}".strip(), node=name)]


@check("k8s.gpu_allocatable", probes=(KUBE_NODE, HOST_FACTS, SMI_XML, SMI_LIST), severity="high")
def k8s_gpu_allocatable(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """allocatable nvidia.com/gpu = GPU count (× replicas; MIG devices by the MIG strategy)"""
    node = _node(facts, exp)
    name = (node.get("metadata") or {}).get("name", "?")
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus = len(host.pci_gpus(facts))
    raw = allocatable.get("nvidia.com/gpu")
    if gpus == 0:
        if raw in (None, "0"):
            raise Unavailable(SKIP, f"node {name} has no GPU")
        return [outcome(FAIL, f"node {name} advertises nvidia.com/gpu={raw} but has no GPU on the PCI bus")]
    try:
        mig_gpus = [g.index for g in smi.smi_log(facts).gpus if g.mig_mode == "Enabled"]
    except Unavailable:
        mig_gpus = []
    if mig_gpus:
        labels = (node.get("metadata") or {}).get("labels") or {}
        return _mig_allocatable(facts, exp, name, labels, allocatable, gpus, mig_gpus)
    if raw is None:
        return [
            outcome(
                FAIL,
                f"node {name} advertises no nvidia.com/gpu ({gpus} GPU(s) on the host): device "
                "plugin not running?",
                expected=gpus,
            )
        ]
    try:
        # A count the API server holds: whole, not negative; a million is far above any node's.
        count = parse_int(str(raw), hi=1_000_000, what="allocatable nvidia.com/gpu")
    except HostNumberError:
        shown = short_safe_text(str(raw), 40)
        return [outcome(ERROR, f"node {name}: allocatable nvidia.com/gpu={shown!r} is not a GPU count")]
    replicas = _replicas(exp)
    expected = gpus * replicas
    per = (
        f" ({gpus} GPU(s) × {replicas} replicas, {exp.source('gpu.sharing.replicas')})"
        if replicas > 1
        else ""
    )
    if count != expected:
        return [
            outcome(
                FAIL,
                f"node {name} advertises nvidia.com/gpu={count}, expected {expected}{per}"
                if per
                else f"node {name} advertises nvidia.com/gpu={count}, host has {gpus} GPU(s)",
                allocatable=count,
                expected=expected,
            )
        ]
    return [outcome(PASS, f"node {name} advertises nvidia.com/gpu={count}{per}", allocatable=count)]


# gpu-feature-discovery labels a node with the device plugin's MIG strategy (NVIDIA k8s-device-plugin,
# internal/lm: nvidia.com/mig.strategy = none, single or mixed).
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"


def mig_resources(devices: dict[int, dict[str, int]], strategy: str, whole_gpus: int) -> dict[str, int]:
    """What the device plugin advertises for these MIG devices: under mixed, nvidia.com/mig-<profile> per
    profile (and nvidia.com/gpu for the GPUs with MIG off); under single, every MIG device as nvidia.com/gpu
    (NVIDIA k8s-device-plugin, internal/rm: defaultMigResource names "mig-" + profile under mixed, "gpu"
    under single)."""
    if strategy == "single":
        return {"nvidia.com/gpu": sum(n for counts in devices.values() for n in counts.values())}
    out: dict[str, int] = {}
    for counts in devices.values():
        for profile, n in counts.items():
            out[f"nvidia.com/mig-{profile}"] = out.get(f"nvidia.com/mig-{profile}", 0) + n
    if whole_gpus:
        out["nvidia.com/gpu"] = whole_gpus
    return out


def _mig_allocatable(
    facts: HostFacts,
    exp: Expectations,
    name: str,
    labels: dict[str, Any],
    allocatable: dict[str, Any],
    gpus: int,
    mig_gpus: list[int],
) -> list[Finding]:
    strategy, where = exp.mig_strategy, exp.source("mig.strategy")
    if strategy is None:
        strategy, where = labels.get(MIG_STRATEGY_LABEL), f"node label {MIG_STRATEGY_LABEL}"
    if strategy not in ("single", "mixed"):
        shown = short_safe_text(str(strategy), 20) if strategy else "unset"
        return [
            outcome(
                FAIL if strategy == "none" else SKIP,
                f"MIG enabled on GPU {', '.join(map(str, mig_gpus))} of node {name}, MIG strategy {shown} "
                f"({where}): no MIG device can be advertised to compare",
            )
        ]
    devices = {i: counts for i, counts in mig.mig_devices(facts).items() if i in mig_gpus}
    want = mig_resources(devices, strategy, gpus - len(mig_gpus))
    have = {
        k: str(v)
        for k, v in allocatable.items()
        if k.startswith("nvidia.com/mig-") or (k == "nvidia.com/gpu" and str(v) != "0")
    }
    wrong = [
        f"{k}={have.get(k, 'none')}, expected {n}" for k, n in sorted(want.items()) if have.get(k) != str(n)
    ]
    wrong += [f"{k}={v}, expected none" for k, v in sorted(have.items()) if k not in want and v != "0"]
    per = f"MIG strategy {strategy} ({where}), {sum(sum(c.values()) for c in devices.values())} MIG device(s)"
    if wrong:
        return [outcome(FAIL, f"node {name}: {'; '.join(wrong)} ({per})", expected=want)]
    shown = ", ".join(f"{k}={n}" for k, n in sorted(want.items())) or "no MIG device"
    return [outcome(PASS, f"node {name} advertises {shown} ({per})", allocatable=want)]


def _replicas(exp: Expectations) -> int:
    """Replicas per GPU the device plugin advertises under the declared sharing (1: none)."""
    if exp.sharing_strategy in ("time-slicing", "mps") and exp.sharing_replicas:
        return exp.sharing_replicas
    return 1


# Labels gpu-feature-discovery puts on a node for the device plugin's sharing (NVIDIA k8s-device-plugin,
# internal/lm/resource.go): the replicas per GPU and the strategy (none, time-slicing, mps).
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
# The MIG manager's protocol (NVIDIA mig-parted, deployments/gpu-operator/reconfigure-mig.sh): the wanted
# layout is the label nvidia.com/mig.config; the manager reports through nvidia.com/mig.config.state:
# pending, rebooting, success or failed.
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"


def _declared_node_labels(
    facts: HostFacts, exp: Expectations, declared: object, what: str, key: str, knob: str
) -> tuple[str, dict[str, str]]:
    """The node's name and labels for a check of something a policy declares: skip on a host without
    GPUs or when nothing is declared."""
    host.require_gpu(facts)
    if declared is None:
        raise Unavailable(SKIP, f"no {what} declared ({key} in a policy, {knob} in the inventory)")
    meta = _node(facts, exp).get("metadata") or {}
    return meta.get("name", "?"), meta.get("labels") or {}


@check("gpu.sharing", probes=(KUBE_NODE, HOST_FACTS), severity="high")
def gpu_sharing(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """the node shares its GPUs as declared (gpu.sharing-strategy and gpu.replicas labels)"""
    name, labels = _declared_node_labels(
        facts, exp, exp.sharing_strategy, "GPU sharing", "gpu.sharing.strategy", "gpuprov_gpu_sharing"
    )
    if not labels.get(SHARING_LABEL) and not labels.get(REPLICAS_LABEL) and exp.sharing_strategy != "none":
        return [
            outcome(FAIL, f"node {name} has no {SHARING_LABEL} label: gpu-feature-discovery not running?")
        ]
    problems = []
    strategy = labels.get(SHARING_LABEL, "none")
    if strategy != exp.sharing_strategy:
        problems.append(f"{SHARING_LABEL}={strategy}, expected {exp.sharing_strategy}")
    want = str(_replicas(exp))
    if labels.get(REPLICAS_LABEL, "1") != want:
        problems.append(f"{REPLICAS_LABEL}={labels.get(REPLICAS_LABEL, '1')}, expected {want}")
    where = f"({exp.source('gpu.sharing.strategy')})"
    if problems:
        return [outcome(FAIL, f"node {name}: " + "; ".join(problems) + f" {where}", strategy=strategy)]
    return [
        outcome(
            PASS, f"node {name} shares its GPUs by {strategy}, {want} replica(s) per GPU", strategy=strategy
        )
    ]


@check("mig.config", probes=(KUBE_NODE, HOST_FACTS, SMI_XML, SMI_LIST), severity="high")
def mig_config(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """the node's MIG layout is the declared one and the MIG manager reports success"""
    name, labels = _declared_node_labels(
        facts, exp, exp.mig_config, "MIG layout", "mig.config", "gpuprov_mig_config"
    )
    wanted, state = labels.get(MIG_CONFIG_LABEL), labels.get(MIG_STATE_LABEL)
    where = f"({exp.source('mig.config')})"
    if wanted != exp.mig_config:
        return [
            outcome(
                FAIL,
                f"node {name}: {MIG_CONFIG_LABEL}={wanted or 'unset'}, expected {exp.mig_config} {where}",
            )
        ]
    if state != "success":
        status = WARN if state in ("pending", "rebooting") else FAIL
        return [
            outcome(
                status,
                f"node {name}: {MIG_STATE_LABEL}={state or 'unset'} for {wanted} "
                "(the MIG manager has not applied it)",
            )
        ]
    try:
        modes = {g.index: g.mig_mode for g in smi.smi_log(facts).gpus}
    except Unavailable:
        modes = {}
    enabled = exp.mig_config != "all-disabled"
    wrong = sorted(i for i, m in modes.items() if m and (m == "Enabled") != enabled)
    if wrong:
        return [
            outcome(
                FAIL,
                f"node {name}: {wanted} applied per the MIG manager, but MIG mode is "
                f"{'off' if enabled else 'on'} on GPU {', '.join(map(str, wrong))}",
            )
        ]
    if not enabled:
        return [outcome(PASS, f"node {name}: MIG layout {wanted} applied ({MIG_STATE_LABEL}=success)")]
    # The layout's own counts per profile are defined in the MIG manager's ConfigMap, which verification
    # does not read; what the node shows is compared with what any MIG layout promises: devices on every
    # MIG-enabled GPU (all-enabled alone leaves them to the user).
    try:
        devices = mig.mig_devices(facts)
    except Unavailable as exc:
        return [
            outcome(PASS, f"node {name}: MIG layout {wanted} applied; MIG devices not counted: {exc.reason}")
        ]
    on = sorted(i for i, m in modes.items() if m == "Enabled")
    empty = [i for i in on if not devices.get(i)]
    if empty and wanted != "all-enabled":
        return [
            outcome(
                FAIL,
                f"node {name}: {wanted} applied per the MIG manager, but GPU {', '.join(map(str, empty))} "
                "has MIG mode on and no MIG device (nvidia-smi -L)",
            )
        ]
    shown = "; ".join(
        f"GPU {i}: " + (", ".join(f"{n} × {p}" for p, n in sorted(devices.get(i, {}).items())) or "none")
        for i in on
    )
    return [
        outcome(
            PASS,
            f"node {name}: MIG layout {wanted} applied ({MIG_STATE_LABEL}=success); MIG devices {shown} "
            "(counts per profile not compared with the layout: it is defined in the MIG manager's ConfigMap)",
            devices={str(i): devices.get(i, {}) for i in on},
        )
    ]


@check("dcgm.diag", probes=(DCGM_DIAG,), severity="high")
def dcgm_diag(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """DCGM diagnostic level 1 passes (where dcgmi is installed)"""
    if not exp.dcgm_diag:
        return [outcome(SKIP, f"disabled by policy ({exp.source('dcgm.diag')})")]
    results = dcgm.diag_results(facts)
    findings: list[Finding] = []
    for r in results:
        if r.status in (FAIL, WARN):
            who = f"GPU {r.gpu}: " if r.gpu is not None else ""
            findings.append(
                outcome(
                    r.status,
                    f"{who}{r.test}: {r.status}" + (f" ({r.info[:160]})" if r.info else ""),
                    gpu=r.gpu,
                )
            )
    if findings:
        return findings
    if not results:
        return [outcome(ERROR, "dcgmi diag reported no test results")]
    return [outcome(PASS, f"DCGM level 1: {sum(r.status == PASS for r in results)} results passed")]


@check("container.smoke", probes=(SMOKE,), severity="high")
def container_smoke(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """a container sees the GPUs (docker run --gpus all IMAGE nvidia-smi -L)"""
    if not exp.container_smoke_image:
        return [outcome(SKIP, "no container.smoke_image configured in the policy")]
    res = facts.result(SMOKE)
    if res.not_applicable:
        return [outcome(SKIP, res.reason())]
    if not res.ok:
        return [outcome(FAIL, f"docker run --gpus all {exp.container_smoke_image} failed: {res.reason()}")]
    listed = container.smoke_gpus(facts)
    try:
        gpus = len(host.pci_gpus(facts))
    except Unavailable:
        gpus = len(listed)
    if len(listed) != gpus:
        return [outcome(FAIL, f"the container sees {len(listed)} GPU(s), the host has {gpus}")]
    return [outcome(PASS, f"the container sees {len(listed)} GPU(s) ({exp.container_smoke_image})")]
