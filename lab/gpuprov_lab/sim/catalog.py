"""Part of the gpuprov lab simulation: the simulated vendor repositories and what they publish.

``REPOS`` maps a repository key to its path under the lab mirror and its apt layout (docs/contracts.md,
"Mirror layout"); :func:`all_packages` is every simulated package with the repositories it goes into.
The Kubernetes side (kubeadm, kubelet, kubectl, helm, the chart repository, the CNI manifest) is
real, packaged by ``gpuprov_lab.kube.packages``.

A package whose repo is :data:`DEBIAN` (the simulated kernel headers for the lab's running kernel) is
published in the lab's Debian archive, where a real host finds ``linux-headers-$(uname -r)``.
"""

from __future__ import annotations

from typing import Any

from gpuprov_lab.sim import nct, nvidia
from gpuprov_lab.sim.debs import SimPackage

# Repo key of packages that belong in the distro archive (not a vendor repository).
DEBIAN = "debian"

REPOS: dict[str, tuple[str, Any]] = {
    "cuda-debian12": ("cuda/repos/debian12/x86_64/", "flat"),
    "cuda-debian13": ("cuda/repos/debian13/x86_64/", "flat"),
    "nct": ("libnvidia-container/stable/deb/amd64/", "flat"),
    "k8s-1.36": ("kubernetes/core:/stable:/v1.36/deb/", "flat"),
    "helm": ("helm-debian/any/", ("dists", "any", "main")),
}


def gpu_packages() -> list[SimPackage]:
    """The NVIDIA side: driver branches, fabric manager, DCGM, CUDA toolkits, container toolkit."""
    return [*nvidia.packages(), *nct.packages()]


def all_packages() -> list[SimPackage]:
    from gpuprov_lab.kube import packages

    return [*gpu_packages(), *packages.packages()]


def extra_mirror_files() -> dict[str, bytes]:
    """Files served by the mirror besides the repositories (helm chart repo, CNI manifest)."""
    from gpuprov_lab.kube import packages

    return packages.extra_mirror_files()
