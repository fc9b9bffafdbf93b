"""`gpuprov certify`: the decision on the real H200 and H100 captures (one element changed per fault) with
DCGM and nvbandwidth output in the shapes their own code writes (tests/fixtures/dcgm, nvbandwidth), the
levels reached, the node's label and annotation, the outputs, and bad input."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from verify_fixtures import (
    h200_probes,
    invoke_verb,
    multi_gpu_pci,
    multi_gpu_xml,
    raw,
    results,
    set_gpu,
    write_snapshot,
)

from provisioner.errors import InputError
from provisioner.health import certify_render, certify_run
from provisioner.health.certify import CertResult, decide
from provisioner.health.certify_run import (
    ANNOTATION,
    LABEL,
    CertRun,
    annotation_text,
    label_nodes,
    mark_certified,
    plan_text,
    probe_names,
    run_certify,
    timeout_for,
)
from provisioner.probes.base import HostFacts
from provisioner.rollout.model import HostProbe, NodeInfo, StepFailed

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H100_SNAPSHOT = FIXTURES / "snapshots" / "h100-device"
XML = "nvidia-smi-q.xml"
MACHINE_ID = "0f" * 16


def fixture(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text()


def nvlink(gpus: int, links: int = 18, inactive: tuple[int, ...] = ()) -> str:
    out = []
    for g in range(gpus):
        out.append(f"GPU {g}: NVIDIA H200 (UUID: GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c00879{g:02x})")
        out += [f"\t Link {i}: {'<inactive>' if i in inactive else '26.562 GB/s'}" for i in range(links)]
    return "\n".join(out) + "\n"


def host(gpus: int = 1, **changes: tuple[int, str, str]) -> dict[str, tuple[int, str, str]]:
    """The real H200 (on `gpus` GPUs of an HGX board's bus ids when more than one), with DCGM level 1
    passing, every NVLink link up and the host's identity; `changes` replace whole probe outputs."""
    probes = h200_probes()
    if gpus > 1:
        probes[XML] = (0, multi_gpu_xml(gpus), "")
        probes["pci-devices.txt"] = (0, multi_gpu_pci(gpus), "")
    probes["nvidia-smi-nvlink.txt"] = (0, nvlink(gpus), "")
    probes["dcgmi-diag.json"] = (0, fixture("dcgm", "r1-dcgm4-pass.json"), "")
    probes["host-identity.txt"] = (0, f"hostname=gpu-01\nmachine-id={MACHINE_ID}\n", "")
    probes.update(changes)
    return probes


def certify(level: str = "quick", gpus: int = 1, **changes: tuple[int, str, str]) -> CertResult:
    return decide(HostFacts("gpu-01", results(host(gpus, **changes))), level)


def part(result: CertResult, pid: str, gpu: int | None = None) -> Any:
    return next(p for p in result.parts if p.id == pid and p.gpu == gpu)


# ------------------------------------------------------------------------------------------ decision


def test_the_real_h200_with_dcgm_level_1_passing_is_certified_quick() -> None:
    r = certify()
    assert (r.certified, r.reached, r.reasons, r.warnings) == (True, "quick", [], [])
    assert r.gpus == [{"index": 0, "name": "NVIDIA H200", "model": "NVIDIA H200 SXM 141GB"}]
    assert {p.status for p in r.parts if p.id.startswith("sku ")} == {"pass"}
    assert part(r, "dcgm software", 0).status == "pass"


def test_without_dcgmi_nothing_is_certified_and_the_result_says_dcgm_did_not_run() -> None:
    r = certify(**{"dcgmi-diag.json": (200, "", "dcgmi not installed")})
    assert (r.certified, r.reached) == (False, "basic")  # quick and above need DCGM
    assert part(r, "dcgm").status == "skip"  # reported as not run, never as a pass
    assert r.reasons == [
        "quick: DCGM's level-1 tests did not run: dcgmi diag -r 1 not run: dcgmi not installed"
    ]


def test_basic_certifies_without_dcgm_and_names_its_level() -> None:
    """For hosts DCGM cannot be installed on (Debian 13): verify's checks and the model's expectations."""
    r = certify("basic", **{"dcgmi-diag.json": (200, "", "dcgmi not installed")})
    assert (r.certified, r.reached, r.reasons) == (True, "basic", [])
    assert not any(p.id.startswith("dcgm") for p in r.parts)  # not asked for, not run, not shown as run
    xml = set_gpu(raw("nvidia-smi-q-x.xml"), "remapped_rows/remapped_row_pending", "Yes")
    r = certify("basic", **{XML: (0, xml, "")})
    assert (r.certified, r.reached) == (False, None)


def test_a_verify_finding_blocks_the_level_with_its_reason() -> None:
    xml = set_gpu(raw("nvidia-smi-q-x.xml"), "remapped_rows/remapped_row_pending", "Yes")
    r = certify(**{XML: (0, xml, "")})
    assert (r.certified, r.reached) == (False, None)
    assert any(reason.startswith("verify gpu.memory_remap [GPU 0]: warn:") for reason in r.reasons)


def test_a_sku_mismatch_blocks_with_expected_seen_and_source() -> None:
    xml = set_gpu(raw("nvidia-smi-q-x.xml"), "fb_memory_usage/total", "71885 MiB")
    r = certify(**{XML: (0, xml, "")})
    assert not r.certified
    (reason,) = [x for x in r.reasons if x.startswith("sku memory")]
    assert "71885 MiB" in reason and "expected 143771 MiB" in reason and "source: real H200 host" in reason
    assert f"reason: {reason}\n" in certify_render.to_table(CertRun([r]))  # whole, with its source


def test_an_unknown_model_is_certified_only_loudly() -> None:
    xml = set_gpu(
        set_gpu(raw("nvidia-smi-q-x.xml"), "pci/pci_device_id", "29FF10DE"), "product_name", "NVIDIA X"
    )
    r = certify(**{XML: (0, xml, "")})
    assert r.gpus[0]["model"] is None
    assert any("is not in the SKU table" in w for w in r.warnings)
    assert part(r, "sku memory", 0).status == "skip"
    run = CertRun([r])
    assert "unknown model" in certify_render.to_table(
        run
    ) and "not in the SKU table" in certify_render.to_table(run)
    assert json.loads(certify_render.to_json(run))["hosts"][0]["warnings"] == r.warnings


def test_standard_on_two_gpus_with_dcgm_level_2_and_nvbandwidth() -> None:
    r = certify(
        "standard",
        gpus=2,
        **{
            "dcgmi-diag-r2.json": (0, fixture("dcgm", "r2-dcgm4-pass.json"), ""),
            "nvbandwidth.json": (0, fixture("nvbandwidth", "two-gpus.json"), ""),
        },
    )
    assert (r.certified, r.reached, r.reasons) == (True, "standard", [])
    assert part(r, "dcgm memory", 1).level == "standard" and part(r, "dcgm software", 1).level == "quick"
    assert "floor 225 GB/s" in part(r, "bandwidth device_to_device_memcpy_read_ce").detail


def test_standard_without_nvbandwidth_is_said_not_passed() -> None:
    r = certify("standard", gpus=2, **{"dcgmi-diag-r2.json": (0, fixture("dcgm", "r2-dcgm4-pass.json"), "")})
    assert r.certified  # the tool is optional: where it is absent the part is not run, with a warning
    assert part(r, "bandwidth").status == "skip"
    assert "interconnect bandwidth not measured: nvbandwidth.json was not collected" in r.warnings


def test_slow_gpu_to_gpu_bandwidth_fails_against_the_nvlink_floor() -> None:
    slow = fixture("nvbandwidth", "two-gpus.json").replace('"389.47"', '"41.02"')
    r = certify(
        "standard",
        gpus=2,
        **{
            "dcgmi-diag-r2.json": (0, fixture("dcgm", "r2-dcgm4-pass.json"), ""),
            "nvbandwidth.json": (0, slow, ""),
        },
    )
    assert (r.certified, r.reached) == (False, "quick")
    assert any("lowest 41.02 GB/s, below the floor of 225 GB/s" in x for x in r.reasons)


def test_gpus_without_peer_access_fail_only_where_nvlink_is_expected() -> None:
    cut = fixture("nvbandwidth", "two-gpus.json").replace('"389.47"', '"N/A"').replace('"389.52"', '"N/A"')
    r2 = {
        "dcgmi-diag-r2.json": (0, fixture("dcgm", "r2-dcgm4-pass.json"), ""),
        "nvbandwidth.json": (0, cut, ""),
    }
    r = certify("standard", gpus=2, **r2)
    assert not r.certified
    assert (
        "not measured: GPU 0←GPU 1, GPU 1←GPU 0"
        in part(r, "bandwidth device_to_device_memcpy_read_ce").detail
    )
    # The same on L40S (no NVLink): said, not failed.
    xml = multi_gpu_xml(2)
    for gpu in (0, 1):  # the H200's XML made an L40S's: its id, memory, PCIe Gen4 and 350 W
        for path, value in (
            ("pci/pci_device_id", "26B910DE"),
            ("product_name", "NVIDIA L40S"),
            ("fb_memory_usage/total", "46068 MiB"),
            ("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen", "4"),
            ("pci/pci_gpu_link_info/pcie_gen/max_link_gen", "4"),
            ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", "4"),
            ("gpu_power_readings/default_power_limit", "350.00 W"),
            ("gpu_power_readings/current_power_limit", "350.00 W"),
        ):
            xml = set_gpu(xml, path, value, gpu)
    r = certify(
        "standard", gpus=2, **{**r2, XML: (0, xml, ""), "nvidia-smi-nvlink.txt": (0, nvlink(2, links=0), "")}
    )
    assert [g["model"] for g in r.gpus] == ["NVIDIA L40S", "NVIDIA L40S"]
    assert part(r, "bandwidth device_to_device_memcpy_read_ce").status == "skip"
    assert any("not measured (no peer access)" in w for w in r.warnings)
    assert r.certified, r.reasons


def test_a_level_2_failure_reaches_quick_only() -> None:
    r = certify("standard", gpus=2, **{"dcgmi-diag-r2.json": (226, fixture("dcgm", "r2-dcgm3.json"), "")})
    assert (r.certified, r.reached) == (False, "quick")
    assert any(x.startswith("dcgm memory [GPU 1]: fail: fail: GPU 1: a memory mismatch") for x in r.reasons)


def test_extended_stops_at_standard_when_a_stress_test_fails() -> None:
    r = certify(
        "extended", gpus=2, **{"dcgmi-diag-r3.json": (226, fixture("dcgm", "r3-dcgm4-fail.json"), "")}
    )
    assert (r.certified, r.reached) == (False, "standard")
    assert any("dcgm targeted_stress [GPU 0]: fail" in x and "exceeded the limit" in x for x in r.reasons)
    assert "DCGM eud: not run" in r.warnings and "DCGM targeted_power on GPU 1: skip" in r.warnings


def test_a_level_whose_tests_all_skipped_is_not_reached() -> None:
    skipped = fixture("dcgm", "r1-dcgm4-pass.json").replace('"Pass"', '"Skip"')
    r = certify(**{"dcgmi-diag.json": (0, skipped, "")})
    assert (r.certified, r.reached) == (False, "basic")
    assert r.reasons == ["quick: DCGM's level-1 tests did not run: none of them passed (skipped or not run)"]


def test_a_gpu_dcgm_did_not_test_keeps_the_level_unreached() -> None:
    r = certify(gpus=2)  # DCGM's level-1 results name GPU 0 only
    assert (r.certified, r.reached) == (False, "basic")
    assert r.reasons == ["quick: DCGM's level-1 tests passed on no result for GPU 1"]


def test_inactive_nvlink_blocks_quick() -> None:
    r = certify(**{"nvidia-smi-nvlink.txt": (0, nvlink(1, inactive=(4,)), "")})
    assert not r.certified and any(x.startswith("sku nvlink [GPU 0]: fail: 17 of 18") for x in r.reasons)


def test_each_level_probes_what_it_needs_and_allows_the_time_it_takes() -> None:
    assert "dcgmi-diag.json" in probe_names("quick") and "nvbandwidth.json" not in probe_names("quick")
    assert {"dcgmi-diag-r2.json", "nvbandwidth.json"} <= set(probe_names("standard"))
    assert "dcgmi-diag-r3.json" in probe_names("extended") and "dcgmi-diag.json" not in probe_names(
        "extended"
    )
    assert timeout_for("extended") > 15 * 60 * 3
    assert "about 2 min" in plan_text("standard", 3, timeout_for("standard"))
    assert "about 15 min" in plan_text("extended", 1, timeout_for("extended"))


# ------------------------------------------------------------------------------------------- cluster


class FakeKube:
    """A cluster of nodes: labels, annotations and what was asked, in order."""

    def __init__(self, nodes: Mapping[str, NodeInfo]) -> None:
        self.nodes = dict(nodes)
        self.labels: dict[str, dict[str, str]] = {n: dict(i.labels) for n, i in nodes.items()}
        self.annotations: dict[str, dict[str, str]] = {n: {} for n in nodes}
        self.calls: list[tuple[str, str]] = []
        self.fail_on: str | None = None

    def node(self, name: str) -> NodeInfo | None:
        return self.nodes.get(name)

    def _apply(
        self, store: dict[str, dict[str, str]], kind: str, name: str, changes: Mapping[str, str | None]
    ) -> None:
        if self.fail_on == kind:
            raise StepFailed(f"kubectl {kind} node {name}: Error from server (Forbidden)")
        self.calls.append((kind, ",".join(sorted(changes))))
        for k, v in changes.items():
            if v is None:
                store[name].pop(k, None)
            else:
                store[name][k] = v

    def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        self._apply(self.labels, "label", name, labels)

    def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        self._apply(self.annotations, "annotate", name, annotations)


def cluster() -> FakeKube:
    return FakeKube({"gpu-01": NodeInfo("gpu-01", False, {LABEL: "extended"}, MACHINE_ID, ("192.0.2.11",))})


def test_a_certified_node_gets_the_label_and_annotation_a_failed_one_loses_both() -> None:
    kube = cluster()
    passed = certify()
    said = mark_certified(kube, "gpu-01", passed, version="9.9.9")
    assert said == f"{LABEL}=quick set on node gpu-01"
    assert kube.labels["gpu-01"][LABEL] == "quick"
    note = json.loads(kube.annotations["gpu-01"][ANNOTATION])
    assert (
        note["by"] == "gpuprov 9.9.9"
        and note["level"] == "quick"
        and note["gpus"] == ["NVIDIA H200 SXM 141GB"]
    )
    assert note["at"].endswith("Z")
    assert kube.calls[-1][0] == "label"  # the label, what schedulers read, comes last
    failed = certify(**{"dcgmi-diag.json": (200, "", "dcgmi not installed")})
    assert mark_certified(kube, "gpu-01", failed) == f"{LABEL} removed from node gpu-01"
    assert LABEL not in kube.labels["gpu-01"] and ANNOTATION not in kube.annotations["gpu-01"]
    assert kube.calls[-2][0] == "label"  # and goes first


def test_nodes_are_labelled_only_when_proven_to_be_the_host() -> None:
    kube = cluster()
    kube.nodes["gpu-02"] = NodeInfo("gpu-02", False, {}, "ab" * 16, ("192.0.2.12",))
    kube.labels["gpu-02"], kube.annotations["gpu-02"] = {LABEL: "quick"}, {}
    mine = certify()
    mine.identity = HostProbe("gpu-01", node="gpu-01", machine_id=MACHINE_ID)
    impostor = certify()
    impostor.identity = HostProbe("evil", node="gpu-02", machine_id="cd" * 16, address="192.0.2.99")
    stranger = certify()
    stranger.identity = HostProbe("lab", node="lab-1")
    assert label_nodes(kube, [mine, impostor, stranger]) == 1
    assert kube.labels["gpu-01"][LABEL] == "quick" and kube.labels["gpu-02"] == {LABEL: "quick"}
    assert impostor.label is not None and impostor.label.startswith(
        "node gpu-02 not labelled: it is not this host"
    )
    assert stranger.label == "not a Kubernetes node (no node lab-1)"


def test_an_unreachable_host_loses_its_label_where_its_address_proves_the_node() -> None:
    kube = cluster()
    gone = CertResult("gpu-01", "quick", None, error="connection refused")
    gone.identity = HostProbe("gpu-01", node="gpu-01", address="192.0.2.11")
    assert label_nodes(kube, [gone]) == 0
    assert LABEL not in kube.labels["gpu-01"]


def test_a_kubectl_failure_is_reported_on_the_host_and_fails_the_run() -> None:
    kube = cluster()
    kube.fail_on = "annotate"
    r = certify()
    r.identity = HostProbe("gpu-01", node="gpu-01", machine_id=MACHINE_ID)
    assert label_nodes(kube, [r]) == 1
    assert r.label is not None and "not changed" in r.label and "Forbidden" in r.label
    assert CertRun([r], label_failures=1).exit_code() == 1


def test_the_annotation_is_ascii_json() -> None:
    r = certify()
    r.gpus[0]["model"] = "GPU \u202e\x1b[2J"
    text = annotation_text(r, "1.0", "2026-12-05T10:23:49Z")
    assert text.isascii() and json.loads(text)["gpus"] == ["GPU \u202e\x1b[2J"]


# ------------------------------------------------------------------------------------------- outputs


def test_junit_one_suite_per_host_one_case_per_check() -> None:
    good, bad = certify(), certify(**{"dcgmi-diag.json": (200, "", "dcgmi not installed")})
    bad.host = "gpu-\x1b]0;x\x07"
    root = ET.fromstring(certify_render.to_junit(CertRun([good, bad])))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["gpu-01", "gpu-\\x1b]0;x\\x07"]
    names = [c.get("name") for c in suites[0].findall("testcase")]
    assert len(names) == len(set(names)) == len(good.parts) + 2 and names[-2:] == [
        "level basic",
        "level quick",
    ]
    level = suites[1].findall("testcase")[-1]
    failure = level.find("failure")
    assert failure is not None and "dcgmi not installed" in (failure.text or "")
    higher = ET.fromstring(certify_render.to_junit(CertRun([certify("extended")])))
    standard = higher.find("testsuite/testcase[@name='level standard']/failure")
    assert standard is not None and standard.text == "not reached: level quick was not"
    assert suites[1].find("testcase[@name='dcgm']/skipped") is not None


def test_the_table_shows_host_text_safely() -> None:
    r = certify(
        **{"dcgmi-diag.json": (0, fixture("dcgm", "r1-dcgm4-pass.json").replace('"Pass"', '"Fail"'), "")}
    )
    r.host = "h\x1b[2J\u202e"
    out = certify_render.to_table(CertRun([r]))
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b" in out and "not certified" in out


# ---------------------------------------------------------------------------------------------- CLI


def invoke(*args: str) -> tuple[int, str, str]:
    return invoke_verb("certify", *args)


def test_snapshot_replay_of_the_real_h100() -> None:
    rc, out, _ = invoke("--snapshot", str(H100_SNAPSHOT), "--format", "json")
    assert rc == 1
    (h,) = json.loads(out)["hosts"]
    assert (h["host"], h["certified"], h["reached"]) == ("vm", False, "basic")
    assert h["gpus"] == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "model": "NVIDIA H100 SXM5 80GB"}]
    sku = {p["id"]: p["status"] for p in h["parts"] if p["id"].startswith("sku ")}
    assert sku == {"sku memory": "pass", "sku pcie": "pass", "sku nvlink": "skip", "sku power": "pass",
                   "sku temperature": "pass"}  # fmt: skip
    assert h["reasons"] == [
        "quick: DCGM's level-1 tests did not run: dcgmi diag -r 1 not run: dcgmi-diag.json: not collected in "
        "this snapshot"
    ]
    assert json.loads(out)["notes"] == ["a snapshot is replayed: no node is labelled"]


