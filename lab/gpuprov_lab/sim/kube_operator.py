"""The NVIDIA GPU Operator's reconcile loop, SIMULATED (gpuprov lab); its operands are NVIDIA's own.

The operator's image cannot run here, so this module does what its controller does, from the real
ClusterPolicy (rendered by the real helm from NVIDIA's chart) and the real per-state manifests of the
same release (the operator's assets/ directory, which the lab's kubelet package carries, see ASSETS).
Everything below follows GPU Operator v25.10.0's source; the functions named are theirs:

- controllers/state_manager.go: the states and their order (init/addState), which ClusterPolicy key
  enables each (isStateEnabled; a disabled state's objects are deleted), the node labels
  (labelGPUNodes, updateGPUStateLabels, hasMIGCapableGPU).
- controllers/resource_manager.go (getAssetsFrom): a state's files in name order; OpenShift-only
  files skipped.
- controllers/object_controls.go: the transforms applied to each DaemonSet (preProcessDaemonSet:
  applyCommonDaemonsetConfig, the Transform<Operand> functions, applyCommonDaemonsetMetadata), the
  RuntimeClasses (RuntimeClasses, transformRuntimeClass), DaemonSet readiness (isDaemonSetReady).
- controllers/clusterpolicy_controller.go (Reconcile): ClusterPolicy .status.state and conditions.

What the operand pods then do on each node is decided by that node's kubelet (kube_pods), from the
containers' real commands and environment.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import kube_util as u
from .kube_store import Obj

if TYPE_CHECKING:
    from .kube_ctrl import Controllers

# Where the lab's kubelet package puts the operator's manifests (kube.kubelet files); off a lab host
# (the in-process tests) GPUPROV_LAB_OPERATOR_ASSETS names the vendor's assets/ directory.
ASSETS = "/usr/lib/gpuprov-lab/kube/kubelet/gpu-operator-assets"

PRESENT = "nvidia.com/gpu.present"
DEPLOY = "nvidia.com/gpu.deploy."
# state_manager.go gpuNodeLabels: the node-feature-discovery PCI labels that make a node a GPU node.
GPU_NODE_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
# state_manager.go gpuStateLabels["container"]: the operands a container-workload GPU node runs.
STATE_LABELS = (
    "driver",
    "gpu-feature-discovery",
    "container-toolkit",
    "device-plugin",
    "dcgm",
    "dcgm-exporter",
    "node-status-exporter",
    "operator-validator",
)
# (asset directory, ClusterPolicy key that enables it, Go default when the key is unset); in the
# order init() adds them. None: always on (isStateEnabled). The sandbox (VM) states are left out:
# they need sandboxWorkloads.enabled, which the chart leaves off.
STATES: list[tuple[str, str | None, bool]] = [
    ("pre-requisites", None, True),
    ("state-operator-metrics", None, True),
    ("state-driver", "driver", True),
    ("state-container-toolkit", "toolkit", True),
    ("state-operator-validation", None, True),
    ("state-device-plugin", "devicePlugin", True),
    ("state-mps-control-daemon", "devicePlugin", True),
    ("state-dcgm", "dcgm", True),
    ("state-dcgm-exporter", "dcgmExporter", True),
    ("gpu-feature-discovery", "gfd", True),
    ("state-mig-manager", "migManager", True),
    ("state-node-status-exporter", "nodeStatusExporter", False),
]
# The kinds the lab's API server has (a ServiceMonitor or PrometheusRule needs the Prometheus
# operator's CRDs, which the real operator also skips without them).
KINDS = {
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "ClusterRole": "clusterroles",
    "RoleBinding": "rolebindings",
    "ClusterRoleBinding": "clusterrolebindings",
    "ConfigMap": "configmaps",
    "Service": "services",
    "DaemonSet": "daemonsets",
    "RuntimeClass": "runtimeclasses",
}
DEFAULT_RUNTIME_CLASS = "nvidia"  # object_controls.go DefaultRuntimeClass
# gpuv1.ImagePath's fallbacks: the operator Deployment's env (the chart sets none of them, so an
# image left empty in the ClusterPolicy is an error, as in the real operator).
IMAGE_ENV = {
    "driver": "DRIVER_IMAGE",
    "toolkit": "CONTAINER_TOOLKIT_IMAGE",
    "devicePlugin": "DEVICE_PLUGIN_IMAGE",
    "dcgm": "DCGM_IMAGE",
    "dcgmExporter": "DCGM_EXPORTER_IMAGE",
    "gfd": "GFD_IMAGE",
    "migManager": "MIG_MANAGER_IMAGE",
    "nodeStatusExporter": "VALIDATOR_IMAGE",
    "validator": "VALIDATOR_IMAGE",
}


class OperatorError(Exception):
    """What the real operator reports as ReconcileFailed."""


def assets_dir() -> Path:
    here = Path(ASSETS)
    return here if here.is_dir() else Path(os.environ.get("GPUPROV_LAB_OPERATOR_ASSETS") or ASSETS)


# Parsed manifests by state: the operator reads its assets once (as the real one does at start); each
# reconcile pass works on copies.
_PARSED: dict[tuple[str, str], list[Obj]] = {}


def state_objects(state: str) -> list[Obj]:
    """A state's manifests as the operator loads them (getAssetsFrom): files in name order, OpenShift
    files skipped; only the kinds the lab's API server has. Fresh copies on every call."""
    base = assets_dir() / state
    key = (str(base), state)
    if key not in _PARSED:
        _PARSED[key] = _load_state(base)
    return copy.deepcopy(_PARSED[key])


