"""The NVIDIA GPU Operator, SIMULATED (gpuprov lab): reconciles the ClusterPolicy the gpu-operator chart
creates, while the operator's own pod runs. It labels the nodes node-feature-discovery found NVIDIA PCI
devices on, creates one DaemonSet per enabled component (names, labels, node selectors, runtime class and
init containers as the real operator makes them) and reports ClusterPolicy ``.status.state``: "ready"
once every component's pods are ready on every GPU node, else "notReady". What the pods do is decided by
the kubelet of each node against that host (kube_let)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from . import kube_util as u
from .kube_store import Obj

if TYPE_CHECKING:
    from .kube_ctrl import Controllers

PRESENT = "nvidia.com/gpu.present"
DEPLOY = "nvidia.com/gpu.deploy."
# (ClusterPolicy key, DaemonSet/app name, deploy label, main container, init containers, nvidia runtime class)
COMPONENTS: list[tuple[str, str, str, str, list[str], bool]] = [
    ("driver", "nvidia-driver-daemonset", "driver", "nvidia-driver-ctr", ["k8s-driver-manager"], False),
    (
        "toolkit",
        "nvidia-container-toolkit-daemonset",
        "container-toolkit",
        "nvidia-container-toolkit-ctr",
        ["driver-validation"],
        False,
    ),
    (
        "devicePlugin",
        "nvidia-device-plugin-daemonset",
        "device-plugin",
        "nvidia-device-plugin",
        ["toolkit-validation"],
        True,
    ),
    ("dcgm", "nvidia-dcgm", "dcgm", "nvidia-dcgm-ctr", ["toolkit-validation"], True),
    (
        "dcgmExporter",
        "nvidia-dcgm-exporter",
        "dcgm-exporter",
        "nvidia-dcgm-exporter",
        ["toolkit-validation"],
        True,
    ),
    (
        "gfd",
        "gpu-feature-discovery",
        "gpu-feature-discovery",
        "gpu-feature-discovery",
        ["toolkit-validation"],
        True,
    ),
    ("migManager", "nvidia-mig-manager", "mig-manager", "nvidia-mig-manager", ["toolkit-validation"], True),
    (
        "nodeStatusExporter",
        "nvidia-node-status-exporter",
        "node-status-exporter",
        "nvidia-node-status-exporter",
        [],
        True,
    ),
    (
        "validator",
        "nvidia-operator-validator",
        "operator-validator",
        "nvidia-operator-validator",
        ["driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation"],
        True,
    ),
]
DEFAULT_ENABLED = {
    "driver": True,
    "toolkit": True,
    "devicePlugin": True,
    "dcgm": False,
    "dcgmExporter": True,
    "gfd": True,
    "migManager": True,
    "nodeStatusExporter": False,
    "validator": True,
}
GPU_NODE_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)


def enabled(spec: Obj, key: str) -> bool:
    if key == "validator":
        return True
    value = u.dig(spec, key, "enabled")
    return DEFAULT_ENABLED[key] if value is None else bool(value) and str(value).lower() != "false"


def is_gpu_node(node: Obj) -> bool:
    labels = u.dig(node, "metadata", "labels") or {}
    return any(labels.get(k) == "true" for k in GPU_NODE_LABELS)


def _image(comp: Obj, default: str) -> str:
    repo, image, version = comp.get("repository"), comp.get("image"), comp.get("version")
    if not image:
        return default
    ref = f"{repo}/{image}" if repo else image
    return (
        f"{ref}:{version}" if version and "@" not in str(version) else f"{ref}@{version}" if version else ref
    )


def _validator_container(name: str, image: str, component: str, extra_env: list[Obj]) -> Obj:
    return {
        "name": name,
        "image": image,
        "command": ["sh", "-c"],
        "args": ["nvidia-validator"],
        "env": [
            {"name": "WITH_WAIT", "value": "true"},
            {"name": "COMPONENT", "value": component},
            *extra_env,
        ],
        "securityContext": {"privileged": True},
        "volumeMounts": [
            {
                "name": "run-nvidia-validations",
                "mountPath": "/run/nvidia/validations",
                "mountPropagation": "Bidirectional",
            }
        ],
    }


def daemonset(
    ns: str, key: str, name: str, deploy: str, container: str, inits: list[str], rc: bool, cp: Obj
) -> Obj:
    spec = cp.get("spec") or {}
    comp = spec.get(key) or {}
    ds_opts = spec.get("daemonsets") or {}
    validator_image = _image(
        spec.get("validator") or {}, "nvcr.io/nvidia/cloud-native/gpu-operator-validator"
    )
    images = {
        "driver": "nvcr.io/nvidia/driver",
        "toolkit": "nvcr.io/nvidia/k8s/container-toolkit",
        "devicePlugin": "nvcr.io/nvidia/k8s-device-plugin",
        "dcgm": "nvcr.io/nvidia/cloud-native/dcgm",
        "dcgmExporter": "nvcr.io/nvidia/k8s/dcgm-exporter",
        "gfd": "nvcr.io/nvidia/k8s-device-plugin",
        "migManager": "nvcr.io/nvidia/cloud-native/k8s-mig-manager",
        "nodeStatusExporter": validator_image,
        "validator": validator_image,
    }
    main_image = _image(comp, images[key])
    plugin_env = u.dig(spec, "validator", "plugin", "env") or []
    init_containers = []
    for i in inits:
        if i == "k8s-driver-manager":
            init_containers.append(
                {
                    "name": i,
                    "image": _image(
                        u.dig(comp, "manager") or {}, "nvcr.io/nvidia/cloud-native/k8s-driver-manager"
                    ),
                    "command": ["driver-manager"],
                    "args": ["uninstall_driver"],
                    "securityContext": {"privileged": True},
                }
            )
        else:
            component = i.split("-")[0]
            init_containers.append(
                _validator_container(
                    i, validator_image, component, plugin_env if component == "plugin" else []
                )
            )
    main: Obj = {"name": container, "image": main_image, "securityContext": {"privileged": True}}
    if comp.get("env"):
        main["env"] = copy.deepcopy(comp["env"])
    if key == "validator":
        main.update(
            {"command": ["sh", "-c"], "args": ["echo all validations are successful; sleep infinity"]}
        )
    labels = {
        "app": name,
        "app.kubernetes.io/managed-by": "gpu-operator",
        "helm.sh/chart": cp["metadata"].get("labels", {}).get("helm.sh/chart", "gpu-operator"),
        **(ds_opts.get("labels") or {}),
    }
    pod_spec: Obj = {
        "serviceAccountName": name.replace("-daemonset", ""),
        "priorityClassName": ds_opts.get("priorityClassName") or "system-node-critical",
        "tolerations": copy.deepcopy(
            ds_opts.get("tolerations")
            or [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        ),
        "nodeSelector": {DEPLOY + deploy: "true"},
        "initContainers": init_containers,
        "containers": [main],
        "volumes": [
            {
                "name": "run-nvidia-validations",
                "hostPath": {"path": "/run/nvidia/validations", "type": "DirectoryOrCreate"},
            }
        ],
    }
    if not init_containers:
        del pod_spec["initContainers"]
    if key == "driver":
        pod_spec["hostPID"] = True
    if rc:
        pod_spec["runtimeClassName"] = u.dig(spec, "operator", "runtimeClass") or "nvidia"
    update = ds_opts.get("updateStrategy") or "RollingUpdate"
    strategy: Obj = {"type": update}
    if update == "RollingUpdate":
        strategy["rollingUpdate"] = {
            "maxUnavailable": str(u.dig(ds_opts, "rollingUpdate", "maxUnavailable") or "1")
        }
    if key == "driver":
        strategy = {"type": "OnDelete"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "annotations": copy.deepcopy(ds_opts.get("annotations") or {}) or None,
        },
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "revisionHistoryLimit": 10,
            "updateStrategy": strategy,
            "template": {
                "metadata": {"labels": {"app": name, "app.kubernetes.io/managed-by": "gpu-operator"}},
                "spec": pod_spec,
            },
        },
    }


def reconcile(ctl: Controllers) -> None:
    s = ctl.store
    cp_res = s.lookup("clusterpolicies.nvidia.com")
    if cp_res is None:
        return
    operators = ctl._running("app=gpu-operator")
    if not operators:
        return
    ns = operators[0]["metadata"]["namespace"]
    policies = sorted(s.list(cp_res), key=lambda o: o["metadata"]["creationTimestamp"])
    if not policies:
        return
    cp = policies[0]
    for extra in policies[1:]:
        if u.dig(extra, "status", "state") != "ignored":
            s.patch(
                cp_res, "", extra["metadata"]["name"], {"status": {"state": "ignored"}}, subresource="status"
            )
    spec = cp.get("spec") or {}
    nodes = s.list(ctl.R("nodes"))
    gpu_nodes = [n for n in nodes if is_gpu_node(n)]
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        patch: dict[str, Any] = {}
        if is_gpu_node(node):
            opted_out = labels.get(DEPLOY + "operands") == "false"
            want = {PRESENT: "true"}
            for _key, _name, deploy, *_ in COMPONENTS:
                if deploy == "mig-manager" and labels.get("nvidia.com/mig.capable") != "true":
                    continue
                want[DEPLOY + deploy] = "false" if opted_out else "true"
            for k, v in want.items():
                if labels.get(k) != v:
                    patch[k] = v
            if labels.get(DEPLOY + "mig-manager") and "nvidia.com/mig.capable" not in labels:
                patch[DEPLOY + "mig-manager"] = None
        else:
            for k in labels:
                if k == PRESENT or k.startswith(DEPLOY):
                    patch[k] = None
        if patch:
            s.patch(ctl.R("nodes"), "", node["metadata"]["name"], {"metadata": {"labels": patch}})
    from .kube_ctrl import owner_ref

    owner = owner_ref(cp)
    rc_name = u.dig(spec, "operator", "runtimeClass") or "nvidia"
    if s.find(ctl.R("runtimeclasses"), "", rc_name) is None:
        s.create(
            ctl.R("runtimeclasses"),
            {
                "metadata": {
                    "name": rc_name,
                    "labels": {"app.kubernetes.io/component": "gpu-operator"},
                    "ownerReferences": [owner],
                },
                "handler": rc_name,
            },
        )
    not_ready: list[str] = []
    for key, name, deploy, container, inits, rc in COMPONENTS:
        existing = s.find(ctl.R("daemonsets"), ns, name)
        if not enabled(spec, key):
            if existing is not None:
                s.delete(ctl.R("daemonsets"), ns, name)
            continue
        want = daemonset(ns, key, name, deploy, container, inits, rc, cp)
        want["metadata"]["ownerReferences"] = [owner]
        if want["metadata"].get("annotations") is None:
            del want["metadata"]["annotations"]
        sa = want["spec"]["template"]["spec"]["serviceAccountName"]
        if s.find(ctl.R("serviceaccounts"), ns, sa) is None:
            s.create(
                ctl.R("serviceaccounts"),
                {"metadata": {"name": sa, "namespace": ns, "ownerReferences": [owner]}},
            )
        if existing is None:
            existing = s.create(ctl.R("daemonsets"), want)
        elif (
            existing.get("spec") != want["spec"]
            or existing["metadata"].get("labels") != want["metadata"]["labels"]
        ):
            existing["spec"] = want["spec"]
            existing["metadata"]["labels"] = want["metadata"]["labels"]
            existing = s.replace(ctl.R("daemonsets"), existing, check_rv=False)
        st = existing.get("status") or {}
        desired = int(st.get("desiredNumberScheduled", 0))
        generation_seen = st.get("observedGeneration") == existing["metadata"].get("generation")
        if (
            not generation_seen
            or int(st.get("numberReady", 0)) < desired
            or int(st.get("updatedNumberScheduled", desired)) < desired
        ):
            not_ready.append(f"state-{deploy}")
    has_nfd = any(
        k.startswith("feature.node.kubernetes.io/")
        for n in nodes
        for k in (n["metadata"].get("labels") or {})
    )
    ready = not not_ready and has_nfd
    if not has_nfd:
        # As the real operator: without node-feature-discovery's labels no GPU node can be found.
        reason, message = (
            "NFDLabelsMissing",
            "NFD labels missing in the cluster, GPU nodes cannot be discovered",
        )
    elif not_ready:
        reason, message = (
            "OperandNotReady",
            f"ClusterPolicy is not ready, states not ready: [{' '.join(not_ready)}]",
        )
    else:
        reason, message = ("Reconciled" if gpu_nodes else "NoGPUNodes"), ""
    status = {
        "namespace": ns,
        "state": "ready" if ready else "notReady",
        "conditions": [
            ctl._cond(cp, "Ready", ready, reason, message),
            ctl._cond(cp, "Error", not ready, reason if not ready else "Ready", message),
        ],
    }
    for c in status["conditions"]:
        c.pop("lastUpdateTime", None)
    if status != cp.get("status"):
        s.patch(cp_res, "", cp["metadata"]["name"], {"status": status}, subresource="status")
