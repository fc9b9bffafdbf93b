"""Which GPU device nodes a pod's container gets, SIMULATED (gpuprov lab) from the real inputs.

No container runs on a lab host's kubelet, so the device nodes a container requesting nvidia.com/gpu
would see are worked out here, from what the real components on the host say:

- containerd's configuration as `containerd config dump` prints it (kube_host.containerd_config): the
  default runtime, each runtime's binary, enable_cdi and the CDI spec directories;
- the CDI specs in those directories, written by the real nvidia-ctk (the lab's toolkit packages carry
  NVIDIA's binaries; NVIDIA's nvidia-cdi-refresh writes /var/run/cdi/nvidia.yaml);
- how the GPU Operator's device plugin hands the GPU over, from the ClusterPolicy's cdi.enabled.

The rules, from the vendors' sources:

- GPU Operator v25.10.0, controllers/object_controls.go (transformDevicePluginCtrForCDI): with
  cdi.enabled the device plugin runs with DEVICE_LIST_STRATEGY=cdi-annotations,cdi-cri; otherwise with
  its default, envvar.
- k8s-device-plugin v0.18.0, internal/plugin/server.go (getAllocateResponse): cdi-cri puts the CDI
  device names (nvidia.com/gpu=<UUID>, the default device-id-strategy uuid) in the response's
  CDIDevices and cdi-annotations in annotations; with only CDI strategies no NVIDIA_VISIBLE_DEVICES is
  set. envvar sets NVIDIA_VISIBLE_DEVICES to the GPUs' UUIDs.
- containerd's CRI (1.7: pkg/cri/sbserver/container_create_linux.go, 2.x:
  internal/cri/server/container_create_linux.go, WithCDI / WithCDIDevices): CDI devices of the
  request are applied to the container from the specs in cdi_spec_dirs (a later directory's spec of
  the same device wins) only when enable_cdi is on; containerd 1.6 has no CDI.
- nvidia-container-runtime (nvidia-container-toolkit internal/modifier): NVIDIA_VISIBLE_DEVICES is read
  only by the nvidia runtime, so the container must run through it: the pod's RuntimeClass handler, or
  containerd's default runtime; runc ignores the variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import kube_util as u
from .kube_host import ContainerdConfig, Host, containerd_config

CDI_KIND = "nvidia.com/gpu"
NVIDIA_RUNTIME = "nvidia-container-runtime"


@dataclass(frozen=True)
class GpuAccess:
    devices: list[str]  # device node paths the container sees (empty: no GPU)
    how: str  # how they got there, or why none did


def _cdi_specs(host: Host, dirs: list[str]) -> dict[str, dict[str, Any]]:
    """CDI device name (nvidia.com/gpu=NAME) → {nodes: [...], common: [...]}; later directories win."""
    devices: dict[str, dict[str, Any]] = {}
    for d in dirs:
        for path in sorted(host.glob(f"{d.rstrip('/')}/*.yaml") + host.glob(f"{d.rstrip('/')}/*.json")):
            try:
                spec = u.yaml_load(host.read(path, "") or "")
            except Exception:  # a broken spec is skipped, as containerd's CDI cache does
                continue
            if not isinstance(spec, dict) or spec.get("kind") != CDI_KIND:
                continue
            common = [n.get("path") for n in (spec.get("containerEdits") or {}).get("deviceNodes") or []]
            for dev in spec.get("devices") or []:
                nodes = [n.get("path") for n in (dev.get("containerEdits") or {}).get("deviceNodes") or []]
                devices[f"{CDI_KIND}={dev.get('name')}"] = {"nodes": nodes, "common": common, "spec": path}
    return devices


def access(
    host: Host,
    cdi_enabled: bool,
    runtime_handler: str | None,
    gpus: list[dict[str, Any]],
    cfg: ContainerdConfig | None = None,
) -> GpuAccess:
    """The device nodes a container allocated ``gpus`` (the profile's GPU entries) would get."""
    cfg = cfg or containerd_config(host)
    if cdi_enabled:
        if not cfg.enable_cdi:
            why = f"the device plugin names CDI devices but containerd has CDI off ({cfg.source})"
            return GpuAccess([], why)
        specs = _cdi_specs(host, cfg.cdi_spec_dirs)
        nodes: list[str] = []
        for g in gpus:
            name = f"{CDI_KIND}={g['uuid']}"
            dev = specs.get(name)
            if dev is None:
                return GpuAccess([], f"CDI device {name} is in no spec under {', '.join(cfg.cdi_spec_dirs)}")
            nodes += [n for n in dev["nodes"] + dev["common"] if n and n not in nodes]
        return GpuAccess(nodes, "CDI: containerd applied the device plugin's CDI devices")
    handler = runtime_handler or cfg.default_runtime
    binary = cfg.binary(handler)
    if not binary.endswith("/" + NVIDIA_RUNTIME) and binary != NVIDIA_RUNTIME:
        return GpuAccess(
            [],
            f"NVIDIA_VISIBLE_DEVICES is read only by the nvidia runtime, and the container runs through "
            f"{handler!r} ({binary or 'runc'}; {cfg.source})",
        )
    nodes = [f"/dev/nvidia{g['minor_number']}" for g in gpus]
    nodes += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    return GpuAccess(nodes, f"NVIDIA_VISIBLE_DEVICES through the {handler!r} runtime ({binary})")
