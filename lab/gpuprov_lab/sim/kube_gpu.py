"""Which GPU device nodes a pod's container gets, SIMULATED (gpuprov lab) from the real inputs.

No container runs on a lab host's kubelet, so the device nodes a container requesting nvidia.com/gpu
would see are worked out here, from what the real components on the host say:

- containerd's configuration as `containerd config dump` prints it (kube_host.containerd_config): the
  default runtime, each runtime's binary, enable_cdi and the CDI spec directories;
- the CDI specs in those directories, written by the real nvidia-ctk (the lab's toolkit packages carry
  NVIDIA's binaries; NVIDIA's nvidia-cdi-refresh writes /var/run/cdi/nvidia.yaml);
- how this node's device plugin hands the GPU over: its container's environment, which the GPU
  Operator set (kube_operator), and, with CDI, the CDI spec it wrote (kube_pods.device_plugin).

The rules, from the vendors' sources:

- GPU Operator v25.10.0, controllers/object_controls.go (transformDevicePluginCtrForCDI): with
  cdi.enabled the device plugin runs with DEVICE_LIST_STRATEGY=cdi-annotations,cdi-cri; otherwise with
  its default, envvar.
- k8s-device-plugin v0.18.0, internal/plugin/server.go (getAllocateResponse, updateResponseForCDI):
  cdi-cri puts the CDI device names in the response's CDIDevices and cdi-annotations puts them in
  cdi.k8s.io/ annotations; the names are k8s.device-plugin.nvidia.com/gpu=<id>
  (cmd/nvidia-device-plugin/plugin-manager.go: the plugin's CDI vendor; the id is the GPU's UUID under
  the default DEVICE_ID_STRATEGY uuid, its index under index); when every strategy is a CDI one the
  response has no NVIDIA_VISIBLE_DEVICES. envvar sets NVIDIA_VISIBLE_DEVICES to the GPUs' ids.
- containerd's CRI (1.7: pkg/cri/sbserver/container_create_linux.go, 2.x:
  internal/cri/server/container_create_linux.go, WithCDI / WithCDIDevices): CDI devices of the
  request (CDIDevices and cdi.k8s.io/ annotations) are applied to the container from the specs in
  cdi_spec_dirs (a later directory's spec of the same device wins) only when enable_cdi is on;
  containerd 1.6 has no CDI. The annotations reach the OCI runtime only through a runtime's
  container_annotations allow-list, which neither nvidia-ctk nor the role sets, so a runtime cannot
  resolve them instead.
- nvidia-container-runtime (nvidia-container-toolkit internal/modifier): NVIDIA_VISIBLE_DEVICES is read
  only by the nvidia runtime, so the container must run through it: the pod's RuntimeClass handler, or
  containerd's default runtime; runc ignores the variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import kube_util as u
from .kube_host import ContainerdConfig, Host, containerd_config

CDI_CLASS = "gpu"
PLUGIN_CDI_VENDOR = "k8s.device-plugin.nvidia.com"
CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")
NVIDIA_RUNTIME = "nvidia-container-runtime"


@dataclass(frozen=True)
class DevicePlugin:
    """The device plugin's settings that decide its Allocate answer (its environment variables)."""

    strategies: tuple[str, ...] = ("envvar",)
    id_strategy: str = "uuid"
    vendor: str = PLUGIN_CDI_VENDOR

    @classmethod
    def from_env(cls, env: dict[str, str]) -> DevicePlugin:
        # k8s-device-plugin v0.18.0 cmd/nvidia-device-plugin/main.go: DEVICE_LIST_STRATEGY defaults to
        # envvar, DEVICE_ID_STRATEGY to uuid.
        listed = (env.get("DEVICE_LIST_STRATEGY") or "envvar").split(",")
        strategies = tuple(s.strip() for s in listed if s.strip())
        return cls(strategies or ("envvar",), env.get("DEVICE_ID_STRATEGY") or "uuid")

    @property
    def cdi(self) -> bool:
        return any(s in CDI_STRATEGIES for s in self.strategies)

    @property
    def envvar(self) -> bool:
        return "envvar" in self.strategies

    def spec_path(self) -> str:
        return f"/var/run/cdi/{self.vendor}-{CDI_CLASS}.json"

    def device_name(self, gpu: dict[str, Any], index: int) -> str:
        ident = str(gpu.get("uuid")) if self.id_strategy == "uuid" else str(gpu.get("index", index))
        return f"{self.vendor}/{CDI_CLASS}={ident}"


@dataclass(frozen=True)
class GpuAccess:
    devices: list[str]  # device node paths the container sees (empty: no GPU)
    how: str  # how they got there, or why none did


def _cdi_specs(host: Host, dirs: list[str]) -> dict[str, dict[str, Any]]:
    """Qualified CDI device name (vendor/class=NAME) → {nodes: [...], common: [...]}; later directories
    win."""
    devices: dict[str, dict[str, Any]] = {}
    for d in dirs:
        for path in sorted(host.glob(f"{d.rstrip('/')}/*.yaml") + host.glob(f"{d.rstrip('/')}/*.json")):
            try:
                spec = u.yaml_load(host.read(path, "") or "")
            except Exception:  # a broken spec is skipped, as containerd's CDI cache does
                continue
            if not isinstance(spec, dict) or "/" not in str(spec.get("kind") or ""):
                continue
            kind = str(spec["kind"])
            common = [n.get("path") for n in (spec.get("containerEdits") or {}).get("deviceNodes") or []]
            for dev in spec.get("devices") or []:
                nodes = [n.get("path") for n in (dev.get("containerEdits") or {}).get("deviceNodes") or []]
                devices[f"{kind}={dev.get('name')}"] = {"nodes": nodes, "common": common, "spec": path}
    return devices


def access(
    host: Host,
    plugin: DevicePlugin,
    runtime_handler: str | None,
    gpus: list[dict[str, Any]],
    cfg: ContainerdConfig | None = None,
) -> GpuAccess:
    """The device nodes a container allocated ``gpus`` (the profile's GPU entries) would get."""
    cfg = cfg or containerd_config(host)
    if plugin.cdi and cfg.enable_cdi:
        specs = _cdi_specs(host, cfg.cdi_spec_dirs)
        nodes: list[str] = []
        for i, g in enumerate(gpus):
            name = plugin.device_name(g, i)
            dev = specs.get(name)
            if dev is None:
                # CRI fails the container: "unresolvable CDI devices"
                dirs = ", ".join(cfg.cdi_spec_dirs)
                return GpuAccess([], f"unresolvable CDI devices {name} (no spec under {dirs})")
            nodes += [n for n in dev["nodes"] + dev["common"] if n and n not in nodes]
        return GpuAccess(nodes, "CDI: containerd applied the device plugin's CDI devices")
    if not plugin.envvar:
        return GpuAccess(
            [],
            f"the device plugin hands GPUs out only as CDI devices ({','.join(plugin.strategies)}) and "
            f"containerd has CDI off ({cfg.source}; containerd 1.6 has none)",
        )
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
