"""Checks over the real H200 capture and fault variants derived from it: exact status, exact GPU."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
import verify_fixtures as vf

from provisioner.checks import CHECK_IDS, HostFacts, evaluate
from provisioner.checks.model import REGISTRY, Finding
from provisioner.errors import InputError
from provisioner.policy import Expectations, policy_from_mapping

SMI = "nvidia-smi-q.xml"


def run(
    probes: Mapping[str, tuple[int | None, str, str]],
    exp: Expectations | None = None,
    ids: list[str] | None = None,
) -> dict[str, list[Finding]]:
    findings = evaluate(HostFacts("h200", vf.results(probes)), exp or Expectations(), ids)
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.id, []).append(f)
    return out


def status(findings: dict[str, list[Finding]], check_id: str) -> str:
    (only,) = findings[check_id]
    return only.status


def with_xml(xml: str) -> dict[str, tuple[int, str, str]]:
    probes = vf.h200_probes()
    probes[SMI] = (0, xml, "")
    return probes


def no_such_file(path: str) -> tuple[int, str, str]:
    """What the probe's `cat` returns for a file that is not there."""
    return (1, "", f"cat: {path}: No such file or directory")


def exp_from(mapping: dict[str, object]) -> Expectations:
    return policy_from_mapping(mapping).expectations_for("h200")


def test_real_h200_baseline() -> None:
    findings = run(vf.h200_probes())
    assert list(findings) == list(CHECK_IDS)
    assert {k: status(findings, k) for k in findings} == vf.HEALTHY_WITHOUT_POLICY
    assert "580.159.04" in findings["driver.version"][0].detail
    assert "open kernel module 580.159.04" in findings["driver.loaded"][0].detail


def test_every_skip_and_error_says_why() -> None:
    for f in evaluate(HostFacts("h200", vf.results(vf.h200_probes())), Expectations()):
        if f.status in ("skip", "error"):
            assert len(f.detail) > 10, f


# ------------------------------------------------------------------------------------ the faults


@pytest.mark.parametrize(
    ("xid", "want", "severity"),
    [
        (79, "fail", "critical"),
        (13, "warn", "medium"),
        (48, "fail", "critical"),
        (31, "warn", "medium"),
        (119, "warn", "medium"),
    ],
)
def test_xid_severity_and_gpu(xid: int, want: str, severity: str) -> None:
    probes = vf.h200_probes()
    probes["kernel-log.txt"] = (0, vf.kernel_log(vf.xid_line(xid, text="something happened")), "")
    (f,) = run(probes)["gpu.xid"]
    assert (f.status, f.gpu, f.bus_id, f.severity) == (want, 0, "0000:00:06.0", severity)
    assert f"Xid {xid}" in f.detail
    assert f.data["xids"] == [xid]


def test_xid_unknown_is_named_by_number_and_ignorable() -> None:
    probes = vf.h200_probes()
    probes["kernel-log.txt"] = (0, vf.kernel_log(vf.xid_line(999), vf.xid_line(13), vf.xid_line(13)), "")
    (f,) = run(probes)["gpu.xid"]
    assert f.status == "warn" and "Xid 999" in f.detail and "Xid 13" in f.detail and "×2" in f.detail
    ignored = run(probes, exp_from({"gpu.xid.ignore": [13, 999]}))["gpu.xid"]
    assert [(x.status, x.gpu) for x in ignored] == [("pass", None)]
    assert "ignored" in ignored[0].detail


def test_xid_unreadable_kernel_log_is_error() -> None:
    probes = vf.h200_probes()
    probes["kernel-log.txt"] = (1, "", "dmesg: read kernel buffer failed: Operation not permitted")
    (f,) = run(probes)["gpu.xid"]
    assert f.status == "error" and "Operation not permitted" in f.detail


def test_ecc_uncorrectable() -> None:
    xml = vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), "ecc_errors/volatile/dram_uncorrectable", "3")
    findings = run(with_xml(xml))
    (f,) = findings["gpu.ecc"]
    assert (f.status, f.gpu, f.bus_id, f.severity) == ("fail", 0, "0000:00:06.0", "critical")
    assert "3 volatile uncorrectable" in f.detail
    assert status(findings, "gpu.memory_remap") == "pass"


