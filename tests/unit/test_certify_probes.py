"""What `certify` reads beyond verify: the DCGM diagnostic at levels 1 to 3 (DCGM 3 and 4 JSON, as DCGM's
own code writes it: tests/fixtures/dcgm/README.md), nvbandwidth's JSON (tests/fixtures/nvbandwidth),
`nvidia-smi nvlink -s`, the host's identity, and the SKU facts of `nvidia-smi -q -x` on the real H200 and
H100 captures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from verify_fixtures import raw, results, set_gpu

from provisioner.probes.base import HostFacts, ParseError, Unavailable
from provisioner.probes.dcgm import (
    DCGM_DIAG,
    DCGM_DIAG_R2,
    DCGM_DIAG_R3,
    NOT_RUN,
    PROBES,
    diag_results,
    parse_dcgm_diag,
)
from provisioner.probes.nvbandwidth import bandwidth, parse_nvbandwidth
from provisioner.probes.script import build_script, new_token, parse_script_output
from provisioner.probes.smi import parse_nvidia_smi_xml, parse_nvlink_status
from provisioner.probes.system import parse_host_identity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H100_XML = FIXTURES / "snapshots" / "h100-device" / "vm" / "nvidia-smi-q.xml"


def dcgm(name: str) -> str:
    return (FIXTURES / "dcgm" / name).read_text()


# ------------------------------------------------------------------------------------------- DCGM


def test_each_level_runs_its_own_dcgmi_with_a_limit_that_fits_it() -> None:
    by_name = {p.name: p for p in PROBES}
    assert "dcgmi diag -r 1 -j" in by_name[DCGM_DIAG].command
    assert "dcgmi diag -r 2 -j" in by_name[DCGM_DIAG_R2].command
    assert "dcgmi diag -r 3 -j" in by_name[DCGM_DIAG_R3].command
    # Level 3 takes about 15 minutes by DCGM's reference: its limit must leave room for a slow host.
    assert by_name[DCGM_DIAG_R3].timeout_s >= 3 * 15 * 60
    assert by_name[DCGM_DIAG].command.splitlines()[0].startswith("command -v dcgmi")


def test_dcgm4_level2_every_gpu_and_test_with_its_level() -> None:
    found = parse_dcgm_diag(dcgm("r2-dcgm4-pass.json"))
    assert {(r.test, r.gpu, r.status, r.category) for r in found} == {
        ("software", 0, "pass", "Deployment"),
        ("software", 1, "pass", "Deployment"),
        ("memory", 0, "pass", "Hardware"),
        ("memory", 1, "pass", "Hardware"),
        ("pcie", 0, "pass", "Integration"),
        ("pcie", 1, "pass", "Integration"),
    }
    assert {r.test: r.level(2) for r in found} == {"software": 1, "memory": 2, "pcie": 2}
    assert "54.18 GB/s" in next(r.info for r in found if r.test == "pcie" and r.gpu == 0)


def test_dcgm4_level3_failure_names_the_gpu_and_dcgms_reason() -> None:
    found = parse_dcgm_diag(dcgm("r3-dcgm4-fail.json"))
    (failed,) = [r for r in found if r.status == "fail"]
    assert (failed.test, failed.gpu, failed.entity, failed.level(3)) == ("targeted_stress", 0, "GPU 0", 3)
    assert "exceeded the limit of 87 C" in failed.info
    assert {r.gpu for r in found if r.test == "targeted_power" and r.status == "skip"} == {0, 1}
    # A test DCGM lists without results or summary did not run: never a pass.
    assert [(r.test, r.status) for r in found if r.test == "eud"] == [("eud", NOT_RUN)]


def test_dcgm3_gpu_lists_and_upper_case_statuses() -> None:
    found = parse_dcgm_diag(dcgm("r2-dcgm3.json"))
    assert {(r.test, r.gpu, r.status) for r in found if r.test in ("memory", "pcie")} == {
        ("memory", 0, "pass"),
        ("memory", 1, "fail"),
        ("pcie", 0, "pass"),
        ("pcie", 1, "skip"),
    }
    assert sorted(r.gpu for r in found if r.test == "Denylist") == [0, 1]
    assert all(r.level(2) == 1 for r in found if r.category == "Deployment")


def test_a_diagnostic_that_did_not_run_says_why() -> None:
    with pytest.raises(ParseError, match="did not run: Error: Unable to connect to host engine"):
        parse_dcgm_diag(dcgm("runtime-error.json"))
    facts = HostFacts("h", results({DCGM_DIAG_R2: (255, dcgm("runtime-error.json"), "")}))
    with pytest.raises(Unavailable, match="did not run") as exc:
        diag_results(facts, DCGM_DIAG_R2)
    assert exc.value.status == "error"


def test_a_result_about_a_cpu_names_no_gpu() -> None:
    gpu1 = '"entity_group" : "GPU", "entity_group_id" : 1, "entity_id" : 1,'
    cpu1 = '"entity_group" : "CPU", "entity_group_id" : 7, "entity_id" : 1,'
    text = dcgm("r2-dcgm4-pass.json").replace(gpu1, cpu1)
    cpu = [r for r in parse_dcgm_diag(text) if r.entity.startswith("CPU")]
    assert cpu and all(r.gpu is None for r in cpu)


def test_levels_are_cached_apart() -> None:
    facts = HostFacts(
        "h",
        results(
            {DCGM_DIAG: (0, dcgm("r2-dcgm3.json"), ""), DCGM_DIAG_R3: (226, dcgm("r3-dcgm4-fail.json"), "")}
        ),
    )
    assert {r.test for r in diag_results(facts, DCGM_DIAG)} != {
        r.test for r in diag_results(facts, DCGM_DIAG_R3)
    }
    absent = HostFacts("h", results({DCGM_DIAG_R2: (200, "", "dcgmi not installed")}))
    with pytest.raises(Unavailable, match="dcgmi not installed") as exc:
        diag_results(absent, DCGM_DIAG_R2)
    assert exc.value.status == "skip"


# ------------------------------------------------------------------------------------- nvbandwidth


def test_nvbandwidth_two_gpus() -> None:
    run = parse_nvbandwidth((FIXTURES / "nvbandwidth" / "two-gpus.json").read_text())
    cases = {c.name: c for c in run.testcases}
    assert cases["host_to_device_memcpy_ce"].matrix == [[55.21, 55.18]]
    assert cases["device_to_device_memcpy_read_ce"].matrix == [[None, 389.47], [389.52, None]]
    assert all(c.passed for c in run.testcases) and run.error == ""


def test_nvbandwidth_one_gpu_waives_the_peer_test_and_absence_is_a_skip() -> None:
    run = parse_nvbandwidth((FIXTURES / "nvbandwidth" / "one-gpu.json").read_text())
    d2d = next(c for c in run.testcases if c.name == "device_to_device_memcpy_read_ce")
    assert (d2d.status, d2d.passed, d2d.matrix) == ("Waived", False, [])
    with pytest.raises(ParseError, match="not a number"):
        parse_nvbandwidth('{"nvbandwidth": {"testcases": [{"name": "x", "bandwidth_matrix": [["inf"]]}]}}')
    facts = HostFacts("h", results({"nvbandwidth.json": (200, "", "nvbandwidth not installed")}))
    with pytest.raises(Unavailable, match="not installed"):
        bandwidth(facts)


# -------------------------------------------------------------------------------------------- NVLink

# The layout of real `nvidia-smi nvlink -s` output (Azure/azhpc-diagnostics#73; NVIDIA/k8s-test-infra#371).
NVLINK = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-f8bc55a9-598f-6ddc-bde1-ea54bc4b024e)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
\t Link 2: <inactive>
GPU 1: NVIDIA L40S (UUID: GPU-eaf0bc12-3996-9441-6965-b6955608929c)
"""


