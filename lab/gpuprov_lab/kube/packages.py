"""The Kubernetes and helm packages the lab's mirror serves, laid out as their vendors publish them,
around the real binaries.

- pkgs.k8s.io (repository ``k8s-<minor>``): kubeadm, kubelet and kubectl are the vendored v1.36.3 builds
  (kubectl the upstream release binary from PyPI's kubectl layer), with the systemd unit and kubeadm's
  drop-in the Kubernetes project's packages install, their relations and maintainer scripts;
  kubernetes-cni carries Debian's containernetworking-plugins (the same CNI plugins, Debian's build).
  cri-tools is the one placeholder: no source or build of crictl is to be had here (nothing in gpuprov
  or kubeadm 1.36 runs it), so its crictl only says so.
- helm-debian (repository ``helm``): helm 4.2.3, the upstream release binary from the same PyPI layer.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

import yaml
from gpuprov_lab import debian, vendor
from gpuprov_lab.kube import binaries
from gpuprov_lab.sim.debs import SIMULATED, SimFile, SimPackage
from gpuprov_lab.sim.nvidia import systemd_scripts

# What the role pins for each minor (roles/kubernetes/vars/main.yml; provisioner/versions.yaml).
MINORS: dict[str, dict[str, str]] = {
    "1.36": {"kube": "1.36.3-1.1", "cri-tools": "1.36.0-1.1", "cni": "1.9.1-1.1"},
}
HELM_VERSION = "4.2.3-1"
HOMEPAGE = "https://kubernetes.io"
# Debian's containernetworking-plugins: the CNI reference plugins, installed under /usr/lib/cni.
CNI_SUITE = "trixie"

# The kubelet unit and kubeadm's drop-in for it, as pkgs.k8s.io's kubelet and kubeadm packages install
# them (kubernetes/release, cmd/krel/templates/latest/kubelet/kubelet.service and
# cmd/krel/templates/latest/kubeadm/10-kubeadm.conf).
FILES = Path(__file__).resolve().parent / "files"
KUBELET_SERVICE = (FILES / "kubelet.service").read_text()
KUBEADM_DROPIN = (FILES / "10-kubeadm.conf").read_text()
CRICTL_PLACEHOLDER = f"""#!/bin/sh
# crictl: {SIMULATED} placeholder of the cri-tools package (no source or build of crictl here).
echo "crictl is not available in the gpuprov lab: no build of cri-tools exists here" >&2
exit 1
"""


def _real(what: str) -> str:
    return f"{what}; packaged by the gpuprov lab as pkgs.k8s.io lays its package out"


def kube_packages(minor: str) -> list[SimPackage]:
    pins = MINORS[minor]
    repo = f"k8s-{minor}"
    kube = pins["kube"]
    upstream = kube.split("-")[0]
    built = (
        f"Kubernetes v{upstream} built from source (OpenShift's tree of it; flags, files and phases are "
        "upstream's)"
    )
    cni_plugins = debian.unpacked(CNI_SUITE, "containernetworking-plugins")
    cni_files = {
        f"/opt/cni/bin/{p.name}": SimFile(p.read_bytes(), 0o755)
        for p in sorted(cni_plugins.path("usr/lib/cni").iterdir())
        if p.is_file()
    }
    pkg = functools.partial(SimPackage, repo=repo, homepage=HOMEPAGE)
    return [
        pkg(
            name="kubelet",
            version=kube,
            description="Node agent for Kubernetes clusters",
            depends=["iptables (>= 1.4.21)", "kubernetes-cni (>= 1.2.0)", "libc6", "mount", "util-linux"],
            section="net",
            files={
                "/usr/bin/kubelet": SimFile(binaries.kubernetes("kubelet").read_bytes(), 0o755),
                "/usr/lib/systemd/system/kubelet.service": SimFile(KUBELET_SERVICE),
            },
            maintainer_scripts=systemd_scripts("kubelet.service"),
            real=_real(built),
        ),
        pkg(
            name="kubeadm",
            version=kube,
            description="Command-line utility for administering a Kubernetes cluster",
            depends=["cri-tools (>= 1.30.0)"],
            section="admin",
            files={
                "/usr/bin/kubeadm": SimFile(binaries.kubernetes("kubeadm").read_bytes(), 0o755),
                "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": SimFile(KUBEADM_DROPIN),
            },
            real=_real(built),
        ),
        pkg(
            name="kubectl",
            version=kube,
            description="Command-line utility for interacting with a Kubernetes cluster",
            section="admin",
            files={"/usr/bin/kubectl": SimFile(vendor.kubectl().read_bytes(), 0o755)},
            real=_real(f"kubectl v{upstream}, the Kubernetes project's release binary"),
        ),
        pkg(
            name="kubernetes-cni",
            version=pins["cni"],
            description="Binaries required to provision kubernetes container networking",
            section="net",
            files=cni_files,
            real=_real(
                f"the CNI reference plugins, Debian's containernetworking-plugins {cni_plugins.version}"
            ),
        ),
        pkg(
            name="cri-tools",
            version=pins["cri-tools"],
            description="Command-line utility for interacting with a container runtime",
            section="admin",
            files={"/usr/bin/crictl": SimFile(CRICTL_PLACEHOLDER, 0o755)},
        ),
    ]


def helm_package() -> SimPackage:
    return SimPackage(
        name="helm",
        version=HELM_VERSION,
        repo="helm",
        description="The Kubernetes Package Manager",
        section="devel",
        homepage="https://helm.sh",
        files={"/usr/bin/helm": SimFile(vendor.helm().read_bytes(), 0o755)},
        real="helm 4.2.3, the Helm project's release binary (from PyPI's kubectl/helm layer package)",
    )


def packages() -> list[SimPackage]:
    return [p for minor in MINORS for p in kube_packages(minor)] + [helm_package()]


# ------------------------------------------------------------------------------------ mirror files


def chart_index(tgz: bytes, version: str) -> bytes:
    """The chart repository's index.yaml for the chart archive, from its own Chart.yaml."""
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("gpu-operator/Chart.yaml")
        if member is None:
            raise ValueError("the chart archive has no gpu-operator/Chart.yaml")
        meta = yaml.safe_load(member.read().decode())
    entry = {
        **meta,
        "created": "2026-08-20T00:00:00.000000000Z",
        "digest": hashlib.sha256(tgz).hexdigest(),
        "urls": [f"gpu-operator-{version}.tgz"],
    }
    doc = {"apiVersion": "v1", "entries": {"gpu-operator": [entry]}, "generated": entry["created"]}
    return yaml.safe_dump(doc, sort_keys=True).encode()


def extra_mirror_files() -> dict[str, bytes]:
    """NVIDIA's helm chart repository (the real chart, packaged as released). flannel's manifest is not
    served: the lab's clusters use kubernetes_cni: bridge, flannel's images cannot be had here."""
    version = vendor.GPU_OPERATOR_CHART_VERSION
    tgz = vendor.gpu_operator_chart().read_bytes()
    return {
        "helm-charts/nvidia/index.yaml": chart_index(tgz, version),
        f"helm-charts/nvidia/gpu-operator-{version}.tgz": tgz,
    }