def test_ecc_disabled_and_pending_change() -> None:
    xml = vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), "ecc_mode/current_ecc", "Disabled")
    xml = vf.set_gpu(xml, "ecc_mode/pending_ecc", "Disabled")
    (f,) = run(with_xml(xml))["gpu.ecc"]
    assert (f.status, f.gpu) == ("fail", 0)
    assert status(run(with_xml(xml), exp_from({"gpu.ecc": False})), "gpu.ecc") == "pass"
    enabling = vf.set_gpu(xml, "ecc_mode/pending_ecc", "Enabled")  # disabled now, enabled after a reset
    assert [(x.status, x.gpu) for x in run(with_xml(enabling))["gpu.ecc"]] == [("fail", 0), ("warn", 0)]
    pending = vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), "ecc_mode/pending_ecc", "Disabled")
    (p,) = run(with_xml(pending))["gpu.ecc"]
    assert (p.status, p.gpu) == ("warn", 0)


VOLATILE = "ecc_errors/volatile"


def with_volatile(**counters: str) -> str:
    xml = vf.raw("nvidia-smi-q-x.xml")
    for name, value in counters.items():
        xml = vf.set_gpu(xml, f"{VOLATILE}/{name}", value)
    return xml


@pytest.mark.parametrize(
    "counters",
    [
        {"dram_uncorrectable": "N/A"},
        {"sram_uncorrectable_parity": "N/A", "sram_uncorrectable_secded": "N/A", "dram_uncorrectable": "N/A"},
    ],
)
def test_ecc_on_with_uncorrectable_count_na_is_not_judged(counters: dict[str, str]) -> None:
    """ECC is on, yet nvidia-smi has no count: that is not zero errors."""
    (f,) = run(with_xml(with_volatile(**counters)))["gpu.ecc"]
    assert (f.status, f.gpu, f.bus_id) == ("error", 0, "0000:00:06.0")
    assert "N/A" in f.detail


@pytest.mark.parametrize("value", ["-1", "-9223372036854775808", "lots", "1e3", "\u0663"])
def test_an_impossible_uncorrectable_count_is_an_error_for_that_gpu(value: str) -> None:
    xml = vf.multi_gpu_xml(8)
    xml = vf.set_gpu(xml, f"{VOLATILE}/dram_uncorrectable", value, gpu=3)
    probes = vf.h200_probes()
    probes["pci-devices.txt"] = (0, vf.multi_gpu_pci(8), "")
    probes[SMI] = (0, xml, "")
    (f,) = run(probes)["gpu.ecc"]
    assert (f.status, f.gpu) == ("error", 3)
    assert "dram_uncorrectable" in f.detail


def test_an_na_count_next_to_real_errors_still_fails() -> None:
    xml = with_volatile(sram_uncorrectable_parity="N/A", dram_uncorrectable="2")
    assert [(f.status, f.gpu) for f in run(with_xml(xml))["gpu.ecc"]] == [("fail", 0), ("error", 0)]


def test_ecc_off_as_wanted_with_na_counters_passes() -> None:
    """With ECC off nvidia-smi prints N/A counters, as it should: the mode is what is judged."""
    xml = with_volatile(
        sram_uncorrectable_parity="N/A", sram_uncorrectable_secded="N/A", dram_uncorrectable="N/A"
    )
    xml = vf.set_gpu(xml, "ecc_mode/current_ecc", "Disabled")
    xml = vf.set_gpu(xml, "ecc_mode/pending_ecc", "Disabled")
    (f,) = run(with_xml(xml), exp_from({"gpu.ecc": False}))["gpu.ecc"]
    assert f.status == "pass" and "ECC mode as expected" in f.detail
    # A negative count is wrong whatever the mode.
    bad = vf.set_gpu(xml, f"{VOLATILE}/dram_uncorrectable", "-4")
    assert status(run(with_xml(bad), exp_from({"gpu.ecc": False})), "gpu.ecc") == "error"


@pytest.mark.parametrize(
    ("element", "want"),
    [("remapped_rows/remapped_row_pending", "warn"), ("remapped_rows/remapped_row_failure", "fail")],
)
def test_row_remap_pending_and_failure(element: str, want: str) -> None:
    xml = vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), element, "Yes")
    (f,) = run(with_xml(xml))["gpu.memory_remap"]
    assert (f.status, f.gpu, f.bus_id) == (want, 0, "0000:00:06.0")


def test_retired_pages_pending_on_older_gpus() -> None:
    xml = vf.raw("nvidia-smi-q-x.xml")
    root = vf.xml_root(xml)
    gpu = root.find("gpu")
    assert gpu is not None
    remapped = gpu.find("remapped_rows")
    assert remapped is not None
    gpu.remove(remapped)  # pre-Ampere GPUs have no row remapper
    xml = vf.set_gpu(vf.xml_text(root), "retired_pages/pending_retirement", "Yes")
    (f,) = run(with_xml(xml))["gpu.memory_remap"]
    assert (f.status, f.gpu) == ("warn", 0) and "retirement" in f.detail