def test_nvlink_status_counts_active_links_per_gpu() -> None:
    gpus = parse_nvlink_status(NVLINK)
    assert (gpus[0].name, gpus[0].active, len(gpus[0].links)) == ("NVIDIA H100 80GB HBM3", 2, 3)
    assert (gpus[1].active, gpus[1].links) == (0, {})
    with pytest.raises(ParseError, match="unexpected line"):
        parse_nvlink_status("\t Link 0: 26.562 GB/s\n")
    with pytest.raises(ParseError, match="unexpected line"):
        parse_nvlink_status(NVLINK.replace("26.562 GB/s", "fast"))


# --------------------------------------------------------------------------------------- nvidia-smi


def test_the_real_h200_reports_what_a_sku_is_judged_on() -> None:
    (gpu,) = parse_nvidia_smi_xml(raw("nvidia-smi-q-x.xml")).gpus
    assert (gpu.device_id, gpu.memory_total_mib) == ("2335", 143771)
    assert (gpu.link_gen_device_max, gpu.link_gen_max, gpu.link_width_max, gpu.link_gen_host_max) == (
        5,
        5,
        16,
        None,
    )
    assert (gpu.power_limit_w, gpu.power_default_w, gpu.power_max_w) == (700.0, 700.0, 700.0)
    assert (gpu.temp_c, gpu.tlimit_margin_c) == (36, 51)
    assert (gpu.tlimit_shutdown_c, gpu.tlimit_slowdown_c, gpu.tlimit_max_operating_c) == (-8, -2, 0)
    assert gpu.temp_slowdown_c is None  # this driver prints margins, not absolute thresholds


