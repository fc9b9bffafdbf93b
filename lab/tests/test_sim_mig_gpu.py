"""MIG on the lab's simulated GPUs, driven in-process through nvidia-smi's real syntax (gpu/mig.py): the
H200's profile table is the real capture (read by the product's parser), layouts are placed and refused as
the driver does, the mode follows the holders of the GPU on Ampere, -L lists MIG devices in the real format
(read by the product's own parser), and the lab's mig-fail fault makes enabling MIG fail."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from gpuprov_lab import faults
from gpuprov_lab.gpu import mig
from gpuprov_lab.plan import PlannedHost
from gpuprov_lab.state import LabState
from sim_host import SimHost

from provisioner import mig as product_mig
from provisioner.errors import InputError
from provisioner.probes.smi import parse_nvidia_smi_xml

CAPTURE = Path(__file__).resolve().parents[2] / "tests/fixtures/hosts/h200-ubuntu2404"
H100_BUS0 = "00000000:18:00.0"
PERSISTENCE_WARNING = (
    "Warning: persistence mode is disabled on device {bus}. See the Known Issues section of the "
    "nvidia-smi(1) man page for more information. Run with [--help | -h] switch to get more information "
    "on how to enable persistence mode."
)


@pytest.fixture
def h200(tmp_path: Path) -> SimHost:
    host = SimHost(tmp_path, "h200")
    host.driver()
    return host


@pytest.fixture
def h100(tmp_path: Path) -> SimHost:
    host = SimHost(tmp_path, "h100-sxm-8")
    host.driver()
    return host


def mode(host: SimHost, gpu: int) -> str:
    rc, out = host.smi(
        "-i", str(gpu), "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"
    )
    assert rc == 0, out
    return out.strip()


def hold_gpu(host: SimHost, prog: str = "nvidia-persistenced") -> None:
    """A daemon holding /dev/nvidia* open, as the simulated ones register themselves."""
    with host.host.locked() as st:
        st["users"][prog] = os.getpid()


# ------------------------------------------------------------------------------ the real capture


def test_the_h200_table_is_the_real_capture() -> None:
    """`nvidia-smi mig -lgip`/`-lgipp` of a real H200, read by the product's parser: the simulated GPU's
    profiles, ids, counts and placements."""
    read = product_mig.parse_profiles(
        (CAPTURE / "nvidia-smi-mig-lgip.txt").read_text(), (CAPTURE / "nvidia-smi-mig-lgipp.txt").read_text()
    )
    real = [(p.name, p.profile_id, p.instances, p.placements, p.memory_slices) for p in read.values()]
    assert real == [(p.name, p.profile_id, p.total, p.starts, p.size) for p in mig.H200]


def test_the_h100_and_a100_tables_are_the_products() -> None:
    for device, table in ((0x2330, mig.H100_80GB), (0x20B2, mig.A100_80GB)):
        ours = {p.name: (p.total, p.size) for p in table}
        assert ours == {n: (q.max_count, q.memory) for n, q in product_mig.GPUS[device].profiles.items()}


def gis(host: SimHost, bus: str) -> list[tuple[int, int, int, int]]:
    """(GPU instance id, profile id, placement start, size) of a GPU's instances, by id."""
    cur = host.host.state()["mig"][bus]["gis"]
    return sorted((gi["id"], gi["profile"], gi["start"], gi["size"]) for gi in cur)


# ------------------------------------------------------------------------------------ layouts