@pytest.mark.parametrize(
    ("element", "value"),
    [
        ("pci/pci_gpu_link_info/link_widths/current_link_width", "8x"),
        ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", "3"),
    ],
)
def test_degraded_pcie_link(element: str, value: str) -> None:
    xml = vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), element, value)
    (f,) = run(with_xml(xml))["gpu.pcie_link"]
    assert (f.status, f.gpu, f.bus_id) == ("warn", 0, "0000:00:06.0")
    assert "degraded" in f.detail


def test_pcie_gen_downshift_while_idle_is_not_degradation() -> None:
    xml = vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), "pci/pci_gpu_link_info/pcie_gen/current_link_gen", "1")
    xml = vf.set_gpu(xml, "performance_state", "P8")
    (f,) = run(with_xml(xml))["gpu.pcie_link"]
    assert f.status == "pass" and "idle" in f.detail
    narrow = vf.set_gpu(xml, "pci/pci_gpu_link_info/link_widths/current_link_width", "4x")
    assert status(run(with_xml(narrow)), "gpu.pcie_link") == "warn"


def test_gpu_missing_from_the_driver_single_gpu() -> None:
    probes = vf.h200_probes()
    probes[SMI] = (6, "No devices were found\n", "")
    findings = run(probes)
    (f,) = findings["gpu.count"]
    assert (f.status, f.gpu, f.bus_id) == ("fail", 0, "0000:00:06.0")
    assert status(findings, "driver.loaded") == "pass"
    assert "sees no GPU" in findings["driver.loaded"][0].detail
    for check_id in ("gpu.persistence", "gpu.ecc", "gpu.memory_remap", "gpu.pcie_link", "gpu.throttle"):
        assert status(findings, check_id) == "skip", check_id


def test_gpu_missing_from_the_driver_on_an_8_gpu_host() -> None:
    probes = vf.h200_probes()
    probes["pci-devices.txt"] = (0, vf.multi_gpu_pci(8), "")
    probes[SMI] = (0, vf.multi_gpu_xml(8, drop=(5,)), "")
    findings = run(probes)
    (f,) = findings["gpu.count"]
    assert (f.status, f.gpu, f.bus_id) == ("fail", 5, "0000:ab:00.0")
    assert "7 of 8" in f.detail
    assert status(findings, "gpu.persistence") == "pass"


def test_multi_gpu_findings_name_the_gpu() -> None:
    xml = vf.multi_gpu_xml(8)
    xml = vf.set_gpu(xml, "ecc_errors/volatile/sram_uncorrectable_secded", "1", gpu=6)
    xml = vf.set_gpu(xml, "pci/pci_gpu_link_info/link_widths/current_link_width", "8x", gpu=2)
    xml = vf.set_gpu(xml, "persistence_mode", "Disabled", gpu=7)
    probes = vf.h200_probes()
    probes["pci-devices.txt"] = (0, vf.multi_gpu_pci(8), "")
    probes[SMI] = (0, xml, "")
    probes["kernel-log.txt"] = (
        0,
        vf.kernel_log(
            vf.xid_line(79, pci="0000:5d:00", text="GPU has fallen off the bus."),
            vf.xid_line(13, pci="0000:18:00"),
        ),
        "",
    )
    findings = run(probes)
    assert [(f.status, f.gpu) for f in findings["gpu.ecc"]] == [("fail", 6)]
    assert [(f.status, f.gpu, f.bus_id) for f in findings["gpu.pcie_link"]] == [("warn", 2, "0000:3a:00.0")]
    assert [(f.status, f.gpu) for f in findings["gpu.persistence"]] == [("fail", 7)]
    assert [(f.status, f.gpu, f.bus_id) for f in findings["gpu.xid"]] == [
        ("warn", 0, "0000:18:00.0"),
        ("fail", 3, "0000:5d:00.0"),
    ]
    assert status(findings, "gpu.count") == "pass"
    assert "8 GPU(s)" in findings["gpu.count"][0].detail


def test_persistence_off() -> None:
    xml = vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), "persistence_mode", "Disabled")
    (f,) = run(with_xml(xml))["gpu.persistence"]
    assert (f.status, f.gpu) == ("fail", 0)
    assert status(run(with_xml(xml), exp_from({"gpu.persistence": False})), "gpu.persistence") == "pass"