def _load_state(base: Path) -> list[Obj]:
    if not base.is_dir():
        raise OperatorError(f"failed to get assets from {base}: no such directory")
    out: list[Obj] = []
    for path in sorted(base.iterdir()):
        if "openshift" in path.name or path.suffix not in (".yaml", ".yml"):
            continue
        for doc in u.yaml_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in KINDS:
                out.append(doc)
    return out


# ------------------------------------------------------------------------------------ spec helpers
def enabled(spec: Obj, key: str | None, default: bool) -> bool:
    if key is None:
        return True
    value = u.dig(spec, key, "enabled")
    if value is None:
        return default
    return value is True or str(value).lower() == "true"


def cdi_enabled(spec: Obj) -> bool:
    """CDIConfigSpec.IsEnabled: true when unset."""
    return enabled(spec, "cdi", True)


def image_path(spec: Obj, key: str) -> str:
    """gpuv1.ImagePath: repository/image:version; version "sha256:..." is a digest; an image alone (no
    repository, no version) is used as it is."""
    comp = spec.get(key) or {}
    repo, image, version = (str(comp.get(k) or "") for k in ("repository", "image", "version"))
    if not repo and not version and image:
        return image
    if repo or version:
        if version.startswith("sha256:"):
            return f"{repo}/{image}@{version}"
        return f"{repo}/{image}:{version}"
    env = IMAGE_ENV.get(key, "")
    raise OperatorError(f"empty image path provided through both ClusterPolicy CR and ENV {env}")


def runtime_class(spec: Obj) -> str:
    return str(u.dig(spec, "operator", "runtimeClass") or DEFAULT_RUNTIME_CLASS)


def set_env(container: Obj, name: str, value: str) -> None:
    """setContainerEnv: replace a variable of the same name, else append."""
    env = container.setdefault("env", [])
    for e in env:
        if e.get("name") == name:
            e.clear()
            e.update({"name": name, "value": value})
            return
    env.append({"name": name, "value": value})


def apply_env(container: Obj, env: list[Obj] | None) -> None:
    for e in env or []:
        if "value" in e or "valueFrom" not in e:
            set_env(container, str(e.get("name")), str(e.get("value", "")))
        else:
            container.setdefault("env", []).append(copy.deepcopy(e))


def _container(containers: list[Obj], name: str) -> Obj | None:
    return next((c for c in containers if c.get("name") == name), None)


def _drop(pod: Obj, field: str, *names: str) -> None:
    pod[field] = [c for c in pod.get(field) or [] if c.get("name") not in names]
    if not pod[field]:
        del pod[field]


