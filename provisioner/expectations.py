"""What one host should look like: the expectations the checks judge a host against.

A policy file (provisioner.policy) or the inventory's settings (provisioner.bootstrap) fill them in;
the checks only read them. Kept apart from the policy so that the checks, which the policy validates
its check ids against, do not import the policy back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.tenants import Tenant

SUPPORTED_OS: tuple[str, ...] = ("ubuntu 22.04", "ubuntu 24.04", "debian 12", "debian 13")
CONTAINER_ENGINES: tuple[str, ...] = ("docker", "containerd")


@dataclass
class Expectations:
    """What one host should look like. None = not set: the check derives it or skips."""

    os_supported: tuple[str, ...] = SUPPORTED_OS
    gpu_present: bool | None = None
    gpu_count: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_persistence: bool | None = None
    gpu_ecc: bool | None = None
    packages_held: tuple[str, ...] | None = None
    services_active: tuple[str, ...] | None = None
    container_toolkit_runtime: tuple[str, ...] | None = None
    k8s_node: bool | None = None
    xid_ignore: tuple[int, ...] = ()
    container_smoke_image: str | None = None
    dcgm_diag: bool = True
    skip_checks: tuple[str, ...] = ()
    sharing_strategy: str | None = None  # none | time-slicing | mps (the device plugin's GPU sharing)
    sharing_replicas: int | None = None  # replicas per GPU under time-slicing or MPS
    mig_config: str | None = None  # the MIG layout the node must have (nvidia.com/mig.config)
    mig_strategy: str | None = None  # single | mixed: how the device plugin advertises MIG devices
    dcgm_exporter: bool | None = None  # the GPU Operator's DCGM exporter must serve this node's GPUs
    tenants: tuple[Tenant, ...] | None = None  # namespaces with GPU quotas (checked on the control plane)
    # key (policy name) → where its value came from, e.g. "policy.yml groups.gpu_nodes"
    sources: dict[str, str] = field(default_factory=dict)

    def source(self, key: str) -> str:
        return self.sources.get(key, "default")