@pytest.mark.parametrize(
    "reason", ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"]
)
def test_hardware_slowdown(reason: str) -> None:
    xml = vf.set_gpu(
        vf.raw("nvidia-smi-q-x.xml"), f"clocks_event_reasons/clocks_event_reason_{reason}", "Active"
    )
    (f,) = run(with_xml(xml))["gpu.throttle"]
    assert (f.status, f.gpu) == ("warn", 0)


def test_power_cap_and_idle_are_not_throttling() -> None:
    xml = vf.set_gpu(
        vf.raw("nvidia-smi-q-x.xml"), "clocks_event_reasons/clocks_event_reason_sw_power_cap", "Active"
    )
    assert status(run(with_xml(xml)), "gpu.throttle") == "pass"


def test_no_driver_installed() -> None:
    probes = vf.h200_probes()
    probes[SMI] = (127, "", "timeout: failed to run command 'nvidia-smi': No such file or directory")
    probes["nvidia-smi-version.txt"] = (127, "", "timeout: failed to run command 'nvidia-smi'")
    probes["proc-driver-nvidia-version"] = no_such_file("/proc/driver/nvidia/version")
    probes["sys-module-nvidia-version"] = no_such_file("/sys/module/nvidia/version")
    findings = run(probes)
    (f,) = findings["driver.loaded"]
    assert f.status == "fail" and "not loaded" in f.detail and "nvidia-smi not found" in f.detail
    assert status(findings, "gpu.present") == "pass"
    # Every other check that reads nvidia-smi's report skips (driver.loaded says why); gpu.xid has the
    # kernel log to read.
    for check_id in [c for c in CHECK_IDS if SMI in REGISTRY[c].probes]:
        if check_id not in ("driver.loaded", "gpu.xid"):
            assert status(findings, check_id) == "skip", check_id
    # With a policy, still no pass: the version cannot be read.
    assert status(run(probes, exp_from({"driver.version": "580"})), "driver.version") == "skip"


def test_driver_installed_but_module_not_loaded() -> None:
    probes = vf.h200_probes()
    msg = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
        "latest NVIDIA driver is installed and running."
    )
    probes[SMI] = (9, msg + "\n", "")
    probes["proc-driver-nvidia-version"] = no_such_file("/proc/driver/nvidia/version")
    probes["modules.txt"] = (0, "nouveau 2887680 0 - Live 0x0000000000000000\n", "")
    (f,) = run(probes)["driver.loaded"]
    assert f.status == "fail" and "couldn't communicate" in f.detail and "nouveau is loaded" in f.detail


def test_driver_library_mismatch() -> None:
    probes = vf.h200_probes()
    probes[SMI] = (
        18,
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n",
        "",
    )
    probes["nvidia-smi-version.txt"] = (
        0,
        "NVIDIA-SMI version  : 580.95.05\nNVML version        : 580.95\nDRIVER version      : N/A\n",
        "",
    )
    findings = run(probes)
    (f,) = findings["driver.userspace_match"]
    assert f.status == "fail" and "580.95" in f.detail and "580.159.04" in f.detail
    assert status(findings, "driver.loaded") == "fail"


def test_userspace_newer_than_module_without_nvml_error() -> None:
    probes = vf.h200_probes()
    probes["nvidia-smi-version.txt"] = (
        0,
        "NVIDIA-SMI version  : 580.95.05\nNVML version        : 580.95\n",
        "",
    )
    assert status(run(probes), "driver.userspace_match") == "fail"