# ------------------------------------------------------------------------------------- transforms
def _validation_inits(pod: Obj, spec: Obj) -> None:
    """transformValidationInitContainer: every init container whose name contains "validation" runs
    the validator image as root, with validator.driver.env / validator.toolkit.env."""
    for c in pod.get("initContainers") or []:
        name = str(c.get("name", ""))
        if "validation" not in name:
            continue
        c["image"] = image_path(spec, "validator")
        c.setdefault("securityContext", {})["runAsUser"] = 0
        if name.startswith("driver"):
            apply_env(c, u.dig(spec, "validator", "driver", "env"))
        elif name.startswith("toolkit"):
            apply_env(c, u.dig(spec, "validator", "toolkit", "env"))


def _device_plugin_config(pod: Obj, spec: Obj) -> None:
    """handleDevicePluginConfig: without devicePlugin.config.name the config-manager containers go;
    with it, the ConfigMap is mounted at /available-configs next to an emptyDir /config in the main
    container (CONFIG_FILE=/config/config.yaml) and the config-manager containers (DEFAULT_CONFIG,
    FALLBACK_STRATEGIES=empty)."""
    name = u.dig(spec, "devicePlugin", "config", "name")
    if not name:
        _drop(pod, "initContainers", "config-manager-init")
        _drop(pod, "containers", "config-manager")
        return
    mounts = [{"name": "config", "mountPath": "/config"}, {"name": name, "mountPath": "/available-configs"}]
    for c in pod.get("containers") or []:
        if c.get("name") in ("nvidia-device-plugin", "gpu-feature-discovery", "mps-control-daemon-ctr"):
            set_env(c, "CONFIG_FILE", "/config/config.yaml")
            c.setdefault("volumeMounts", []).extend(copy.deepcopy(mounts))
    pod.setdefault("volumes", []).extend(
        [{"name": name, "configMap": {"name": name}}, {"name": "config", "emptyDir": {}}]
    )
    for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        if c.get("name") in ("config-manager-init", "config-manager"):
            c["image"] = image_path(spec, "devicePlugin")
            set_env(c, "DEFAULT_CONFIG", str(u.dig(spec, "devicePlugin", "config", "default") or ""))
            set_env(c, "FALLBACK_STRATEGIES", "empty")
            c.setdefault("volumeMounts", []).extend(copy.deepcopy(mounts))


def _mig_env(container: Obj, spec: Obj) -> None:
    """applyMIGConfiguration."""
    strategy = u.dig(spec, "mig", "strategy")
    if not strategy:
        set_env(container, "NVIDIA_MIG_MONITOR_DEVICES", "all")
        return
    set_env(container, "MIG_STRATEGY", str(strategy))
    if strategy != "none":
        set_env(container, "NVIDIA_MIG_MONITOR_DEVICES", "all")


def _cdi_hook_path(spec: Obj) -> str:
    install_dir = str(u.dig(spec, "toolkit", "installDir") or "/usr/local/nvidia")
    return install_dir.rstrip("/") + "/toolkit/nvidia-cdi-hook"