def test_a_snapshot_with_every_level_1_probe_is_certified(tmp_path: Path) -> None:
    write_snapshot(tmp_path, "gpu-01", host())
    rc, out, _ = invoke("--snapshot", str(tmp_path), "--format", "table")
    assert rc == 0 and "certified" in out and "not certified" not in out.splitlines()[1]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--level", "thorough"], "--level"),
        (["--format", "yaml"], "--format"),
        (["--limit", "nosuch"], "--limit nosuch"),
        (["--local", "--snapshot", "{snap}"], "choose one of"),
        ([], "say which hosts"),
    ],
)
def test_bad_input_is_exit_2_before_any_host_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], names: str
) -> None:
    write_snapshot(tmp_path, "gpu-01", host())
    touched: list[str] = []
    monkeypatch.setattr(certify_run, "certify_target", lambda t, *a, **k: touched.append(t.name))
    args = [a.replace("{snap}", str(tmp_path)) for a in args]
    if not any(a in args for a in ("--local", "--snapshot")) and args and args[0] != "--limit":
        args = ["--local", *args]
    if args and args[0] == "--limit":
        args = ["--snapshot", str(tmp_path), *args]
    rc, out, err = invoke(*args)
    assert rc == 2 and out == "" and names in err
    assert touched == []


def test_the_library_refuses_an_unknown_level_before_any_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(certify_run, "read_targets", lambda *a: pytest.fail("a host was touched"))
    with pytest.raises(InputError, match="unknown level 'thorough'"):
        run_certify(local=True, level="thorough")