def test_truncated_xml_is_error_never_pass() -> None:
    xml = vf.raw("nvidia-smi-q-x.xml")
    findings = run(with_xml(xml[: len(xml) // 2]))
    for check_id in (
        "gpu.count",
        "gpu.persistence",
        "gpu.ecc",
        "gpu.memory_remap",
        "gpu.pcie_link",
        "gpu.throttle",
    ):
        (f,) = findings[check_id]
        assert f.status == "error", check_id
        assert "not well-formed XML" in f.detail
    assert status(findings, "driver.loaded") == "pass"  # nvidia-smi ran; its output is what is broken


def test_nvidia_smi_timeout_fails_driver_loaded() -> None:
    probes = vf.h200_probes()
    probes[SMI] = (124, vf.raw("nvidia-smi-q-x.xml")[:3000], "")
    findings = run(probes)
    assert status(findings, "driver.loaded") == "fail"
    assert "timed out" in findings["driver.loaded"][0].detail
    assert status(findings, "gpu.ecc") == "skip"


def test_not_collected_is_skip_cut_short_is_error() -> None:
    probes: dict[str, tuple[int | None, str, str]] = dict(vf.h200_probes())
    del probes["kernel-log.txt"]
    (f,) = run(probes)["gpu.xid"]
    assert f.status == "skip" and "not collected" in f.detail
    results = vf.results(vf.h200_probes())
    from provisioner.probes.base import ProbeResult

    results[SMI] = ProbeResult(SMI, None, note="output cut short while this probe ran")
    findings = evaluate(HostFacts("h200", results), Expectations())
    assert {f.status for f in findings if f.id == "gpu.ecc"} == {"error"}


@pytest.mark.parametrize("garbage", ["", "\x00\x01\x02", "<<<>>>", "{" * 50, "a\tb\n" * 3, "é" * 100])
def test_garbled_output_everywhere_never_crashes(garbage: str) -> None:
    probes = {name: (0, garbage, "") for name in vf.h200_probes()}
    findings = run(probes)
    assert list(findings) == list(CHECK_IDS)
    for check_id in ("gpu.persistence", "gpu.ecc", "driver.version", "gpu.xid", "os.supported"):
        assert all(f.status != "pass" for f in findings[check_id]), (check_id, findings[check_id])


# ----------------------------------------------------------------------------------- with a policy


def test_driver_version_branch_and_exact() -> None:
    probes = vf.h200_probes()
    assert status(run(probes, exp_from({"driver.version": "580"})), "driver.version") == "pass"
    assert status(run(probes, exp_from({"driver.version": "580.159.04"})), "driver.version") == "pass"
    (f,) = run(probes, exp_from({"driver.version": "570"}))["driver.version"]
    assert f.status == "fail" and "expected branch 570" in f.detail
    assert status(run(probes, exp_from({"driver.version": "580.95.05"})), "driver.version") == "fail"
    assert status(run(probes, exp_from({"driver.version": "580.15"})), "driver.version") == "fail"


def test_cuda_version_expected() -> None:
    probes = vf.h200_probes()
    assert status(run(probes, exp_from({"cuda.version": "13.0"})), "cuda.version") == "pass"
    assert status(run(probes, exp_from({"cuda.version": "12.8"})), "cuda.version") == "fail"
    probes["nvcc-version.txt"] = (127, "", "timeout: failed to run command '/usr/local/cuda/bin/nvcc'")
    (f,) = run(probes, exp_from({"cuda.version": "13.0"}))["cuda.version"]
    assert f.status == "fail" and "no CUDA toolkit" in f.detail
    # cuda-toolkit packages without nvcc: broken install, even without a policy.
    probes["packages.tsv"] = (0, probes["packages.tsv"][1] + "cuda-toolkit-13-0\t13.0.2-1\tii \n", "")
    assert status(run(probes), "cuda.version") == "fail"


def test_gpu_count_against_policy() -> None:
    assert status(run(vf.h200_probes(), exp_from({"gpu.count": 1})), "gpu.count") == "pass"
    (f,) = run(vf.h200_probes(), exp_from({"gpu.count": 8}))["gpu.count"]
    assert f.status == "fail" and "8 expected" in f.detail


def test_packages_held_against_the_real_holds() -> None:
    ok = exp_from({"packages.held": ["libnccl2", "libcudnn9-cuda-13", "libcublas-*"]})
    assert status(run(vf.h200_probes(), ok), "packages.held") == "pass"
    findings = run(
        vf.h200_probes(), exp_from({"packages.held": ["libnccl2", "cuda-nvcc-13-0", "nvidia-driver-580"]})
    )
    assert sorted((f.status, f.detail.split(":")[0]) for f in findings["packages.held"]) == [
        ("fail", "not held"),
        ("warn", "expected held but not installed"),
    ]
    assert "cuda-nvcc-13-0" in findings["packages.held"][0].detail


def test_services_without_systemd_are_judged_by_process() -> None:
    probes = vf.h200_probes()
    probes["service-processes.tsv"] = (
        0,
        "nvidia-persistenced\trunning\nnvidia-fabricmanager\tnot-running\n"
        "docker\tnot-running\ncontainerd\tnot-running\nkubelet\tnot-running\n",
        "",
    )
    (f,) = run(probes, exp_from({"services.active": ["nvidia-persistenced"]}))["services.active"]
    assert f.status == "pass" and "running processes" in f.detail
    (g,) = run(probes, exp_from({"services.active": ["nvidia-persistenced", "docker"]}))["services.active"]
    assert g.status == "fail" and "docker" in g.detail and "persistenced" not in g.detail.split("(")[0]
    del probes["service-processes.tsv"]
    assert status(run(probes, exp_from({"services.active": ["docker"]})), "services.active") == "error"


def test_services_with_systemd_and_derived_expectations() -> None:
    probes = vf.h200_probes()
    probes["services.tsv"] = (
        0,
        "nvidia-persistenced\tactive\nnvidia-fabricmanager\tinactive\ndocker\tactive\n"
        "containerd\tactive\nkubelet\tinactive\n",
        "",
    )
    probes["packages.tsv"] = (
        0,
        probes["packages.tsv"][1] + "docker.io\t26.1.3-0ubuntu1\tii \n"
        "nvidia-fabricmanager-580\t580.159.04-1\tii \n",
        "",
    )
    (f,) = run(probes)["services.active"]
    assert f.status == "fail" and f.data["inactive"] == ["nvidia-fabricmanager"]


def test_nvswitch_host_expects_fabric_manager() -> None:
    probes = vf.h200_probes()
    probes["pci-devices.txt"] = (
        0,
        vf.multi_gpu_pci(8) + vf.pci_line("0000:05:00.0", "22a3", "0680") + "\n",
        "",
    )
    probes[SMI] = (0, vf.multi_gpu_xml(8), "")
    probes["services.tsv"] = (
        0,
        "nvidia-persistenced\tactive\nnvidia-fabricmanager\tfailed\ndocker\tinactive\n"
        "containerd\tinactive\nkubelet\tinactive\n",
        "",
    )
    (f,) = run(probes)["services.active"]
    assert f.status == "fail" and "nvidia-fabricmanager" in f.detail and "NVSwitch" in f.detail


DAEMON_OK = json.dumps(
    {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}, "log-driver": "json-file"}
)
CONTAINERD_V2_NVIDIA = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def _ctk_host(daemon: str | None, containerd_dump: str | None) -> dict:
    probes = vf.h200_probes()
    extra = (
        "nvidia-container-toolkit\t1.18.0-1\tii \ndocker.io\t26.1.3-0ubuntu1\tii \n"
        "containerd\t1.7.28-0ubuntu1\tii \nkubelet\t1.34.1-1.1\tii \n"
    )
    probes["packages.tsv"] = (0, probes["packages.tsv"][1] + extra, "")
    if daemon is not None:
        probes["docker-daemon.json"] = (0, daemon, "")
    if containerd_dump is not None:
        probes["containerd-config-dump.toml"] = (0, containerd_dump, "")
    return probes


def test_container_toolkit_runtime_configured() -> None:
    assert status(run(_ctk_host(DAEMON_OK, CONTAINERD_V2_NVIDIA)), "container_toolkit.runtime") == "pass"
    v3 = CONTAINERD_V2_NVIDIA.replace("version = 2", "version = 3").replace(
        "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"
    )
    assert status(run(_ctk_host(DAEMON_OK, v3)), "container_toolkit.runtime") == "pass"


def test_container_toolkit_runtime_missing() -> None:
    (f,) = run(_ctk_host('{"log-driver": "json-file"}', CONTAINERD_V2_NVIDIA))["container_toolkit.runtime"]
    assert f.status == "fail" and f.detail.startswith("docker:")
    (g,) = run(_ctk_host(None, CONTAINERD_V2_NVIDIA))["container_toolkit.runtime"]
    assert g.status == "fail" and "file absent" in g.detail
    (h,) = run(_ctk_host("{not json", CONTAINERD_V2_NVIDIA))["container_toolkit.runtime"]
    assert h.status == "error" and "not valid JSON" in h.detail


def test_containerd_runtime_is_read_from_what_containerd_uses() -> None:
    """The check reads `containerd config dump` (imports merged as containerd merges them), so a runtime
    in a file config.toml does not import, or one an import masks, does not count."""
    masked = (
        'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n[plugins."io.containerd.grpc.v1.cri"]\n'
    )
    (f,) = run(_ctk_host(DAEMON_OK, masked))["container_toolkit.runtime"]
    assert (
        f.status == "fail" and "no nvidia runtime" in f.detail and "/etc/containerd/conf.d/*.toml" in f.detail
    )
    other = CONTAINERD_V2_NVIDIA.replace("/usr/bin/nvidia-container-runtime", "/usr/bin/runc")
    (g,) = run(_ctk_host(DAEMON_OK, other))["container_toolkit.runtime"]
    assert g.status == "fail" and "BinaryName is '/usr/bin/runc'" in g.detail
    (h,) = run(
        _ctk_host(DAEMON_OK, CONTAINERD_V2_NVIDIA.replace("version = 2\n", "version = 2\n[plugins\n"))
    )["container_toolkit.runtime"]
    assert h.status == "error" and "not valid TOML" in h.detail


NODE = {
    "kind": "Node",
    "metadata": {"name": "h200"},
    "spec": {},
    "status": {
        "conditions": [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
        ],
        "allocatable": {"cpu": "16", "nvidia.com/gpu": "1"},
    },
}


def _node(**changes: object) -> str:
    node = json.loads(json.dumps(NODE))
    node["status"].update(changes)
    return json.dumps(node)


def test_k8s_node_ready_and_allocatable() -> None:
    probes = vf.h200_probes()
    probes["kube-node.json"] = (0, _node(), "")
    findings = run(probes)
    assert (status(findings, "k8s.node_ready"), status(findings, "k8s.gpu_allocatable")) == ("pass", "pass")
    probes["kube-node.json"] = (
        0,
        _node(
            conditions=[
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "KubeletNotReady",
                    "message": "container runtime network not ready",
                }
            ],
            allocatable={"cpu": "16"},
        ),
        "",
    )
    findings = run(probes)
    assert status(findings, "k8s.node_ready") == "fail"
    assert "network not ready" in findings["k8s.node_ready"][0].detail
    assert status(findings, "k8s.gpu_allocatable") == "fail"
    probes["kube-node.json"] = (0, _node(allocatable={"nvidia.com/gpu": "2"}), "")
    assert status(run(probes), "k8s.gpu_allocatable") == "fail"


def test_k8s_errors_and_expectation() -> None:
    probes = vf.h200_probes()
    probes["kube-node.json"] = (1, "", 'Error from server (NotFound): nodes "h200" not found')
    assert status(run(probes), "k8s.node_ready") == "fail"
    probes["kube-node.json"] = (1, "", "The connection to the server 10.0.0.1:6443 was refused")
    assert status(run(probes), "k8s.node_ready") == "error"
    probes = vf.h200_probes()
    assert status(run(probes, exp_from({"k8s.node": True})), "k8s.node_ready") == "fail"
    probes["kube-node.json"] = (0, '{"kind": "Node", "status": ["garbled"]}', "")
    (f,) = run(probes)["k8s.node_ready"]
    assert f.status == "error" and "internal error" in f.detail


def test_dcgm_diag() -> None:
    probes = vf.h200_probes()
    good = (
        '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": ['
        '{"name": "Denylist", "results": [{"status": "Pass"}]}]}]}}'
    )
    probes["dcgmi-diag.json"] = (0, good, "")
    assert status(run(probes), "dcgm.diag") == "pass"
    probes["dcgmi-diag.json"] = (226, good.replace('"Pass"}', '"Fail", "gpu_id": "0", "info": "DBE"}'), "")
    (f,) = run(probes)["dcgm.diag"]
    assert (f.status, f.gpu) == ("fail", 0)
    probes["dcgmi-diag.json"] = (
        255,
        "Error: unable to establish a connection to the specified host: localhost",
        "",
    )
    assert status(run(probes), "dcgm.diag") == "error"
    assert status(run(probes, exp_from({"dcgm.diag": False})), "dcgm.diag") == "skip"


def test_container_smoke() -> None:
    probes = vf.h200_probes()
    exp = exp_from({"container.smoke_image": "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"})
    probes["container-smoke.txt"] = (
        0,
        vf.raw("nvidia-smi-L.txt")
        if (vf.CAPTURE / "nvidia-smi-L.txt").exists()
        else "GPU 0: NVIDIA H200 (UUID: GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c008796e)\n",
        "",
    )
    assert status(run(probes, exp), "container.smoke") == "pass"
    probes["container-smoke.txt"] = (
        125,
        "",
        "docker: Error response from daemon: could not select device driver",
    )
    assert status(run(probes, exp), "container.smoke") == "fail"
    probes["container-smoke.txt"] = (
        200,
        "",
        "image nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04 is not present",
    )
    assert status(run(probes, exp), "container.smoke") == "skip"


def test_host_without_gpu_where_none_expected() -> None:
    probes = vf.h200_probes()
    probes["pci-devices.txt"] = (
        0,
        "0000:00:00.0 Host bridge [0600]: Intel Corporation Device [8086:1237]\n",
        "",
    )
    probes[SMI] = (127, "", "nvidia-smi: not found")
    none_expected = exp_from({"gpu.present": False, "gpu.count": 0})
    findings = run(probes, none_expected)
    assert status(findings, "gpu.present") == "skip"
    assert status(findings, "gpu.count") == "pass"
    assert status(findings, "driver.loaded") == "skip"
    findings = run(probes)  # a GPU is expected by default
    assert status(findings, "gpu.present") == "fail"


def test_os_supported() -> None:
    probes = vf.h200_probes()
    probes["os-release"] = (0, 'ID=rocky\nVERSION_ID="9.4"\nPRETTY_NAME="Rocky Linux 9.4"\n', "")
    assert status(run(probes), "os.supported") == "fail"
    assert status(run(probes, exp_from({"os.supported": ["rocky 9"]})), "os.supported") == "pass"


def test_subset_and_policy_skip() -> None:
    findings = run(vf.h200_probes(), ids=["gpu.ecc", "gpu.xid"])
    assert list(findings) == ["gpu.ecc", "gpu.xid"]
    findings = run(vf.h200_probes(), exp_from({"checks.skip": ["gpu.xid"]}))
    assert status(findings, "gpu.xid") == "skip" and "skipped by policy" in findings["gpu.xid"][0].detail


def _labelled(labels: dict[str, str], **status: object) -> str:
    node = json.loads(_node(**status))
    node["metadata"]["labels"] = labels
    return json.dumps(node)


SHARED = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}