def transform(ds: Obj, spec: Obj, nodes: list[Obj]) -> None:
    """preProcessDaemonSet's per-operand transform of one DaemonSet (in place)."""
    name = ds["metadata"]["name"]
    pod = ds["spec"]["template"]["spec"]
    containers = pod.get("containers") or []
    main = containers[0] if containers else {}
    rc = runtime_class(spec)
    cdi = cdi_enabled(spec)
    toolkit = enabled(spec, "toolkit", True)

    def with_image(key: str, *names: str) -> None:
        for c in [*pod.get("initContainers", []), *containers]:
            if c.get("name") in names:
                c["image"] = image_path(spec, key)

    if name == "nvidia-driver-daemonset":
        _validation_inits(pod, spec)
        mgr = _container(pod.get("initContainers") or [], "k8s-driver-manager")
        if mgr is not None:
            mgr["image"] = image_path({"m": u.dig(spec, "driver", "manager") or {}}, "m")
            apply_env(mgr, u.dig(spec, "driver", "manager", "env"))
        ctr = _container(containers, "nvidia-driver-ctr") or main
        image = image_path(spec, "driver")
        if "sha256:" not in image:  # resolveDriverTag: <image>-<os ID><VERSION_ID> from NFD's labels
            labels = next((n["metadata"].get("labels") or {} for n in nodes), {})
            os_id = labels.get("feature.node.kubernetes.io/system-os_release.ID", "")
            os_version = labels.get("feature.node.kubernetes.io/system-os_release.VERSION_ID", "")
            if os_id:
                image = f"{image}-{os_id}{os_version}"
        ctr["image"] = image
        apply_env(ctr, u.dig(spec, "driver", "env"))
        sidecars = {
            "nvidia-peermem-ctr": u.dig(spec, "driver", "rdma", "enabled"),
            "nvidia-fs-ctr": u.dig(spec, "gds", "enabled"),
            "nvidia-gdrcopy-ctr": u.dig(spec, "gdrcopy", "enabled"),
            "openshift-driver-toolkit-ctr": False,
        }
        _drop(pod, "containers", *[n for n, on in sidecars.items() if not on])
    elif name == "nvidia-container-toolkit-daemonset":
        _validation_inits(pod, spec)
        ctr = _container(containers, "nvidia-container-toolkit-ctr") or main
        ctr["image"] = image_path(spec, "toolkit")
        if cdi:  # transformToolkitCtrForCDI
            set_env(ctr, "CDI_ENABLED", "true")
            set_env(ctr, "NVIDIA_RUNTIME_SET_AS_DEFAULT", "false")
            set_env(ctr, "NVIDIA_CONTAINER_RUNTIME_MODE", "cdi")
            set_env(ctr, "CRIO_CONFIG_MODE", "config")
        apply_env(ctr, u.dig(spec, "toolkit", "env"))
        set_env(ctr, "RUNTIME", "containerd")  # transformForRuntime (the lab's nodes run containerd)
        set_env(ctr, "CONTAINERD_RUNTIME_CLASS", rc)
    elif name == "nvidia-device-plugin-daemonset":
        _validation_inits(pod, spec)
        _device_plugin_config(pod, spec)
        containers = pod.get("containers") or []
        ctr = _container(containers, "nvidia-device-plugin") or containers[0]
        ctr["image"] = image_path(spec, "devicePlugin")
        pod["runtimeClassName"] = rc
        _mig_env(ctr, spec)
        if cdi:  # transformDevicePluginCtrForCDI
            set_env(ctr, "CDI_ENABLED", "true")
            set_env(ctr, "DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri")
            set_env(ctr, "CDI_ANNOTATION_PREFIX", "cdi.k8s.io/")
            if toolkit:
                set_env(ctr, "NVIDIA_CDI_HOOK_PATH", _cdi_hook_path(spec))
        apply_env(ctr, u.dig(spec, "devicePlugin", "env"))
    elif name == "nvidia-device-plugin-mps-control-daemon":
        _validation_inits(pod, spec)
        _device_plugin_config(pod, spec)
        with_image("devicePlugin", "mps-control-daemon-mounts", "mps-control-daemon-ctr")
        pod["runtimeClassName"] = rc
        ctr = _container(pod.get("containers") or [], "mps-control-daemon-ctr") or main
        _mig_env(ctr, spec)
    elif name == "nvidia-dcgm":
        _validation_inits(pod, spec)
        main["image"] = image_path(spec, "dcgm")
        apply_env(main, u.dig(spec, "dcgm", "env"))
        pod["runtimeClassName"] = rc
    elif name == "nvidia-dcgm-exporter":
        _validation_inits(pod, spec)
        main["image"] = image_path(spec, "dcgmExporter")
        if enabled(spec, "dcgm", True):
            set_env(main, "DCGM_REMOTE_HOSTENGINE_INFO", "nvidia-dcgm:5555")
        pod["runtimeClassName"] = rc
        apply_env(main, u.dig(spec, "dcgmExporter", "env"))
    elif name == "gpu-feature-discovery":
        _validation_inits(pod, spec)
        ctr = _container(containers, "gpu-feature-discovery") or main
        ctr["image"] = image_path(spec, "gfd")
        apply_env(ctr, u.dig(spec, "gfd", "env"))
        _device_plugin_config(pod, spec)
        pod["runtimeClassName"] = rc
        _mig_env(ctr, spec)
    elif name == "nvidia-mig-manager":
        _validation_inits(pod, spec)
        main["image"] = image_path(spec, "migManager")
        pod["runtimeClassName"] = rc
        # The ConfigMaps of the mig-parted-config and gpu-clients volumes (GetConfigMapName defaults).
        # v26.7.0: a custom config is CONFIG_FILE; the default one is mounted as config-default.yaml and
        # named by DEFAULT_CONFIG_FILE, the manager's fallback when it cannot generate a config from NVML.
        custom = u.dig(spec, "migManager", "config", "name")
        for v in pod.get("volumes") or []:
            if "mig-parted-config" in v.get("name", ""):
                v["configMap"]["name"] = custom or "default-mig-parted-config"
                if not custom:
                    v["configMap"]["items"] = [{"key": "config.yaml", "path": "config-default.yaml"}]
            elif "gpu-clients" in v.get("name", ""):
                v["configMap"]["name"] = (
                    u.dig(spec, "migManager", "gpuClientsConfig", "name") or "default-gpu-clients"
                )
        if custom:
            set_env(main, "CONFIG_FILE", "/mig-parted-config/config.yaml")
        else:
            set_env(main, "DEFAULT_CONFIG_FILE", "/mig-parted-config/config-default.yaml")
        if cdi:
            set_env(main, "CDI_ENABLED", "true")
            if toolkit:
                set_env(main, "NVIDIA_CDI_HOOK_PATH", _cdi_hook_path(spec))
        apply_env(main, u.dig(spec, "migManager", "env"))
    elif name == "nvidia-operator-validator":
        main["image"] = image_path(spec, "validator")
        main.setdefault("securityContext", {})["runAsUser"] = 0
        apply_env(main, u.dig(spec, "validator", "env"))
        pod["runtimeClassName"] = rc
        # TransformValidatorComponent: plugin-validation goes with the device plugin, nvidia-fs and
        # gdrcopy with their features; driver- and toolkit-validation always stay.
        gone = []
        if not enabled(spec, "devicePlugin", True):
            gone.append("plugin-validation")
        if not u.dig(spec, "gds", "enabled"):
            gone.append("nvidia-fs-validation")
        if not u.dig(spec, "gdrcopy", "enabled"):
            gone.append("gdrcopy-validation")
        _drop(pod, "initContainers", *gone)
        for c in pod.get("initContainers") or []:
            component = str(c.get("name", "")).removesuffix("-validation")
            c["image"] = image_path(spec, "validator")
            c.setdefault("securityContext", {})["runAsUser"] = 0
            if component in ("cuda", "plugin"):
                set_env(c, "VALIDATOR_IMAGE", image_path(spec, "validator"))
                set_env(c, "VALIDATOR_RUNTIME_CLASS", rc)
                if component == "plugin":
                    set_env(c, "MIG_STRATEGY", str(u.dig(spec, "mig", "strategy") or "single"))
            apply_env(c, u.dig(spec, "validator", component, "env"))
    elif name == "nvidia-node-status-exporter":
        _validation_inits(pod, spec)
        main["image"] = image_path(spec, "nodeStatusExporter")
        main.setdefault("securityContext", {})["runAsUser"] = 0
        apply_env(main, u.dig(spec, "nodeStatusExporter", "env"))