def test_progress_says_the_expected_time_first_then_each_host(tmp_path: Path) -> None:
    write_snapshot(tmp_path, "gpu-01", host())
    said: list[str] = []
    run = run_certify(snapshot=tmp_path, level="standard", progress=said.append, heartbeat_s=0.001)
    assert said[0].startswith("certify: 1 host(s) at level standard") and "about 2 min" in said[0]
    # The snapshot has no level-2 diagnostic: the host reaches basic only, and says so.
    assert [x for x in said if x.startswith("gpu-01:")] == [
        "gpu-01: not certified (reached basic; 1 reason(s)) after 0m00s"
    ]
    assert run.exit_code() == 1


def test_inventory_run_labels_the_nodes_through_the_control_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli_inventory import inventory, write_inventory

    inv = write_inventory(
        tmp_path, inventory("gpu-01: {ansible_host: 192.0.2.11}", "gpu-02: {ansible_host: 192.0.2.12}")
    )
    outcomes = {
        "gpu-01": certify(),
        "gpu-02": certify(**{"dcgmi-diag.json": (200, "", "dcgmi not installed")}),
    }

    def fake_target(target: Any, level: str, timeout: float | None = None) -> CertResult:
        result = outcomes[target.name]
        result.identity = HostProbe(target.name, node=target.name, address=target.address)
        return result

    kube = cluster()
    kube.nodes["gpu-02"] = NodeInfo("gpu-02", False, {LABEL: "quick"}, "", ("192.0.2.12",))
    kube.labels["gpu-02"], kube.annotations["gpu-02"] = {LABEL: "quick"}, {ANNOTATION: "{}"}
    controls: list[str] = []
    monkeypatch.setattr(certify_run, "certify_target", fake_target)
    run = run_certify(inventory=inv, kube_factory=lambda spec: controls.append(spec.name) or kube)
    assert controls == ["cp1"]
    assert kube.labels["gpu-01"][LABEL] == "quick" and LABEL not in kube.labels["gpu-02"]
    assert ANNOTATION in kube.annotations["gpu-01"] and ANNOTATION not in kube.annotations["gpu-02"]
    assert [r.label for r in run.results] == [
        f"{LABEL}=quick set on node gpu-01",
        f"{LABEL} removed from node gpu-02",
    ]
    assert run.exit_code() == 1  # gpu-02 is not certified
    assert run.notes == ["not in group gpu_nodes, so not certified: cp1"]  # the control plane has no GPU
    with pytest.raises(InputError, match="no host of group gpu_nodes selected by --limit cp1"):
        run_certify(
            inventory=inv, limit="cp1", kube_factory=lambda spec: pytest.fail("the cluster was touched")
        )


def test_xids_a_gpu_reset_answered_do_not_block_certification() -> None:
    """After remediate reset GPU 0, the Xid 48 the kernel logged before the reset stays in the boot's
    log: certification counts it as answered (an Xid after the reset, or one a reset does not answer,
    still blocks)."""
    from verify_fixtures import kernel_log, xid_line

    from provisioner.health.decide import forget_answered

    def after_reset(*lines: str) -> HostFacts:
        facts = HostFacts("gpu-01", results(host(**{"kernel-log.txt": (0, kernel_log(*lines), "")})))
        forget_answered(facts, {"0000:00:06": 200.0})
        return facts

    logged = HostFacts(
        "gpu-01", results(host(**{"kernel-log.txt": (0, kernel_log(xid_line(48, t=100.0)), "")}))
    )
    assert not decide(logged, "basic").certified
    assert decide(after_reset(xid_line(48, t=100.0)), "basic").certified
    assert not decide(after_reset(xid_line(48, t=300.0)), "basic").certified
    assert not decide(after_reset(xid_line(79, t=100.0)), "basic").certified