def test_time_slicing_declared_means_replicas_per_gpu_and_the_labels() -> None:
    probes = vf.h200_probes()
    exp = exp_from({"gpu.sharing.strategy": "time-slicing", "gpu.sharing.replicas": 4})
    probes["kube-node.json"] = (0, _labelled(SHARED, allocatable={"nvidia.com/gpu": "4"}), "")
    findings = run(probes, exp)
    assert status(findings, "gpu.sharing") == "pass"
    (alloc,) = findings["k8s.gpu_allocatable"]
    assert alloc.status == "pass" and "1 GPU(s) × 4 replicas" in alloc.detail
    # The device plugin still advertises whole GPUs: the config was not applied.
    probes["kube-node.json"] = (0, _labelled({}, allocatable={"nvidia.com/gpu": "1"}), "")
    findings = run(probes, exp)
    assert (
        status(findings, "k8s.gpu_allocatable") == "fail"
        and "expected 4" in findings["k8s.gpu_allocatable"][0].detail
    )
    assert "gpu-feature-discovery not running" in findings["gpu.sharing"][0].detail
    labels = {**SHARED, "nvidia.com/gpu.replicas": "2"}
    probes["kube-node.json"] = (0, _labelled(labels, allocatable={"nvidia.com/gpu": "4"}), "")
    (f,) = run(probes, exp)["gpu.sharing"]
    assert f.status == "fail" and "nvidia.com/gpu.replicas=2, expected 4" in f.detail
    # Nothing declared: the checks say so, the allocatable check wants whole GPUs.
    assert status(run(probes), "gpu.sharing") == "skip"