def common(ds: Obj, spec: Obj) -> None:
    """applyCommonDaemonsetConfig and applyCommonDaemonsetMetadata."""
    opts = spec.get("daemonsets") or {}
    pod = ds["spec"]["template"]["spec"]
    if opts.get("updateStrategy") == "OnDelete":
        ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
    elif u.dig(opts, "rollingUpdate", "maxUnavailable") and not ds["metadata"]["name"].startswith(
        "nvidia-driver-daemonset"
    ):
        mu = str(u.dig(opts, "rollingUpdate", "maxUnavailable"))
        value: Any = mu if mu.endswith("%") else int(mu)
        ds["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": value}}
    if opts.get("priorityClassName"):
        pod["priorityClassName"] = opts["priorityClassName"]
    if opts.get("tolerations"):
        pod["tolerations"] = copy.deepcopy(opts["tolerations"])
    template_meta = ds["spec"]["template"].setdefault("metadata", {})
    for k, v in (opts.get("labels") or {}).items():
        if k not in ("app", "app.kubernetes.io/part-of"):
            template_meta.setdefault("labels", {})[k] = v
        ds["metadata"].setdefault("labels", {})[k] = v
    for k, v in (opts.get("annotations") or {}).items():
        template_meta.setdefault("annotations", {})[k] = v
        ds["metadata"].setdefault("annotations", {})[k] = v


