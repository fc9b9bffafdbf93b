"""The lab's simulated GPU hosts, run against a temporary root: the sysfs devices, the kernel module
state, nvidia-smi and dmesg must read exactly as the real ones do through provisioner/probes/, and
each injected fault must change exactly the GPU it names (seen by the real checks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import sim_host
from gpuprov_lab import debian, vendor
from gpuprov_lab.sim import profiles
from sim_host import KERNEL, SimHost

from provisioner.checks import HostFacts, evaluate
from provisioner.expectations import Expectations
from provisioner.probes.host import nvidia_gpus, parse_driver_proc, parse_modules, parse_pci_devices
from provisioner.probes.kernel_log import parse_kernel_log
from provisioner.probes.smi import parse_nvidia_smi_xml, parse_smi_version

GPU_PROFILES = [name for name, p in profiles.PROFILES.items() if p.gpu_count]


@pytest.fixture
def h100(tmp_path: Path) -> SimHost:
    host = SimHost(tmp_path, "h100-sxm-8", "gpu2")
    host.driver()
    return host


def findings(host: SimHost, check_id: str) -> list[tuple[str, int | None]]:
    facts = HostFacts("gpu", host.probe_results())
    return [(f.status, f.gpu) for f in evaluate(facts, Expectations(), [check_id])]


# ------------------------------------------------------------------------------------------ profiles


def test_profiles_document_every_gpu_with_stable_distinct_uuids() -> None:
    for name in GPU_PROFILES:
        doc = profiles.profile_document(name, "gpu7")
        assert doc == json.loads(json.dumps(doc)), "profile.json must survive a JSON round trip unchanged"
        assert doc["gpu_count"] == profiles.PROFILES[name].gpu_count == len(doc["gpus"])
        uuids = [g["uuid"] for g in doc["gpus"]]
        assert len(set(uuids)) == len(uuids)
        assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in uuids)
        assert profiles.profile_document(name, "gpu7") == doc
        assert profiles.profile_document(name, "gpu8")["gpus"][0]["uuid"] != uuids[0]
    assert len(profiles.profile_document("h100-sxm-8", "x")["nvswitches"]) == 4
    assert profiles.PROFILES["h100-sxm-8"].needs_fabric_manager
    assert not profiles.PROFILES["a100-4"].needs_fabric_manager
    assert profiles.PROFILES["cpu"].gpu_count == 0
    h200 = profiles.profile_document("h200", "gpu1")["gpus"][0]
    assert (h200["pci_address"], h200["device_id"], h200["vbios"]) == (
        "0000:00:06.0",
        "0x2335",
        "96.00.A5.00.1A",
    )


def test_unknown_profile_is_refused() -> None:
    with pytest.raises(KeyError, match="h300"):
        profiles.profile_document("h300", "gpu1")


# --------------------------------------------------------------------------------- the real capture


def test_h200_output_matches_the_real_capture_except_identity_and_live_values(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.driver()
    sim_host.daemons.set_all_persistence(host.host, True)  # as nvidia-persistenced leaves it
    real_xml = Path(__file__).resolve().parents[2] / "tests/fixtures/hosts/h200-ubuntu2404/nvidia-smi-q-x.xml"
    rc, xml = host.smi("-q", "-x")
    assert rc == 0
    live = ("timestamp", "serial", "uuid", "pdi", "free", "power_draw")
    real = [
        ln
        for ln in real_xml.read_text().splitlines()
        if not any(f"<{t}" in ln or f"_{t}>" in ln for t in live)
    ]
    ours = [ln for ln in xml.splitlines() if not any(f"<{t}" in ln or f"_{t}>" in ln for t in live)]
    assert ours == real


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_every_profile_parses_like_a_real_host(tmp_path: Path, profile: str) -> None:
    host = SimHost(tmp_path, profile)
    host.driver()
    doc = profiles.profile_document(profile, "gpu1")
    pci = parse_pci_devices(host.pci_probe())
    gpus = nvidia_gpus(pci)
    assert [d.address for d in gpus] == [g["pci_address"] for g in doc["gpus"]]
    assert len([d for d in pci if d.is_nvswitch]) == len(doc["nvswitches"])
    rc, xml = host.smi("-q", "-x")
    assert rc == 0
    log = parse_nvidia_smi_xml(xml)
    assert log.driver_version == sim_host.DRIVER and log.cuda_version == "13.0"
    assert log.attached_gpus == len(log.gpus) == doc["gpu_count"]
    assert [g.bus_id for g in log.gpus] == [d.address for d in gpus]
    assert {g.name for g in log.gpus} == {doc["gpus"][0]["name"]}
    assert all(g.link_gen_current == g.link_gen_max and g.ecc_volatile_uncorrectable == 0 for g in log.gpus)
    listed = host.smi("-L")[1].splitlines()
    assert listed == [f"GPU {i}: {g['name']} (UUID: {g['uuid']})" for i, g in enumerate(doc["gpus"])]
    csv = host.smi("--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")[1]  # NVIDIA's
    assert csv.splitlines()[0] == f"0, {doc['gpus'][0]['name']}, {doc['gpus'][0]['memory_mib']}"
    csv = host.smi("--query-gpu=index,pcie.link.width.max", "--format=csv,noheader,nounits")[1]  # simulated
    assert csv.splitlines()[0] == "0, 16"
    driver = parse_driver_proc(host.probe_results()["proc-driver-nvidia-version"].stdout)
    assert (driver.version, driver.open_modules) == (sim_host.DRIVER, True)
    assert parse_smi_version(host.smi("--version")[1])["nvml version"] == "580.159"
    assert parse_kernel_log(host.dmesg()) == []
    assert set(parse_modules(host.probe_results()["modules.txt"].stdout)) == {"nvidia", "nvidia_uvm"}


def test_the_list_and_the_table_come_from_nvidias_real_nvidia_smi(tmp_path: Path) -> None:
    """-L and the summary table are NVIDIA's own binary (Debian's non-free build, its own version in
    the header) reading the mock NVML the simulated module wrote: the driver's version and only the GPUs
    NVML enumerates."""
    real = debian.unpacked(vendor.NVIDIA_SMI_SUITE, "nvidia-smi")
    binary_version = real.version.split(":")[-1].split("-")[0]
    host = SimHost(tmp_path, "a100-4")
    host.driver()
    lines = host.smi()[1].splitlines()
    assert all(len(ln) == 91 for ln in lines[1:] if ln.startswith(("|", "+")))
    assert re.fullmatch(
        rf"\| NVIDIA-SMI {re.escape(binary_version)} +Driver Version: 580\.159\.04 +CUDA Version: 13\.0 +\|",
        lines[2],
    ), lines[2]
    assert binary_version != sim_host.DRIVER
    assert sum(1 for ln in lines if "NVIDIA A100-SXM4-80GB" in ln) == 4
    assert "No running processes found" in host.smi()[1]
    doc = json.loads((host.root / "etc/gpuprov-lab/profile.json").read_text())
    host.set_faults([{"kind": "gpu-missing", "gpu": 1}])
    shown = [g for i, g in enumerate(doc["gpus"]) if i != 1]
    assert host.smi("-L")[1].splitlines() == [
        f"GPU {i}: {g['name']} (UUID: {g['uuid']})" for i, g in enumerate(shown)
    ]


def test_queries_without_a_simulated_field_are_nvidias_own(tmp_path: Path) -> None:
    """NVIDIA's binary answers, and refuses, every query of no simulated field; the front end refuses a
    field it does not answer next to one it does, by name."""
    host = SimHost(tmp_path, "l40s")
    host.driver()
    assert host.smi("--query-gpu=index,bogus.field", "--format=csv") == (
        2,
        'Field "bogus.field" is not a valid field to query.\n\n',
    )
    rc, out = host.smi("--query-gpu=index")
    assert rc == 2 and '"--format=" switch is missing' in out
    rc, out = host.smi("--query-gpu=mig.mode.current,memory.total", "--format=csv")
    assert rc == 2 and out.startswith('Field "memory.total" is not a valid field to query next to')
    rc, out = host.smi("-q")
    assert rc == 2 and "-q -x is" in out


# ------------------------------------------------------------------------------------------- faults

FAULT_CHECKS = [
    ({"kind": "ecc", "gpu": 3}, "gpu.ecc", "fail"),
    ({"kind": "xid", "gpu": 3, "xid": 79}, "gpu.xid", "fail"),
    ({"kind": "xid", "gpu": 3, "xid": 13}, "gpu.xid", "warn"),
    ({"kind": "pcie", "gpu": 3}, "gpu.pcie_link", "warn"),
    ({"kind": "gpu-missing", "gpu": 3}, "gpu.count", "fail"),
    ({"kind": "remap-pending", "gpu": 3}, "gpu.memory_remap", "warn"),
    ({"kind": "remap-failure", "gpu": 3}, "gpu.memory_remap", "fail"),
]


@pytest.mark.parametrize(("fault", "check_id", "status"), FAULT_CHECKS, ids=lambda v: str(v))
def test_a_fault_changes_exactly_its_gpu(h100: SimHost, fault: dict, check_id: str, status: str) -> None:
    assert {s for s, _ in findings(h100, check_id)} == {"pass"}
    h100.set_faults([fault])
    got = findings(h100, check_id)
    assert {g for s, g in got if s == status} == {3}, got
    assert all(s == "pass" or g == 3 for s, g in got), got
    h100.set_faults([])
    assert {s for s, _ in findings(h100, check_id)} == {"pass"}


def test_faults_reach_sysfs_xml_and_the_kernel_log(h100: SimHost) -> None:
    dev = h100.root / "sys/bus/pci/devices/0000:5d:00.0"
    assert (dev / "current_link_speed").read_text() == "32.0 GT/s PCIe\n"
    # Bound to the driver, both ways round as sysfs shows it (lspci -k resolves the link).
    assert (dev / "driver").resolve() == (h100.root / "sys/bus/pci/drivers/nvidia").resolve()
    assert (h100.root / "sys/bus/pci/drivers/nvidia/0000:5d:00.0").resolve() == dev.resolve()
    switch = h100.root / "sys/bus/pci/devices/0000:05:00.0"
    assert (switch / "driver").resolve().name == "nvidia-nvswitch"
    assert (switch / "class").read_text() == "0x068000\n"
    # Bare-metal GPUs can be reset (NVIDIA's MIG service looks for this file), write-only.
    assert (dev / "reset").stat().st_mode & 0o777 == 0o200 and not (switch / "reset").exists()
    assert (dev / "reset_method").read_text() == "flr\n"  # as a real H200 shows it
    h100.set_faults([{"kind": "pcie", "gpu": 3}, {"kind": "xid", "gpu": 2, "xid": 48}])
    log = parse_nvidia_smi_xml(h100.smi("-q", "-x")[1])
    assert (log.gpus[3].link_gen_current, log.gpus[3].link_width_current) == (3, 8)
    assert (dev / "current_link_speed").read_text() == "8.0 GT/s PCIe\n"
    assert (dev / "current_link_width").read_text() == "8\n"
    xids = parse_kernel_log(h100.dmesg())
    assert [(x.xid, x.pci) for x in xids] == [(48, "0000:3a:00")]
    h100.set_faults([{"kind": "gpu-missing", "gpu": 5}])
    log = parse_nvidia_smi_xml(h100.smi("-q", "-x")[1])
    assert log.attached_gpus == 7 and "0000:ab:00.0" not in [g.bus_id for g in log.gpus]
    assert (h100.root / "sys/bus/pci/devices/0000:ab:00.0/vendor").read_text() == "0x10de\n"
    assert len(h100.smi("-L")[1].splitlines()) == 7


def test_every_gpu_missing_means_no_devices(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.driver()
    host.set_faults([{"kind": "gpu-missing", "gpu": 0}])
    assert host.smi("-L") == (6, "No devices were found\n")


# --------------------------------------------------------------------------------- kernel modules


def test_no_module_no_driver(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.install("libnvidia-ml1", "nvidia-smi")
    host.boot()
    rc, out = host.smi("-L")
    assert rc == 9
    assert out.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    rc, _, err = host.kmod("modprobe", "nvidia")
    assert (rc, err) == (1, f"modprobe: FATAL: Module nvidia not found in directory /lib/modules/{KERNEL}\n")
    assert "nouveau" in parse_modules(host.probe_results()["modules.txt"].stdout)


def test_nvml_loads_the_module_through_nvidia_modprobe(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.install("libnvidia-ml1", "nvidia-smi", "nvidia-modprobe", "nvidia-kernel-support")
    assert host.build_modules().returncode == 0
    (host.root / "lib/modules").joinpath(KERNEL, "updates/dkms/nvidia.ko").rename(host.root / "nvidia.ko")
    host.boot()  # modules not installed at boot: nothing loaded
    assert "nvidia" not in parse_modules(host.probe_results()["modules.txt"].stdout)
    (host.root / "nvidia.ko").rename(host.root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko")
    assert host.smi("-L")[0] == 0
    assert "nvidia" in parse_modules(host.probe_results()["modules.txt"].stdout)
    # nvidia-kernel-support blacklists nouveau, so the next boot does not load it.
    host.boot()
    assert "nouveau" not in parse_modules(host.probe_results()["modules.txt"].stdout)


def test_unload_is_refused_while_in_use_with_the_real_messages(h100: SimHost) -> None:
    assert h100.kmod("rmmod", "nvidia") == (1, "", "rmmod: ERROR: Module nvidia is in use by: nvidia_uvm\n")
    assert h100.kmod("modprobe", "-r", "nvidia") == (1, "", "modprobe: FATAL: Module nvidia is in use.\n")
    assert h100.kmod("rmmod", "nvidia_uvm")[0] == 0
    with h100.host.locked() as st:
        st["users"]["nvidia-persistenced"] = __import__("os").getpid()
    assert h100.kmod("rmmod", "nvidia") == (1, "", "rmmod: ERROR: Module nvidia is in use\n")
    modules = (h100.root / "run/gpuprov-lab/proc-modules").read_text()
    assert modules.startswith("nvidia 14299136 1 - Live 0x")
    assert (h100.root / "sys/module/nvidia/refcnt").read_text() == "1\n"
    with h100.host.locked() as st:
        st["users"].clear()
    assert h100.kmod("rmmod", "nvidia")[0] == 0
    assert not (h100.root / "proc/driver/nvidia").exists()
    assert not (h100.root / "sys/module/nvidia").exists()
    assert h100.kmod("rmmod", "nvidia") == (1, "", "rmmod: ERROR: Module nvidia is not currently loaded\n")
    assert h100.kmod("modprobe", "nvidia_drm")[0] == 0
    assert h100.kmod("lsmod")[1].splitlines()[1:] == [
        "nvidia_drm            126976  0",
        "nvidia_modeset       1540096  1 nvidia_drm",
        "nvidia              14299136  1 nvidia_modeset",
    ]
    assert h100.kmod("modprobe", "-r", "nvidia_drm")[0] == 0
    assert "nvidia" not in (h100.root / "run/gpuprov-lab/proc-modules").read_text()
    assert h100.kmod("modprobe", "nvidia_uvm")[0] == 0
    assert h100.kmod("modprobe", "-r", "nvidia_peermem", "nvidia_uvm") == (
        1,
        "",
        "modprobe: FATAL: Module nvidia_peermem is not in kernel.\n",
    )
    assert "nvidia_uvm" in (h100.root / "run/gpuprov-lab/proc-modules").read_text()


def test_version_mismatch_after_a_userspace_upgrade(h100: SimHost) -> None:
    h100.install("libnvidia-ml1", "nvidia-smi", version="580.95.05")
    rc, out = h100.smi("-q", "-x", driver="580.95.05")
    assert rc == 18
    assert out == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n"
    assert "NVRM: API mismatch: the client has the version 580.95.05, but" in h100.dmesg()
    assert ("fail", None) in findings(h100, "driver.userspace_match")


def test_the_proprietary_flavour_loads_as_nvidias_own(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "l40s")
    host.driver(flavour="proprietary")
    version = host.probe_results()["proc-driver-nvidia-version"].stdout
    assert version.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build")
    assert parse_driver_proc(version).open_modules is False
    assert "(POE)" in (host.root / "run/gpuprov-lab/proc-modules").read_text()


def test_a_restart_is_a_reboot(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.driver()
    first = (host.root / "run/gpuprov-lab/boot_id").read_text()
    sim_host.daemons.set_all_persistence(host.host, True)
    host.boot()
    assert (host.root / "run/gpuprov-lab/boot_id").read_text() != first
    assert parse_nvidia_smi_xml(host.smi("-q", "-x")[1]).gpus[0].persistence == "Disabled"
    assert host.dmesg().startswith("[    0.000000] Linux version")


def test_build_fails_like_dkms_under_install_fail_and_without_headers(tmp_path: Path) -> None:
    host = SimHost(tmp_path, "h200")
    host.set_faults([{"kind": "install-fail"}])
    res = host.build_modules()
    assert res.returncode != 0
    assert "error: implicit declaration of function" in res.stderr
    host.set_faults([])
    assert host.build_modules().returncode == 0
    (host.root / f"lib/modules/{KERNEL}/build").unlink()
    res = host.build_modules(headers=False)
    assert res.returncode != 0
    assert f"/lib/modules/{KERNEL}/build: No such file or directory" in res.stderr


def test_tops_query_is_answered_by_nvidia_smi_itself(h100: SimHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpuprov top`'s fields are read by NVIDIA's nvidia-smi over the mock NVML; a query with a field the
    simulation decides (uncorrectable ECC, here under a fault) stays with the front end."""
    from provisioner.top import QUERY_FIELDS

    real: list[list[str]] = []
    run_real = sim_host.smi.run_real

    def spy(host: object, argv: list[str], amend: object = None) -> int:
        real.append(list(argv))
        return run_real(host, argv, amend)  # type: ignore[arg-type]

    monkeypatch.setattr(sim_host.smi, "run_real", spy)
    rc, out = h100.smi(f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits")
    assert rc == 0 and len(out.splitlines()) == 8, out
    assert len(real) == 1
    h100.set_faults([{"kind": "ecc", "gpu": 3}])
    rc, out = h100.smi("--query-gpu=index,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader")
    assert rc == 0 and out.splitlines()[3] != "3, 0", out
    assert len(real) == 1


def test_nvlink_status_answers_from_the_board_in_the_form_the_product_reads(tmp_path: Path) -> None:
    """`nvidia-smi nvlink -s`: an HGX H100's GPUs list 18 links each; a one-GPU H200 host lists its GPU
    and no link (as the real H200 VM does)."""
    from provisioner.probes.smi import parse_nvlink_status

    hgx = sim_host.SimHost(tmp_path / "hgx", "h100-sxm-8", "gpu2")
    hgx.driver()
    rc, out = hgx.smi("nvlink", "-s")
    links = parse_nvlink_status(out)
    assert rc == 0 and sorted(links) == list(range(8))
    assert {g.active for g in links.values()} == {18} and links[0].links[17] == 26.562
    one = sim_host.SimHost(tmp_path / "one", "h200", "gpu1")
    one.driver()
    rc, out = one.smi("nvlink", "-s")
    assert rc == 0 and parse_nvlink_status(out)[0].links == {}