@pytest.mark.parametrize(
    ("labels", "want", "words"),
    [
        ({"nvidia.com/mig.config": "all-1g.18gb", "nvidia.com/mig.config.state": "success"}, "fail",
         "MIG mode is off on GPU 0"),  # the MIG manager says success but the real H200 has MIG off
        ({"nvidia.com/mig.config": "all-1g.18gb", "nvidia.com/mig.config.state": "pending"}, "warn",
         "mig.config.state=pending"),
        ({"nvidia.com/mig.config": "all-1g.18gb", "nvidia.com/mig.config.state": "failed"}, "fail",
         "mig.config.state=failed"),
        ({"nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success"}, "fail",
         "nvidia.com/mig.config=all-disabled, expected all-1g.18gb"),
    ],
)  # fmt: skip
def test_mig_config_follows_the_mig_managers_labels_and_the_gpus_mode(
    labels: dict[str, str], want: str, words: str
) -> None:
    probes = vf.h200_probes()
    probes["kube-node.json"] = (0, _labelled(labels), "")
    (f,) = run(probes, exp_from({"mig.config": "all-1g.18gb"}))["mig.config"]
    assert f.status == want and words in f.detail, f


def test_mig_disabled_as_declared_passes_on_the_real_h200() -> None:
    probes = vf.h200_probes()
    labels = {"nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success"}
    probes["kube-node.json"] = (0, _labelled(labels), "")
    (f,) = run(probes, exp_from({"mig.config": "all-disabled"}))["mig.config"]
    assert f.status == "pass"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gpu.sharing.strategy", "timeslicing", "expected none, time-slicing or mps"),
        ("gpu.sharing.replicas", 1, "expected a whole number of replicas per GPU"),
        ("mig.config", "all 1g", "expected a MIG configuration name"),
    ],
)
def test_sharing_and_mig_policy_values_are_checked(key: str, value: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        exp_from({key: value})