def _fill_namespace(obj: Obj, ns: str, namespaced: bool) -> None:
    if namespaced:
        obj["metadata"]["namespace"] = ns
    else:
        obj["metadata"].pop("namespace", None)
    for s in obj.get("subjects") or []:
        if s.get("kind") == "ServiceAccount":
            s["namespace"] = ns


# ------------------------------------------------------------------------------------- node labels
def is_gpu_node(node: Obj) -> bool:
    labels = u.dig(node, "metadata", "labels") or {}
    return any(labels.get(k) == "true" for k in GPU_NODE_LABELS)


def mig_capable(labels: dict[str, str]) -> bool:
    """hasMIGCapableGPU."""
    if "nvidia.com/vgpu.host-driver-version" in labels:
        return False
    if "nvidia.com/mig.capable" in labels:
        return labels["nvidia.com/mig.capable"] == "true"
    product = labels.get("nvidia.com/gpu.product", "").lower()
    return any(p in product for p in ("h100", "a100", "a30"))


def node_label_patch(node: Obj, spec: Obj) -> dict[str, Any]:
    labels = node["metadata"].get("labels") or {}
    patch: dict[str, Any] = {}
    gpu = is_gpu_node(node)
    if gpu and labels.get(PRESENT) != "true":
        patch[PRESENT] = "true"
    elif not gpu:
        if labels.get(PRESENT) == "true":
            patch[PRESENT] = "false"
        for k in labels:
            if k.startswith(DEPLOY):
                patch[k] = None
        return patch
    if labels.get(DEPLOY + "operands") == "false":
        for k in labels:
            if k.startswith(DEPLOY) and k != DEPLOY + "operands":
                patch[k] = None
        return patch
    want = list(STATE_LABELS)
    capable = mig_capable(labels)
    if capable:
        want.append("mig-manager")
    for name in want:
        if DEPLOY + name not in labels:  # a value already there (a user's "false") is kept
            patch[DEPLOY + name] = "true"
    if (
        capable
        and enabled(spec, "migManager", True)
        and "nvidia.com/mig.config" not in labels
        and u.dig(spec, "migManager", "config", "default") == "all-disabled"
    ):
        patch["nvidia.com/mig.config"] = "all-disabled"
    return patch


# ---------------------------------------------------------------------------------------- reconcile
def _daemonset_ready(ds: Obj) -> bool:
    """isDaemonSetReady (with the lab's generation check: the status describes the current spec)."""
    st = ds.get("status") or {}
    desired = int(st.get("desiredNumberScheduled", 0))
    if st.get("observedGeneration") != ds["metadata"].get("generation"):
        return False
    if desired == 0:
        return True
    if int(st.get("numberUnavailable", 0)) > 0 or int(st.get("numberReady", 0)) < desired:
        return False
    return int(st.get("updatedNumberScheduled", desired)) >= desired


