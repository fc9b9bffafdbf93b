"""Part of the gpuprov lab: the configuration of NVIDIA's mock NVML for one lab host.

The lab's driver packages carry NVIDIA's own mock libnvidia-ml.so and libcuda.so (k8s-test-infra,
pkg/gpu/mocknvml and pkg/gpu/mockcuda), which answer NVML calls from a YAML file named by
MOCK_NVML_CONFIG (format: k8s-test-infra docs/mocknvml/configuration.md; NVIDIA's own profiles in
pkg/gpu/mocknvml/configs). So the real `nvidia-ctk cdi generate` and everything else that links NVML
see the host's GPUs.

:func:`mock_config` writes that file's device part from the vendor profile of the GPU's architecture
(H100 for Hopper, A100 for Ampere, L40S for Ada), with the lab profile's board (name, PCI ids, memory,
VBIOS, power and link limits; the H200 model comes from a real H200's capture) and one device per GPU
(UUID, bus id, minor number as the simulated nvidia-smi reports them). The ``system`` section (driver,
NVML and CUDA versions) is left out: the host's simulated kernel adds it when the nvidia module loads
(gpu/kmod.py), from the loaded module's version, and removes the file when it unloads, so NVML
fails to initialise while no driver is loaded, as it does on a real host.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from gpuprov_lab import vendor

# Architecture (profile.json's "architecture") → NVIDIA's mock profile of that generation.
BASE_PROFILES = {
    "Hopper": "configs/mock-nvml-config-h100.yaml",
    "Ampere": "configs/mock-nvml-config-a100.yaml",
    "Ada Lovelace": "configs/mock-nvml-config-l40s.yaml",
}
HEADER = (
    "# NVIDIA mock NVML configuration for this gpuprov lab host (the GPUs are SIMULATED). Written by\n"
    "# `gpuprov lab up` from NVIDIA's mock profile of the GPU generation and this host's profile.json;\n"
    "# the system section is added when the simulated nvidia module loads.\n"
)


def mock_config(profile: dict[str, Any]) -> str | None:
    """The device part of the mock NVML configuration for a host's profile.json (None for a host without
    GPUs), as JSON (which YAML reads too), so the host's simulated kernel can add the system section and
    drop the GPUs NVML would not enumerate with nothing but Python's standard library."""
    doc = mock_config_doc(profile)
    return None if doc is None else HEADER + json.dumps(doc, indent=1) + "\n"


def mock_config_doc(profile: dict[str, Any]) -> dict[str, Any] | None:
    """The device part of the mock NVML configuration, as a document."""
    gpus = profile.get("gpus") or []
    if not gpus:
        return None
    first = gpus[0]
    base_file = BASE_PROFILES.get(str(first.get("architecture")))
    if base_file is None:
        raise ValueError(f"no NVIDIA mock NVML profile for architecture {first.get('architecture')!r}")
    base = yaml.safe_load(vendor.artifact("nvml-mock", base_file).read_text())
    dd = base["device_defaults"]
    dd["name"] = first["name"]
    dd["board_part_number"] = first["board_part_number"]
    dd["vbios_version"] = first["vbios"]
    major, minor = str(first["compute_cap"]).split(".")
    dd["compute_capability"] = {"major": int(major), "minor": int(minor)}
    dd["pci"]["device_id"] = int(first["device_id"], 16) << 16 | 0x10DE
    dd["pci"]["subsystem_id"] = int(first["subsystem_device_id"], 16) << 16 | 0x10DE
    mib = 1024 * 1024
    total, reserved = int(first["memory_mib"]) * mib, int(first["reserved_mib"]) * mib
    dd["memory"].update(total_bytes=total, reserved_bytes=reserved, free_bytes=total - reserved, used_bytes=0)
    bar1 = int(first["bar1_mib"]) * mib
    dd["bar1_memory"].update(total_bytes=bar1, free_bytes=bar1)
    limit_mw = int(float(first["power_limit_w"]) * 1000)
    dd["power"].update(
        default_limit_mw=limit_mw,
        enforced_limit_mw=limit_mw,
        max_limit_mw=limit_mw,
        min_limit_mw=int(float(first["power_min_w"]) * 1000),
        current_draw_mw=int(float(first["idle_power_w"]) * 1000),
    )
    dd["pcie"].update(
        max_link_gen=int(first["link_gen_max"]),
        current_link_gen=int(first["link_gen_max"]),
        max_link_width=int(first["link_width_max"]),
        current_link_width=int(first["link_width_max"]),
    )
    base.pop("system", None)
    # NVIDIA's topology sections describe the 8-GPU board of its profile; other boards get none.
    if len(gpus) != len(base.get("devices") or []):
        base.pop("nvlink", None)
        base.pop("pcie_topology", None)
    base["devices"] = [
        {
            "index": int(g["index"]),
            "uuid": g["uuid"],
            "serial": g["serial"],
            "pci": {"bus_id": str(g["bus_id"]).upper()},
            "minor_number": int(g["minor_number"]),
        }
        for g in gpus
    ]
    return base
