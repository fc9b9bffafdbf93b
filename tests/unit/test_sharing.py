"""Device plugin sharing configs (`version: v1`), read as strictly as the plugin should: the examples of
NVIDIA's device plugin documentation pass, and what the plugin would silently ignore is refused."""

from __future__ import annotations

import pytest

from provisioner import sharing as S
from provisioner.errors import InputError

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def test_time_slicing_times_four_advertises_four_per_gpu() -> None:
    cfg = S.parse_config(TIME_SLICING, "ts.yaml")
    assert (cfg.strategy, cfg.rename_by_default, cfg.fail_requests_greater_than_one) == (
        "time-slicing",
        False,
        False,
    )
    (r,) = cfg.resources
    assert (r.name, r.devices, r.replicas, r.advertised) == ("nvidia.com/gpu", "all", 4, "nvidia.com/gpu")
    assert cfg.allocatable(8) == {"nvidia.com/gpu": 32}


def test_rename_by_default_and_short_names() -> None:
    cfg = S.parse_config(
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
        "    resources:\n    - name: gpu\n      replicas: 2\n      devices: [0, 1]\n",
        "ts.yaml",
    )
    (r,) = cfg.resources
    assert (r.name, r.rename, r.devices) == ("nvidia.com/gpu", "nvidia.com/gpu.shared", ("0", "1"))
    assert cfg.allocatable(4) == {"nvidia.com/gpu.shared": 4, "nvidia.com/gpu": 2}


def test_mps_fails_requests_for_more_than_one_unless_told_and_refuses_mig() -> None:
    cfg = S.parse_config(TIME_SLICING.replace("timeSlicing", "mps"), "mps.yaml")
    assert cfg.strategy == "mps" and cfg.fail_requests_greater_than_one is True
    S.check_against_mig(cfg, mig_enabled=False, where="gpu1")
    with pytest.raises(InputError, match="gpu1: MPS cannot share MIG-enabled GPUs"):
        S.check_against_mig(cfg, mig_enabled=True, where="gpu1")


def test_no_sharing_is_a_config_too() -> None:
    cfg = S.parse_config("version: v1\nflags:\n  migStrategy: mixed\n", "plain.yaml")
    assert cfg.strategy == "none" and cfg.allocatable(2) == {"nvidia.com/gpu": 2}


@pytest.mark.parametrize(
    "text,message",
    [
        (TIME_SLICING.replace("timeSlicing", "timeslicing"),
         r"ts\.yaml: sharing: unknown key 'timeslicing' \(did you mean timeSlicing\?\); the device plugin"),
        (TIME_SLICING.replace("replicas: 4", "replica: 4"), r"resources\[0\]: unknown key 'replica'"),
        (TIME_SLICING.replace("replicas: 4", "replicas: 1"), "number of replicas must be >= 2, got 1"),
        (TIME_SLICING.replace("replicas: 4", "replicas: '4'"), r"replicas \(2-1024\), got string '4'"),
        (TIME_SLICING.replace("name: nvidia.com/gpu", "name: Nvidia GPU"), "is not a Kubernetes resource"),
        (TIME_SLICING + "      devices: some\n", "the only word allowed is all"),
        (TIME_SLICING + "      devices: 0\n", "a count of devices must be more than 0"),
        (TIME_SLICING + "      devices: [0, 'GPU-xyz']\n", r"devices\[1\]: 'GPU-xyz' is no GPU index"),
        (TIME_SLICING.replace("version: v1", "version: v2"), "unknown version 'v2'"),
        (TIME_SLICING + "  mps:\n    resources:\n    - name: gpu\n      replicas: 2\n",
         "both timeSlicing and mps are set"),
        ("version: v1\nsharing:\n  timeSlicing:\n    resources: []\n", "no resources specified"),
        (TIME_SLICING.replace("    resources:", "    renameByDefault: yes please\n    resources:"),
         "renameByDefault: expected true or false"),
        ("version: v1\nshare: {}\n", "unknown key 'share'"),
    ],
)  # fmt: skip
def test_what_the_plugin_would_ignore_or_refuse_is_bad_input(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        S.parse_config(text, "ts.yaml")


def test_device_references_the_plugin_accepts() -> None:
    uuid = "b1028956-cfa2-0990-bf4a-5da9abb51763"
    text = TIME_SLICING + f"      devices: [0, '1:2', GPU-{uuid}, MIG-{uuid}, MIG-GPU-{uuid}/3/0]\n"
    (r,) = S.parse_config(text, "ts.yaml").resources
    assert r.devices == ("0", "1:2", f"GPU-{uuid}", f"MIG-{uuid}", f"MIG-GPU-{uuid}/3/0")