def test_all_1g_18gb_on_the_h200(h200: SimHost) -> None:
    bus = "00000000:00:06.0"
    assert h200.smi("-i", "0", "-mig", "1") == (
        0,
        f"Enabled MIG Mode for GPU {bus}\n\n{PERSISTENCE_WARNING.format(bus=bus)}\nAll done.\n",
    )
    assert mode(h200, 0) == "Enabled, Enabled"
    rc, out = h200.smi("mig", "-cgi", ",".join(["1g.18gb"] * 7), "-C")
    assert rc == 0, out
    assert out.count("Successfully created GPU instance ID") == 7
    assert out.count("Successfully created compute instance ID  0 on GPU  0 GPU instance ID") == 7
    # The driver's first choice for a 1g instance is slot 6 (GI 13), then 4, 5, 0..3.
    assert (
        out.splitlines()[0]
        == "Successfully created GPU instance ID 13 on GPU  0 using profile MIG 1g.18gb (ID 19)"
    )
    assert gis(h200, bus) == [(gi, 19, gi - 7, 1) for gi in range(7, 14)]
    listing = h200.smi("-L")[1]
    assert product_mig.parse_mig_devices(listing) == {0: {"1g.18gb": 7}}
    mig_lines = listing.splitlines()[1:]
    assert all(
        re.fullmatch(r"  MIG 1g\.18gb     Device  \d: \(UUID: MIG-[0-9a-f-]{36}\)", ln) for ln in mig_lines
    )
    assert len({ln.split("UUID: ")[1] for ln in mig_lines}) == 7
    gpu = parse_nvidia_smi_xml(h200.smi("-q", "-x")[1]).gpus[0]
    assert gpu.mig_mode == "Enabled"


def test_a_balanced_mix_on_one_h100_leaves_the_others_alone(h100: SimHost) -> None:
    assert h100.smi("-i", "0", "-mig", "1")[0] == 0
    rc, out = h100.smi("mig", "-i", "0", "-cgi", "3g.40gb,2g.20gb,1g.10gb,1g.10gb", "-C")
    assert rc == 0, out
    # As NVIDIA's H100 example places 3g.40gb then 2g.20gb (GI 2 at 4:4, GI 3 at 0:2).
    assert gis(h100, H100_BUS0) == [(2, 9, 4, 4), (3, 14, 0, 2), (9, 19, 2, 1), (10, 19, 3, 1)]
    assert product_mig.parse_mig_devices(h100.smi("-L")[1]) == {
        0: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        **{i: {} for i in range(1, 8)},
    }
    assert [mode(h100, i) for i in (0, 1)] == ["Enabled, Enabled", "Disabled, Disabled"]
    assert h100.smi("-i", "1", "mig", "-dgi") == (6, "No MIG-enabled devices found.\n")


def test_layouts_beyond_the_gpu_are_refused_with_the_drivers_error(h100: SimHost) -> None:
    assert h100.smi("-i", "0", "-mig", "1")[0] == 0
    # The User Guide's own example: with 3g.40gb last there is no 4-slot placement left.
    rc, out = h100.smi("mig", "-i", "0", "-cgi", "19,19,14,9")
    assert (rc, out.splitlines()[-2:]) == (
        23,
        [
            "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources",
            "Failed to create GPU instances: Insufficient Resources",
        ],
    )
    assert out.count("Successfully created GPU instance") == 3  # what came before stays created
    assert h100.smi("mig", "-i", "0", "-cgi", "7g.80gb")[0] == 23
    rc, out = h100.smi("mig", "-i", "0", "-cgi", "9g.99gb")
    assert (rc, out.splitlines()[0]) == (
        6,
        "Unable to create a GPU instance on GPU  0 using profile 9g.99gb: Not Found",
    )
    assert h100.smi("mig", "-i", "1", "-cgi", "19")[0] == 6  # MIG off on GPU 1


