"""The stage catalog: the bootstrap stages, in order. A stage is a role and an Ansible tag."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.errors import InputError


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    hosts: str  # the inventory group the stage's play targets (docs/contracts.md)
    checks: tuple[str, ...] = ()  # verification check ids that prove the stage's work


STAGES: tuple[Stage, ...] = (
    Stage(
        "preflight",
        "check OS, GPU, Secure Boot, nouveau, headers, disk, apt lock, compatibility",
        "all",
        ("os.supported", "gpu.present"),
    ),
    Stage(
        "nvidia_driver",
        "NVIDIA driver from the CUDA repo: branch, open/proprietary, fabric manager",
        "gpu_nodes",
        ("driver.loaded", "driver.version", "driver.userspace_match", "gpu.count", "gpu.persistence"),
    ),
    Stage(
        "cuda_toolkit",
        "pinned CUDA toolkit(s), /usr/local/cuda alternative, PATH",
        "gpu_nodes",
        ("cuda.version",),
    ),
    Stage("docker", "Docker engine, daemon.json merged", "k8s_cluster:gpu_nodes", ("services.active",)),
    Stage(
        "nvidia_container_toolkit",
        "container toolkit; nvidia runtime for docker and containerd",
        "gpu_nodes",
        ("container_toolkit.runtime",),
    ),
    Stage(
        "kubernetes",
        "containerd, kubeadm init/join, kubelet hardening, CNI",
        "k8s_cluster",
        ("services.active", "k8s.node_ready"),
    ),
    Stage(
        "gpu_operator",
        "NVIDIA GPU Operator from its pinned chart, validated",
        "kube_control_plane",
        ("k8s.gpu_allocatable",),
    ),
)
# Not an Ansible play: `bootstrap` ends by verifying the hosts it worked on; `--skip verify` leaves it out.
VERIFY = "verify"
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)


def select_stages(only: list[str], skip: list[str]) -> list[str]:
    """Resolve --only/--skip into the ordered list of stages to run; unknown names are bad input."""
    for flag, names in (("--only", only), ("--skip", skip)):
        unknown = [n for n in names if n not in STAGE_NAMES and n != VERIFY]
        if unknown:
            raise InputError(
                f"{flag}: unknown stage {', '.join(unknown)} (stages: {', '.join((*STAGE_NAMES, VERIFY))})"
            )
    chosen = [s for s in (*STAGE_NAMES, VERIFY) if (not only or s in only) and s not in skip]
    if not chosen:
        raise InputError("--only/--skip leave no stage to run")
    return chosen
