"""The lab's Ansible inventory: the groups of docs/contracts.md, root over SSH with the lab key and host
key checking on, the mirror knobs, and per host the lab profile (for tests only)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from gpuprov_lab import distros, keys, plan
from gpuprov_lab.mirror import KEY_NAME
from gpuprov_lab.state import LabState


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
                "lab_name": st.name,
                **_flannel_checksum(st),
                **_mig_manager_checksum(st),
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


def _flannel_checksum(st: LabState) -> dict[str, str]:
    """The lab mirror serves its own kube-flannel.yml, not upstream's bytes: pin the served file's checksum
    (as a site whose mirror holds a patched manifest would) so the kubernetes role's check passes."""
    served = sorted(Path(st.mirror_dir).glob("flannel/v*/kube-flannel.yml")) if st.mirror_dir else []
    if len(served) != 1:
        return {}
    digest = hashlib.sha256(served[0].read_bytes()).hexdigest()
    return {"kubernetes_flannel_manifest_checksum": f"sha256:{digest}"}


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
    tmp.write_text(
        header
        + yaml.safe_dump(
            document(st, kubernetes=kubernetes), sort_keys=False, default_flow_style=False, width=1000
        )
    )
    tmp.replace(path)
    return path