def _hash(obj: Obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _apply(ctl: Controllers, obj: Obj, owner: Obj) -> Obj:
    """Create the object, or update it when what the operator wants changed (the last-applied hash)."""
    s = ctl.store
    res = ctl.R(KINDS[obj["kind"]])
    ns = obj["metadata"].get("namespace", "")
    obj["metadata"]["ownerReferences"] = [owner]
    want_hash = _hash(obj)
    obj["metadata"].setdefault("annotations", {})["nvidia.com/last-applied-hash"] = want_hash
    have = s.find(res, ns, obj["metadata"]["name"])
    if have is None:
        return s.create(res, obj)
    if (have["metadata"].get("annotations") or {}).get("nvidia.com/last-applied-hash") == want_hash:
        return have
    for k, v in obj.items():
        if k not in ("metadata", "status"):
            have[k] = v
    have["metadata"]["labels"] = obj["metadata"].get("labels") or {}
    have["metadata"]["annotations"] = obj["metadata"]["annotations"]
    have["metadata"]["ownerReferences"] = [owner]
    return s.replace(res, have, check_rv=False)


def _delete(ctl: Controllers, obj: Obj, ns: str) -> None:
    res = ctl.R(KINDS[obj["kind"]])
    namespace = ns if res.namespaced else ""
    if ctl.store.find(res, namespace, obj["metadata"]["name"]) is not None:
        ctl.store.delete(res, namespace, obj["metadata"]["name"])


def _runtime_classes(ctl: Controllers, spec: Obj, owner: Obj, ns: str) -> None:
    """RuntimeClasses: the runtime class (nvidia) always; nvidia-legacy and nvidia-cdi only with CDI."""
    for obj in state_objects("pre-requisites"):
        if obj["metadata"]["name"] == "FILLED_BY_OPERATOR":
            obj["metadata"]["name"] = obj["handler"] = runtime_class(spec)
        elif not cdi_enabled(spec):
            _delete(ctl, obj, ns)
            continue
        obj["metadata"].setdefault("labels", {})["app.kubernetes.io/component"] = "gpu-operator"
        _apply(ctl, obj, owner)


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
    # A second ClusterPolicy is ignored (its "ignored" state is kept in the operator's memory only).
    cp = policies[0]
    spec = cp.get("spec") or {}
    nodes = s.list(ctl.R("nodes"))
    for node in nodes:
        patch = node_label_patch(node, spec)
        if patch:
            s.patch(ctl.R("nodes"), "", node["metadata"]["name"], {"metadata": {"labels": patch}})
    nodes = s.list(ctl.R("nodes"))
    gpu_nodes = [n for n in nodes if (n["metadata"].get("labels") or {}).get(PRESENT) == "true"]
    from .kube_ctrl import owner_ref

    owner = owner_ref(cp)
    not_ready: list[str] = []
    failed = ""
    try:
        _runtime_classes(ctl, spec, owner, ns)
        for state, key, default in STATES[1:]:
            on = enabled(spec, key, default)
            for obj in state_objects(state):
                namespaced = ctl.R(KINDS[obj["kind"]]).namespaced
                _fill_namespace(obj, ns, namespaced)
                if not on:
                    _delete(ctl, obj, ns)
                    continue
                if obj["kind"] != "DaemonSet":
                    _apply(ctl, obj, owner)
                    continue
                if not gpu_nodes:  # DaemonSet(): no GPU node, nothing to run, the state is ready
                    continue
                common(obj, spec)
                transform(obj, spec, gpu_nodes)
                ds = _apply(ctl, obj, owner)
                if not _daemonset_ready(ds):
                    not_ready.append(state)
    except OperatorError as exc:
        failed = str(exc)
    labels = [k for n in nodes for k in (n["metadata"].get("labels") or {})]
    has_nfd = any(k.startswith("feature.node.kubernetes.io/") for k in labels)
    # clusterpolicy_controller.go Reconcile: errors and operands not ready first; a cluster without
    # node-feature-discovery's labels or without GPU nodes is "ready" with the reason saying so.
    if failed:
        ready, reason, message = False, "ReconcileFailed", f"Failed to reconcile: {failed}"
    elif not_ready:
        ready, reason = False, "OperandNotReady"
        message = f"ClusterPolicy is not ready, states not ready: [{' '.join(not_ready)}]"
    elif not has_nfd:
        ready, reason, message = True, "NFDLabelsMissing", "No NFD labels found"
    elif not gpu_nodes:
        ready, reason = True, "NoGPUNodes"
        message = "No GPU node found, watching for new nodes to join the cluster."
    else:
        ready, reason = True, "Reconciled"
        message = "ClusterPolicy is ready as all resources have been successfully reconciled"
    status = {
        "namespace": ns,
        "state": "ready" if ready else "notReady",
        "conditions": [
            ctl._cond(cp, "Ready", ready, reason if ready else "Error", message if ready else ""),
            ctl._cond(cp, "Error", not ready, "Ready" if ready else reason, "" if ready else message),
        ],
    }
    for c in status["conditions"]:
        c.pop("lastUpdateTime", None)
    if status != cp.get("status"):
        s.patch(cp_res, "", cp["metadata"]["name"], {"status": status}, subresource="status")