def test_disable_tears_down_in_the_drivers_order(h100: SimHost) -> None:
    assert h100.smi("-i", "0", "-mig", "1")[0] == 0
    assert h100.smi("mig", "-i", "0", "-cgi", "7g.80gb", "-C")[0] == 0
    assert h100.smi("-i", "0", "-mig", "0") == (
        19,
        f"Unable to disable MIG Mode for GPU {H100_BUS0}: In use by another client\n"
        "Terminating early due to previous errors.\n",
    )
    assert h100.smi("mig", "-dgi") == (
        19,
        "Unable to destroy GPU instance ID  0 from GPU  0: In use by another client\n"
        "Failed to destroy GPU instances: In use by another client\n",
    )
    assert h100.smi("mig", "-dci") == (
        0,
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  0\n",
    )
    assert h100.smi("mig", "-dgi") == (0, "Successfully destroyed GPU instance ID  0 from GPU  0\n")
    assert h100.smi("mig", "-dgi") == (6, "No GPU instances found: Not Found\n")
    assert h100.smi("-i", "0", "-mig", "0")[0] == 0
    assert mode(h100, 0) == "Disabled, Disabled"
    assert h100.smi("-L")[1].count("MIG") == 0


def test_a_gpu_instance_without_compute_instance_is_no_device(h200: SimHost) -> None:
    assert h200.smi("-mig", "1")[0] == 0
    assert h200.smi("mig", "-cgi", "9")[1] == (
        "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.71gb (ID  9)\n"
    )
    assert product_mig.parse_mig_devices(h200.smi("-L")[1]) == {0: {}}  # no compute instance, no device
    for listing in ("-lgip", "-lgipp", "-lgi", "-lci", "-cci"):  # nothing in the lab runs them
        assert h200.smi("mig", listing) == (2, f"gpuprov lab: nvidia-smi mig {listing} is not simulated\n")


# ------------------------------------------------------------------------- who holds the GPU


def test_ampere_stays_pending_while_a_client_holds_the_gpu(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "a100-4")
    host.driver()
    bus = "00000000:01:00.0"
    hold_gpu(host)
    assert host.smi("-i", "0", "-mig", "1") == (
        0,
        f"Warning: MIG mode is in pending enable state for GPU {bus}:In use by another client\n"
        f"{bus} is currently being used by one or more other processes (e.g. CUDA application or a "
        "monitoring application such as another instance of nvidia-smi). Please first kill all processes "
        "using the device and retry the command or reboot the system to make MIG mode effective.\n"
        "All done.\n",
    )
    assert mode(host, 0) == "Disabled, Enabled"
    assert host.smi("-i", "0", "mig", "-cgi", "19") == (6, "No MIG-enabled devices found.\n")
    # A GPU reset would apply it, but the holder blocks that too (what mig-parted then reports).
    assert host.smi("-r", "-i", bus) == (
        255,
        f"The following GPUs could not be reset:\n  GPU {bus}: In use by another client\n\n"
        "1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
        "application, graphics application such as an X server, or a monitoring application such as another "
        "instance of nvidia-smi). Please first kill all processes using this device and all compute "
        "applications running in the system.\n",
    )
    with host.host.locked() as st:
        st["users"].clear()
    assert host.smi("-r", "-i", bus) == (0, f"GPU {bus} was successfully reset.\nAll done.\n")
    assert mode(host, 0) == "Enabled, Enabled"
    assert host.smi("-i", "1", "-mig", "1")[0] == 0  # nothing holds GPU 1 now: at once
    assert mode(host, 1) == "Enabled, Enabled"


def test_ampere_applies_a_pending_change_at_the_driver_reload_hopper_forgets_the_mode(tmp_path: Path) -> None:
    a100 = SimHost(tmp_path / "a100", "a100-4")
    a100.driver()
    hold_gpu(a100)
    assert a100.smi("-i", "0", "-mig", "1")[0] == 0
    with a100.host.locked() as st:
        st["users"].clear()
    h100 = SimHost(tmp_path / "h100", "h100-sxm-8")
    h100.driver()
    hold_gpu(h100, "nv-fabricmanager")
    assert h100.smi("-i", "0", "-mig", "1")[0] == 0
    assert mode(h100, 0) == "Enabled, Enabled"  # Hopper needs no reset: clients do not hold it back
    assert h100.smi("mig", "-i", "0", "-cgi", "19", "-C")[0] == 0
    with h100.host.locked() as st:
        st["users"].clear()
    for host in (a100, h100):
        for module in ("nvidia_uvm", "nvidia"):
            assert host.kmod("rmmod", module)[0] == 0
        assert host.kmod("modprobe", "nvidia")[0] == 0
    assert mode(a100, 0) == "Enabled, Enabled"
    assert mode(h100, 0) == "Disabled, Disabled"
    assert h100.smi("-L")[1].count("MIG") == 0


