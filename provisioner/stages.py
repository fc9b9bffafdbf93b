"""The stage catalog: the bootstrap stages, in order. A stage is a role and an Ansible tag."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.errors import InputError


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    hosts: str  # the host pattern of the stage's play in playbooks/site.yml (docs/contracts.md)
    # Verification check ids that prove the stage's work: `checks` on the hosts the stage targets,
    # `gpu_checks` on the GPU nodes it targets or, for a cluster-wide stage, the cluster's GPU nodes (a
    # control plane has no GPU to find, yet the operator it installs must make the workers' GPUs
    # allocatable).
    checks: tuple[str, ...] = ()
    gpu_checks: tuple[str, ...] = ()

    def targets(self, groups: list[str] | set[str]) -> bool:
        """Whether a host in `groups` is one the stage's play runs on (`!group` excludes, as in Ansible)."""
        parts = self.hosts.split(":")
        excluded = any(p[1:] in groups for p in parts if p.startswith("!"))
        return not excluded and any(p in groups for p in parts if not p.startswith("!"))

    def check_ids_for(self, groups: list[str] | set[str]) -> tuple[str, ...]:
        ids = self.checks if self.targets(groups) else ()
        gpu_node = "gpu_nodes" in groups and (self.targets(groups) or "k8s_cluster" in groups)
        return ids + (self.gpu_checks if gpu_node else ())


STAGES: tuple[Stage, ...] = (
    Stage(
        "preflight",
        "check OS, GPU, Secure Boot, nouveau, headers, disk, apt lock, compatibility",
        "kube_control_plane:gpu_nodes",
        ("os.supported",),
        ("gpu.present",),
    ),
    Stage(
        "nvidia_driver",
        "NVIDIA driver from the CUDA repo: branch, open/proprietary, fabric manager",
        "gpu_nodes",
        gpu_checks=(
            "driver.loaded",
            "driver.version",
            "driver.userspace_match",
            "gpu.count",
            "gpu.persistence",
        ),
    ),
    Stage(
        "nvidia_mig_manager",
        "MIG layout on GPU hosts outside Kubernetes (NVIDIA's nvidia-mig-manager service)",
        "gpu_nodes:!k8s_cluster",
    ),
    Stage(
        "cuda_toolkit",
        "pinned CUDA toolkit(s), /usr/local/cuda alternative, PATH",
        "gpu_nodes",
        gpu_checks=("cuda.version",),
    ),
    Stage(
        "docker",
        "Docker engine, daemon.json merged",
        "kube_control_plane:gpu_nodes",
        ("services.active",),
    ),
    Stage(
        "nvidia_container_toolkit",
        "container toolkit; nvidia runtime for docker and containerd",
        "gpu_nodes",
        gpu_checks=("container_toolkit.runtime",),
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
        gpu_checks=("k8s.gpu_allocatable", "gpu.sharing", "mig.config", "monitoring.dcgm_exporter"),
    ),
    Stage(
        "gpu_tenants",
        "node pools (label, taint), tenant namespaces with GPU quotas and limits",
        "kube_control_plane",
        checks=("tenants.quota",),
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
