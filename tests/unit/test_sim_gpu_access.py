"""The lab kubelet's answer to "does this container get its GPU?" (lab/gpuprov_lab/sim/kube_gpu.py), from
real inputs: the device plugin's CDI spec as the real nvidia-ctk 1.20.0 writes it against NVIDIA's mock
NVML (vendor k8s.device-plugin.nvidia.com, devices by UUID, as the plugin's own nvcdi library names them),
and containerd configurations of each generation as the containerd_config role writes them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import role_plugins
from gpuprov_lab import vendor
from gpuprov_lab.sim import kube_gpu, nvml, profiles
from gpuprov_lab.sim.kube_host import Host

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "containerd"
VERSION = "580.159.04"


cc = role_plugins.containerd_config()
VERSIONS = {"1.6": "containerd 1.6.20", "1.7": "containerd 1.7.24", "2.1": "containerd v2 2.1.9"}
# The device plugin as the GPU Operator sets it up with cdi.enabled (object_controls.go
# transformDevicePluginCtrForCDI) and without (the manifest's envvar).
CDI_PLUGIN = kube_gpu.DevicePlugin.from_env({"DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri"})
ENVVAR_PLUGIN = kube_gpu.DevicePlugin.from_env({"DEVICE_LIST_STRATEGY": "envvar"})


@pytest.fixture(scope="module")
def cdi_spec(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    """The real nvidia-ctk's CDI spec for a lab H100 8-GPU host (mock NVML, real char device nodes)."""
    root = tmp_path_factory.mktemp("driver-root")
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libnvidia-ml.so", "libcuda.so"):
        (lib / f"{name}.{VERSION}").write_bytes(
            vendor.artifact("nvml-mock", f"lib/{name}.550.163.01").read_bytes()
        )
        (lib / f"{name}.1").symlink_to(f"{name}.{VERSION}")
    doc = profiles.profile_document("h100-sxm-8", "gpu2")
    (root / "dev").mkdir()
    for g in doc["gpus"]:
        os.mknod(root / f"dev/nvidia{g['minor_number']}", 0o20666, os.makedev(195, g["minor_number"]))
    os.mknod(root / "dev/nvidiactl", 0o20666, os.makedev(195, 255))
    os.mknod(root / "dev/nvidia-uvm", 0o20666, os.makedev(511, 0))
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    (root / "usr/bin/nvidia-smi").chmod(0o755)
    config = root / "nvml.yaml"
    system = {"driver_version": VERSION, "nvml_version": f"13.{VERSION}", "cuda_version": "13.0",
              "cuda_version_major": 13, "cuda_version_minor": 0}  # fmt: skip
    config.write_text(json.dumps({"system": system, **(nvml.mock_config_doc(doc) or {})}))
    res = subprocess.run(
        [
            str(vendor.nvidia_ctk()),
            "cdi",
            "generate",
            "--driver-root",
            str(root),
            "--dev-root",
            str(root),
            "--vendor",
            kube_gpu.PLUGIN_CDI_VENDOR,
            "--class",
            "gpu",
            "--device-name-strategy",
            "uuid",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "MOCK_NVML_CONFIG": str(config), "LD_LIBRARY_PATH": str(lib)},
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, doc["gpus"]


def _host(tmp_path: Path, generation: str, settings: dict[str, Any], spec: str) -> Host:
    text = (FIXTURES / f"config-default-{generation}.toml").read_text()
    text = cc.edit(
        text,
        VERSIONS[generation],
        {"runtimes": {"nvidia": {"binary": "/usr/bin/nvidia-container-runtime"}}, **settings},
    )
    (tmp_path / "etc/containerd").mkdir(parents=True)
    (tmp_path / "etc/containerd/config.toml").write_text(text)
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    (tmp_path / "var/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml").write_text(spec)
    return Host(root=tmp_path)


def test_cdi_devices_reach_the_container_where_containerd_has_cdi_on(tmp_path: Path, cdi_spec: Any) -> None:
    spec, gpus = cdi_spec
    got = kube_gpu.access(_host(tmp_path, "1.7", {"enable_cdi": True}, spec), CDI_PLUGIN, None, gpus[2:4])
    # The device nodes the real spec lists for those GPUs (by UUID, as the device plugin names them).
    assert {"/dev/nvidia2", "/dev/nvidia3", "/dev/nvidiactl"} <= set(got.devices), got
    assert "/dev/nvidia0" not in got.devices
    assert got.how.startswith("CDI")


def test_cdi_devices_are_lost_where_containerd_has_no_cdi(tmp_path: Path, cdi_spec: Any) -> None:
    spec, gpus = cdi_spec
    got = kube_gpu.access(_host(tmp_path, "1.6", {}, spec), CDI_PLUGIN, None, gpus[:1])
    assert got.devices == [] and "CDI off" in got.how
    # nvidia as containerd's default runtime does not help: the plugin sets no NVIDIA_VISIBLE_DEVICES.
    got = kube_gpu.access(
        _host(tmp_path / "b", "1.6", {"default_runtime": "nvidia"}, spec), CDI_PLUGIN, None, gpus[:1]
    )
    assert got.devices == [] and "only as CDI devices" in got.how


def test_the_plugins_devices_come_from_its_own_spec(tmp_path: Path, cdi_spec: Any) -> None:
    """The plugin names devices under its own CDI vendor: nvidia-ctk's nvidia.com spec does not serve it."""
    spec, gpus = cdi_spec
    host = _host(tmp_path, "2.1", {}, spec.replace(kube_gpu.PLUGIN_CDI_VENDOR, "nvidia.com"))
    got = kube_gpu.access(host, CDI_PLUGIN, None, gpus[:1])
    assert got.devices == [] and "unresolvable CDI devices k8s.device-plugin.nvidia.com/gpu=GPU-" in got.how


def test_device_plugin_settings_from_its_environment() -> None:
    assert CDI_PLUGIN.cdi and not CDI_PLUGIN.envvar and CDI_PLUGIN.id_strategy == "uuid"
    assert CDI_PLUGIN.spec_path() == "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
    assert ENVVAR_PLUGIN.envvar and not ENVVAR_PLUGIN.cdi
    assert kube_gpu.DevicePlugin.from_env({}).strategies == ("envvar",)
    indexed = kube_gpu.DevicePlugin.from_env(
        {"DEVICE_LIST_STRATEGY": "cdi-cri", "DEVICE_ID_STRATEGY": "index"}
    )
    assert indexed.device_name({"uuid": "GPU-x", "index": 3}, 0) == "k8s.device-plugin.nvidia.com/gpu=3"


def test_containerd_2_has_cdi_on_by_default(tmp_path: Path, cdi_spec: Any) -> None:
    spec, gpus = cdi_spec
    assert kube_gpu.access(_host(tmp_path, "2.1", {}, spec), CDI_PLUGIN, None, gpus[:1]).devices


@pytest.mark.parametrize(
    ("settings", "handler", "gets_gpu"),
    [
        ({"default_runtime": "nvidia"}, None, True),
        ({}, None, False),  # runc ignores NVIDIA_VISIBLE_DEVICES
        ({}, "nvidia", True),  # runtimeClassName: nvidia
    ],
)
def test_envvar_needs_the_nvidia_runtime(
    tmp_path: Path, cdi_spec: Any, settings: dict, handler: str | None, gets_gpu: bool
) -> None:
    spec, gpus = cdi_spec
    got = kube_gpu.access(_host(tmp_path, "1.6", settings, spec), ENVVAR_PLUGIN, handler, gpus[:1])
    assert bool(got.devices) is gets_gpu, got
    if gets_gpu:
        assert "/dev/nvidia0" in got.devices
