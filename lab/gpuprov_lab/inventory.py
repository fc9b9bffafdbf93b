"""The lab's Ansible inventory: the groups of docs/contracts.md, root over SSH with the lab key and host
key checking on, the mirror knobs, and per host the lab profile (for tests only)."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import yaml

from gpuprov_lab import distros, keys, plan
from gpuprov_lab.gpu.kmod import OPERAND_NVML  # where the operands see the mock NVML's configuration
from gpuprov_lab.kube import images, registry
from gpuprov_lab.mirror import KEY_NAME
from gpuprov_lab.state import LabState
from provisioner.inventory_expectations import OPERATOR_VALUES


def document(st: LabState, *, kubernetes: bool = True) -> dict[str, Any]:
    """The inventory; with ``kubernetes=False`` the GPU hosts are servers that never join Kubernetes
    (in ``gpu_nodes`` alone, docs/contracts.md), as a site with standalone GPU hosts writes it."""
    lp = st.paths
    key = keys.ensure_archive_key()

    def host_vars(name: str) -> dict[str, Any]:
        h = st.host(name)
        flavour = distros.get(h.os)
        # What NVIDIA's repositories for the host's release need (Debian 13: driver 590, CUDA 13.1), as a
        # real site on that release must set it; GPU hosts only.
        settings = dict(flavour.host_vars) if h.is_gpu else {}
        if h.is_gpu:
            settings["kubernetes_gpu_node_labels"] = node_feature_labels(flavour.version_id)
        return {
            "ansible_host": h.ip,
            **settings,
            "lab_profile": h.profile,
            "lab_gpu_count": h.gpu_count,
            "lab_os": h.os,
        }

    cps = [h.name for h in st.hosts if not h.is_gpu]
    gpus = [h.name for h in st.hosts if h.is_gpu]
    return {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(lp.ssh_key),
                "ansible_ssh_common_args": (
                    f"-o UserKnownHostsFile={lp.known_hosts} -o StrictHostKeyChecking=yes"
                ),
                "ansible_python_interpreter": "/usr/bin/python3",
                "gpuprov_mirror_url": st.mirror_url,
                "gpuprov_mirror_key_url": f"{st.mirror_url}/{KEY_NAME}.asc",
                "gpuprov_mirror_key_fingerprint": key.fingerprint,
                "gpuprov_registry_mirror_url": f"http://{st.gateway}:{registry.PORT}",
                "lab_name": st.name,
                **_mig_manager_checksum(st),
                **kubernetes_settings(f"{st.gateway}:{registry.PORT}"),
            },
            "children": {
                "kube_control_plane": {"hosts": {n: host_vars(n) for n in cps}},
                "gpu_nodes": {"hosts": {n: host_vars(n) for n in gpus}},
                "k8s_cluster": {
                    "children": {"kube_control_plane": {}, **({"gpu_nodes": {}} if kubernetes else {})}
                },
            },
        }
    }


def cgroup_v1(root: Path = Path("/sys/fs/cgroup")) -> bool:
    """Whether this machine (and so every lab host, which shares its kernel) has cgroup v1."""
    return not (root / "cgroup.controllers").exists()


def kubernetes_settings(registry_host: str) -> dict[str, Any]:
    """What Kubernetes needs on the lab's hosts, set where a real site sets such things: in the
    inventory. None of it is a product default; docs/lab.md says which is for which reason.

    - The pod network: the bridge CNI (flannel's images cannot be had here).
    - CoreDNS: no image exists here, so kubeadm's image pre-pull of it is a preflight error to ignore;
      its pods stay ImagePullBackOff, which stops neither kubeadm nor the nodes being Ready.
    - etcd: the lab's image is etcd 3.6.13 (built from source), tagged as it reports itself.
    - Containers share this machine's kernel: kube-proxy may not raise nf_conntrack_max there.
    - On a cgroup v1 machine (this kind of build machine), kubeadm 1.35+ fails SystemVerification and
      the kubelet refuses to start unless told cgroup v1 is wanted (failCgroupV1: false). A cgroup v2
      host, such as a real Ubuntu 24.04 server, needs neither.
    """
    settings: dict[str, Any] = {
        "kubernetes_cni": "bridge",
        # The lab's own images (test workloads) are named after the registry's address, which serves HTTP.
        "kubernetes_registry_mirrors": {registry_host: [f"http://{registry_host}"]},
        "kubernetes_etcd_image_tag": images.ETCD_TAG,
        "kubernetes_kube_proxy_config": {"conntrack": {"maxPerCore": 0}},
    }
    ignore = ["ImagePull"]
    if cgroup_v1():
        ignore.append("SystemVerification")
        settings["kubernetes_kubelet_config"] = {"failCgroupV1": False}
    settings["kubernetes_kubeadm_ignore_preflight_errors"] = ignore
    settings.update(gpu_operator_settings(f"{registry_host}/{images.TOOLS_REPOSITORY}:{images.TOOLS_TAG}"))
    return settings


def node_feature_labels(debian_version: str) -> dict[str, str]:
    """The labels Node Feature Discovery (off in the lab) would give a GPU node and the GPU Operator
    reads (controllers/state_manager.go: gpuNodeLabels, getGPUNodeOSInfo): the NVIDIA PCI device and
    the OS release, put there by the kubernetes role's per-host node labels."""
    return {
        "node-role.kubernetes.io/gpu": "",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/system-os_release.ID": "debian",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": debian_version,
    }


NODE_FEATURES = Path(__file__).resolve().parent / "kube" / "files" / "node-features"


def node_features_objects(namespace: str, image: str) -> list[dict[str, Any]]:
    """The stand-in for NFD's master (kube/files/node-features.yaml and .sh, SIMULATED), in the namespace
    the chart installs into, run from the lab's tools image."""
    # Each object gets its own copy of the shared metadata (the YAML's anchor): some get a namespace.
    docs = copy.deepcopy(yaml.safe_load(NODE_FEATURES.with_suffix(".yaml").read_text()))
    for doc in docs:
        doc["metadata"] = copy.deepcopy(doc["metadata"])
        if doc["kind"] in ("ServiceAccount", "Deployment"):
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            container.update(image=image, command=["sh", "-c", NODE_FEATURES.with_suffix(".sh").read_text()])
    return docs


def _env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def gpu_operator_settings(tools_image: str, namespace: str = "gpu-operator") -> dict[str, Any]:
    """The GPU Operator's values in the lab, in the inventory (gpu_operator_values), each for a reason
    docs/lab.md gives:

    - NFD, DCGM and the DCGM exporter are off: none of their images can be built here. The GPU nodes
      carry the labels NFD would give them and the operator reads (node_feature_labels).
    - GPU feature discovery's labels reach the node through NFD's master, which is off: a labelled
      stand-in (node_features_objects) puts them on, installed with the chart (its extraObjects).
    - The validator's /dev/char links are off (NVIDIA's documented switch): it finds the NVIDIA
      character devices in /proc/devices, which is the machine's kernel's in any container here, and
      that kernel has no NVIDIA module.
    - The validator's CUDA and plugin workload pods are off: they run the CUDA vectorAdd sample, which
      cannot be built here. The validations themselves (driver, toolkit, CUDA, plugin) run.
    - The device plugin, GPU feature discovery and the MIG manager load NVIDIA's mock NVML, which reads
      the host's GPUs from MOCK_NVML_CONFIG: each is told where its mounts show that file.
    - The device plugin's CDI specs (cdi.enabled) leave out the disable-device-node-modification hook
      (its --cdi-disable-hooks, env CDI_DISABLE_HOOKS): the hook bind-mounts a modified copy of the
      container's /proc/driver/nvidia/params, which a container here does not have (its /proc is the
      machine's kernel's, without NVIDIA's module), so every container it is asked of fails to start.
    """
    return {
        OPERATOR_VALUES: {
            "nfd": {"enabled": False},
            "dcgm": {"enabled": False},
            "dcgmExporter": {"enabled": False},
            "validator": {
                "driver": {"env": _env(DISABLE_DEV_CHAR_SYMLINK_CREATION="true")},
                "cuda": {"env": _env(WITH_WORKLOAD="false")},
                "plugin": {"env": _env(WITH_WORKLOAD="false")},
            },
            "extraObjects": node_features_objects(namespace, tools_image),
            "devicePlugin": {
                "env": _env(
                    MOCK_NVML_CONFIG="/host" + OPERAND_NVML,
                    CDI_DISABLE_HOOKS="disable-device-node-modification",
                )
            },
            "gfd": {"env": _env(MOCK_NVML_CONFIG=OPERAND_NVML)},
            "migManager": {"env": _env(MOCK_NVML_CONFIG="/host" + OPERAND_NVML)},
        },
    }


def _mig_manager_checksum(st: LabState) -> dict[str, str]:
    """The nvidia-mig-manager .deb the lab mirror serves is packed here from NVIDIA's packaging, so its
    bytes are not NVIDIA's release asset's: pin the served file (a site pins the file it checked)."""
    pattern = "mig-parted/v*/nvidia-mig-manager_*.deb"
    served = sorted(Path(st.mirror_dir).glob(pattern)) if st.mirror_dir else []
    if len(served) != 1:
        return {}
    return {"nvidia_mig_manager_deb_sha256": hashlib.sha256(served[0].read_bytes()).hexdigest()}


def write(st: LabState, *, kubernetes: bool = True) -> Path:
    path = st.paths.inventory
    header = (
        f"# gpuprov lab {st.name!r}: written by `gpuprov lab inventory`/`lab up`; hosts are simulated.\n"
        f"# Control plane: {', '.join(h.name for h in st.hosts if h.name == plan.CONTROL_PLANE) or '-'}\n"
        + ("" if kubernetes else "# GPU hosts outside Kubernetes (lab inventory --standalone-gpus).\n")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(header + dump(document(st, kubernetes=kubernetes)))
    tmp.replace(path)
    return path


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a value as often as it occurs: gpuprov refuses YAML aliases in an inventory, and hosts of
    one distribution share their settings' objects (which PyYAML would write once, then alias)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(doc: dict[str, Any]) -> str:
    """The inventory document as YAML, in the order it was built, without anchors or aliases."""
    return yaml.dump(doc, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=1000)