def test_the_real_h100_reports_its_own_values() -> None:
    (gpu,) = parse_nvidia_smi_xml(H100_XML.read_text()).gpus
    assert (gpu.name, gpu.device_id, gpu.memory_total_mib) == ("NVIDIA H100 80GB HBM3", "2330", 81559)
    assert (gpu.power_default_w, gpu.tlimit_margin_c) == (700.0, 42)


def test_a_threshold_that_is_no_temperature_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not a temperature"):
        parse_nvidia_smi_xml(set_gpu(raw("nvidia-smi-q-x.xml"), "temperature/gpu_temp_tlimit", "-8 F"))
    xml = set_gpu(raw("nvidia-smi-q-x.xml"), "gpu_power_readings/max_power_limit", "N/A")
    assert parse_nvidia_smi_xml(xml).gpus[0].power_max_w is None


# ------------------------------------------------------------------------------------------ identity


def test_host_identity() -> None:
    assert parse_host_identity("hostname=GPU-01\nmachine-id=" + "a" * 32 + "\n") == ("gpu-01", "a" * 32)
    assert parse_host_identity("hostname=gpu-01\nmachine-id=not-an-id\n") == ("gpu-01", None)
    with pytest.raises(ParseError):
        parse_host_identity("")


FAKE_DCGMI = """#!/bin/sh
# answers once the host engine "listens": after $1 failed connections (counted in a file)
n=$(cat "$STATE/tries" 2>/dev/null || echo 0)
if [ "$n" -lt "$ENGINE_AFTER" ]; then
    echo $((n + 1)) > "$STATE/tries"
    echo "Error: unable to establish a connection to the specified host: localhost"; exit 255
fi
case "$1" in
    discovery) echo "1 GPU found."; exit 0 ;;
    diag) echo '{"DCGM Diagnostic": {"test_categories": []}}'; exit 0 ;;
esac
exit 2
"""


def _run_diag_probe(tmp_path: Path, engine_after: int, unit_active: bool) -> tuple[str, int]:
    """The real level-1 probe script under /bin/sh, with a fake dcgmi and systemctl on PATH: what it
    printed and how many connections dcgmi refused before it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dcgmi").write_text(FAKE_DCGMI)
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\nexit {0 if unit_active else 3}\n")
    (bin_dir / "sleep").write_text("#!/bin/sh\nexit 0\n")  # the wait's pauses, without the time
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    token = new_token()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STATE": str(tmp_path), "ENGINE_AFTER": str(engine_after)}
    out = subprocess.run(
        ["sh", "-c", build_script([DCGM_DIAG], token)], env=env, capture_output=True, text=True, timeout=60
    )
    res = parse_script_output(out.stdout, token, [DCGM_DIAG], out.stderr)[DCGM_DIAG]
    tries = tmp_path / "tries"
    return res.stdout, int(tries.read_text()) if tries.exists() else 0


def test_the_diagnostic_waits_for_a_host_engine_its_service_just_started(tmp_path: Path) -> None:
    """DCGM's unit starts nv-hostengine in the foreground, so it answers a moment after `systemctl start`
    returns (as right after a GPU reset): the diagnostic runs once the engine answers."""
    out, refused = _run_diag_probe(tmp_path, engine_after=3, unit_active=True)
    assert refused == 3 and out.startswith('{"DCGM Diagnostic"'), out


def test_no_wait_when_no_dcgm_service_runs(tmp_path: Path) -> None:
    """No DCGM unit active: the diagnostic says at once that there is no host engine."""
    out, refused = _run_diag_probe(tmp_path, engine_after=5, unit_active=False)
    assert refused == 2 and "unable to establish a connection" in out, out
