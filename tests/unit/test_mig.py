"""MIG layouts checked before anything is touched: nvidia-mig-parted's format (agreeing with the real
parser, built from NVIDIA's source) and each GPU's profile table (agreeing with NVIDIA's own default
configurations, which name every profile of every GPU)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gpuprov_lab import vendor

from provisioner import mig
from provisioner.errors import InputError

H100, H200 = 0x2330, 0x2335


@pytest.fixture(scope="module")
def defaults() -> dict[str, list[mig.MigEntry]]:
    path = vendor.artifact("mig-parted", "systemd/config-default.yaml")
    return mig.parse_config(path.read_text(), path)


def fits(configs: dict[str, list[mig.MigEntry]], device: int) -> set[str]:
    return {
        n
        for n in configs
        if not mig.check_layout(configs, n, device_id=device, gpu_count=8, driver_branch=580)
    }


def test_nvidias_default_layouts_fit_exactly_the_gpus_they_were_written_for(defaults: dict) -> None:
    """The tables agree with NVIDIA: of its 80-odd default layouts, each GPU accepts the ones named
    after its own profiles (plus the generic ones) and refuses every other GPU's."""
    generic = {"all-disabled", "all-enabled", "all-balanced"}
    h200 = ["1g.18gb", "1g.18gb.me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    h100 = ["1g.10gb", "1g.10gb.me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert fits(defaults, H200) == generic | {f"all-{p}" for p in h200}
    assert fits(defaults, H100) == generic | {f"all-{p}" for p in h100}


LAYOUT = """version: v1
mig-configs:
  mine:
    - devices: {devices}
      mig-enabled: true
      mig-devices: {{{profiles}}}
"""


@pytest.mark.parametrize(
    ("profiles", "devices", "branch", "why"),
    [
        ('"1g.18gb": 8', "all", 580, "at most 7 × 1g.18gb"),
        ('"9g.99gb": 1', "all", 580, "no MIG profile '9g.99gb'"),
        ('"4g.71gb": 1, "3g.71gb": 1, "1g.18gb": 1', "all", 580, "8 compute and 9 memory slices"),
        ('"1g.35gb": 4, "1g.18gb": 1', "all", 580, "5 compute and 9 memory slices"),
        ('"1g.18gb": 7', "[0, 8]", 580, "GPU index 8 does not exist"),
        ('"1g.18gb": 7', "all", 535, "MIG from driver branch 550"),
    ],
)
def test_a_layout_the_h200_cannot_hold_is_refused(profiles: str, devices: str, branch: int, why: str) -> None:
    configs = mig.parse_config(LAYOUT.format(profiles=profiles, devices=devices), "layout.yaml")
    problems = mig.check_layout(configs, "mine", device_id=H200, gpu_count=8, driver_branch=branch)
    assert any(why in p for p in problems), problems


def test_a_layout_the_h200_can_hold_passes() -> None:
    configs = mig.parse_config(
        LAYOUT.format(profiles='"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2', devices="all"), "x"
    )
    assert mig.check_layout(configs, "mine", device_id=H200, gpu_count=8, driver_branch=580) == []
    assert (
        "no MIG configuration named 'other'"
        in mig.check_layout(configs, "other", device_id=H200, gpu_count=8)[0]
    )


def _real_parser_accepts(tmp_path: Path, text: str) -> bool:
    f = tmp_path / "config.yaml"
    f.write_text(text)
    binary = vendor.artifact("mig-parted", "bin/nvidia-mig-parted")
    res = subprocess.run([str(binary), "assert", "--valid-config", "-f", str(f), "-c", "mine"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return res.returncode == 0


@pytest.mark.parametrize(
    "text",
    [
        LAYOUT.format(profiles='"1g.18gb": 7', devices="all"),
        LAYOUT.format(profiles='"1g.18gb": 7', devices="all").replace("mig-devices", "migdevices"),
        LAYOUT.format(profiles='"1g.18gb": 7', devices="all").replace(
            "mig-enabled: true", "mig-enabled: yes please"
        ),
        LAYOUT.format(profiles='"1g.18gb": 7', devices="all").replace(
            "version: v1\n", "version: v1\nextra: 1\n"
        ),
    ],
)
def test_the_structure_check_agrees_with_nvidias_parser(tmp_path: Path, text: str) -> None:
    try:
        mig.parse_config(text, "config.yaml")
        ours = True
    except InputError:
        ours = False
    assert ours == _real_parser_accepts(tmp_path, text)


def test_the_h200_table_is_what_the_real_h200_reports() -> None:
    """nvidia-smi mig -lgip/-lgipp on a real H200 (driver 580.159.04, MIG mode off) give the same profile
    table as GPUS[0x2335]: names, instance counts, memory slices."""
    from provisioner.mig import GPUS, parse_profiles, table_from_profiles

    here = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"
    read = parse_profiles(
        (here / "nvidia-smi-mig-lgip.txt").read_text(), (here / "nvidia-smi-mig-lgipp.txt").read_text()
    )
    assert list(read) == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    assert read["1g.18gb"].placements == (0, 1, 2, 3, 4, 5, 6) and read["1g.18gb"].profile_id == 19
    assert (read["7g.141gb"].sms, read["7g.141gb"].memory_gib) == (132, 140.0)
    real = table_from_profiles("NVIDIA H200", 550, read)
    assert real.profiles == GPUS[0x2335].profiles


def test_profile_listings_of_another_shape_are_refused() -> None:
    from provisioner.mig import parse_profiles

    with pytest.raises(ValueError, match="no GPU instance profile"):
        parse_profiles("No MIG-enabled devices found.", "")
    lgip = "|   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |"
    with pytest.raises(ValueError, match="no placement for profile 19"):
        parse_profiles(lgip, "GPU  0 Profile ID 20 Placements: {0,1}:1")