# ---------------------------------------------------------------------------- without MIG, faults


def test_a_gpu_without_mig_answers_as_the_real_tool(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "l40s")
    host.driver()
    assert mode(host, 0) == "[N/A], [N/A]"
    assert host.smi("-mig", "1") == (
        0,
        "Unable to enable MIG Mode for GPU 00000000:4B:00.0: Not Supported\n"
        "Treating as warning and moving on.\nAll done.\n",
    )
    assert host.smi("mig", "-cgi", "19") == (6, "No MIG-enabled devices found.\n")
    assert "<current_mig>N/A</current_mig>" in host.smi("-q", "-x")[1]


def test_the_mig_fail_fault_makes_enabling_fail(h100: SimHost) -> None:
    h100.set_faults([{"kind": "mig-fail"}])
    assert h100.smi("-i", "0", "-mig", "1") == (
        255,
        f"Unable to enable MIG Mode for GPU {H100_BUS0}: Unknown Error\n"
        "Terminating early due to previous errors.\n",
    )
    assert mode(h100, 0) == "Disabled, Disabled"
    h100.set_faults([])
    assert h100.smi("-i", "0", "-mig", "1")[0] == 0


def test_lab_fault_accepts_mig_fail_as_a_host_fault() -> None:
    lab = LabState(
        name="t", subnet="10.9.0.0/24", gateway="10.9.0.1", mirror_port=1,
        hosts=[PlannedHost("cp1", 1, "10.9.0.11", "cpu", 0), PlannedHost("gpu1", 2, "10.9.0.12", "h200", 1)],
    )  # fmt: skip
    assert faults.build_fault(lab, "gpu1", "mig-fail", None, None) == {"kind": "mig-fail"}
    assert faults.build_fault(lab, "gpu1", "clear", None, None) is None
    with pytest.raises(InputError, match="--gpu applies to GPU faults"):
        faults.build_fault(lab, "gpu1", "mig-fail", 0, None)


def test_bad_arguments_are_refused_like_the_real_tool(h200: SimHost) -> None:
    invalid = (2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
    assert h200.smi("-mig", "2") == invalid
    assert h200.smi("mig", "-cgi") == invalid
    assert h200.smi("mig", "-dgi", "-dci") == invalid
    assert h200.smi("mig", "-dgi", "-C") == invalid


def test_changes_need_root_on_a_host(h200: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(h200.host), "on_host", property(lambda _self: True))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc, out = h200.smi("-mig", "1")
    assert (rc, out.splitlines()[0]) == (
        4,
        "Unable to enable MIG Mode for GPU 00000000:00:06.0: Insufficient Permissions",
    )
    assert h200.smi("mig", "-dgi") == (4, "Failed to destroy GPU instances: Insufficient Permissions\n")
    assert mode(h200, 0) == "Disabled, Disabled"  # reading needs no root


def test_the_mig_fail_fault_makes_instance_creation_fail_too(h100: SimHost) -> None:
    """A layout change on a GPU already in MIG mode needs no mode change: the fault breaks it all the same."""
    assert h100.smi("-i", "0", "-mig", "1")[0] == 0
    h100.set_faults([{"kind": "mig-fail"}])
    rc, out = h100.smi("mig", "-i", "0", "-cgi", "1g.10gb", "-C")
    assert rc == 255 and "Unknown Error" in out, out
    h100.set_faults([])
    assert h100.smi("mig", "-i", "0", "-cgi", "1g.10gb", "-C")[0] == 0
