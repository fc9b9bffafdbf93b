"""`gpuprov remediate --dry-run`: evidence from the real H200 capture (one XML element or one kernel-log
line changed per fault), the decision rules, the JSON shape, exit codes and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verify_fixtures import (
    h200_probes,
    invoke_verb,
    kernel_log,
    multi_gpu_pci,
    multi_gpu_xml,
    raw,
    results,
    set_gpu,
    write_snapshot,
    xid_line,
)

from provisioner.health.decide import (
    NONE,
    REBOOT,
    RESET_GPU,
    SERVICE,
    HostFacts,
    gather,
    plan_host,
    table_from,
    xid_table,
)
from provisioner.health.remediate import exit_code, to_json, to_table
from provisioner.probes.smi import parse_nvidia_smi_xml

XML = "nvidia-smi-q.xml"
KLOG = "kernel-log.txt"


def facts(**changes: tuple[int, str, str]) -> HostFacts:
    probes = h200_probes()
    probes.update(changes)
    return HostFacts("h200", results(probes))


def with_xml(xml: str) -> HostFacts:
    return facts(**{XML: (0, xml, "")})


def with_xids(*lines: str) -> HostFacts:
    return facts(**{KLOG: (0, kernel_log(*lines), "")})


# ------------------------------------------------------------------------------------------ evidence


def test_the_real_h200_capture_reports_recovery_action_none() -> None:
    gpu = parse_nvidia_smi_xml(raw("nvidia-smi-q-x.xml")).gpus[0]
    assert gpu.recovery_action == "None"
    ev = gather(facts())
    assert ev.error is None
    assert [(g.index, g.pci, g.recovery_action, g.remap_pending, g.remap_failure) for g in ev.gpus] == [
        (0, "0000:00:06.0", "None", False, False)
    ]


def test_xids_are_attributed_to_their_gpu_by_pci_address() -> None:
    ev = gather(with_xids(xid_line(13), xid_line(79), xid_line(48, pci="0000:99:00")))
    assert [e.xid for e in ev.gpus[0].xids] == [13, 79]
    assert [e.xid for e in ev.unattributed_xids] == [48]


def test_an_absurd_recovery_action_is_an_error_not_a_decision() -> None:
    ev = gather(with_xml(set_gpu(raw("nvidia-smi-q-x.xml"), "gpu_recovery_action", "x" * 500)))
    assert ev.error and "gpu_recovery_action" in ev.error


# ---------------------------------------------------------------------------------------- decisions


def test_a_healthy_host_needs_nothing() -> None:
    plan = plan_host(facts())
    assert (plan.action, plan.drain, plan.reasons) == (NONE, False, [])


@pytest.mark.parametrize(
    ("xid", "action"),
    [(13, NONE), (94, NONE), (48, RESET_GPU), (95, RESET_GPU), (79, REBOOT)],
)
def test_each_xid_takes_its_catalog_bucket(xid: int, action: str) -> None:
    plan = plan_host(with_xids(xid_line(xid)))
    assert plan.action == action
    assert plan.drain is (action != NONE)
    assert plan.gpus[0].action == action
    assert f"Xid {xid} " in plan.reasons[0]


def test_restart_app_is_the_tenants_no_node_action_but_is_still_reported() -> None:
    plan = plan_host(with_xids(xid_line(13)))
    assert plan.action == NONE and "RESTART_APP" in plan.reasons[0]


def test_an_unknown_xid_is_service_with_a_warning() -> None:
    plan = plan_host(with_xids(xid_line(999)))
    assert plan.action == SERVICE
    assert any("Xid 999 is not in the Xid table" in w for w in plan.warnings)
    assert any(r.startswith("warning: Xid 999") for r in plan.reasons)


def test_the_strongest_action_on_a_host_wins() -> None:
    plan = plan_host(with_xids(xid_line(13), xid_line(95), xid_line(79), xid_line(94)))
    assert plan.action == REBOOT


RECOVERY = [
    ("Reset", RESET_GPU),
    ("Reboot", REBOOT),
    ("Drain P2P", RESET_GPU),
    ("Drain and Reset", RESET_GPU),
]


@pytest.mark.parametrize(("value", "action"), RECOVERY)
def test_the_drivers_recovery_action_decides_for_its_gpu(value: str, action: str) -> None:
    plan = plan_host(with_xml(set_gpu(raw("nvidia-smi-q-x.xml"), "gpu_recovery_action", value)))
    assert plan.action == action
    assert "authoritative" in plan.gpus[0].reasons[0]


def test_the_drivers_recovery_action_supersedes_this_boots_xids() -> None:
    xml = set_gpu(raw("nvidia-smi-q-x.xml"), "gpu_recovery_action", "Reset")
    plan = plan_host(facts(**{XML: (0, xml, ""), KLOG: (0, kernel_log(xid_line(79)), "")}))
    assert plan.action == RESET_GPU
    assert any("superseded" in r for r in plan.gpus[0].reasons)


def test_an_unknown_recovery_action_is_service() -> None:
    plan = plan_host(with_xml(set_gpu(raw("nvidia-smi-q-x.xml"), "gpu_recovery_action", "Bus Reset")))
    assert plan.action == SERVICE and plan.warnings


def test_row_remap_failure_is_service() -> None:
    plan = plan_host(
        with_xml(set_gpu(raw("nvidia-smi-q-x.xml"), "remapped_rows/remapped_row_failure", "Yes"))
    )
    assert plan.action == SERVICE
    assert "cannot be repaired" in plan.gpus[0].reasons[0]


def test_row_remap_pending_is_a_gpu_reset() -> None:
    plan = plan_host(
        with_xml(set_gpu(raw("nvidia-smi-q-x.xml"), "remapped_rows/remapped_row_pending", "Yes"))
    )
    assert plan.action == RESET_GPU


def test_remap_failure_outranks_the_drivers_reset() -> None:
    xml = set_gpu(raw("nvidia-smi-q-x.xml"), "remapped_rows/remapped_row_failure", "Yes")
    plan = plan_host(with_xml(set_gpu(xml, "gpu_recovery_action", "Reset")))
    assert plan.action == SERVICE


def test_volatile_uncorrectable_ecc_is_a_gpu_reset() -> None:
    gpu = parse_nvidia_smi_xml(raw("nvidia-smi-q-x.xml")).gpus[0]
    counter = gpu.ecc_volatile_uncorrectable_texts[0][0]
    plan = plan_host(with_xml(set_gpu(raw("nvidia-smi-q-x.xml"), f"ecc_errors/volatile/{counter}", "2")))
    assert plan.action == RESET_GPU
    assert "uncorrectable ECC" in plan.gpus[0].reasons[0]


def test_a_gpu_on_the_bus_but_missing_from_nvml_is_a_reboot() -> None:
    f = facts(**{XML: (0, multi_gpu_xml(8, drop=(3,)), ""), "pci-devices.txt": (0, multi_gpu_pci(8), "")})
    plan = plan_host(f)
    assert plan.action == REBOOT
    lost = [g for g in plan.gpus if g.action == REBOOT]
    assert [(g.index, g.pci) for g in lost] == [(None, "0000:5d:00.0")]


def test_an_unreadable_kernel_log_is_an_error_row_never_none() -> None:
    plan = plan_host(facts(**{KLOG: (1, "", "dmesg: read kernel buffer failed: Operation not permitted")}))
    assert plan.action == "unknown" and plan.error and plan.drain is None
    assert exit_code([plan]) == 1


def test_the_table_loader_refuses_unknown_actions() -> None:
    with pytest.raises(ValueError, match="unknown action"):
        table_from({"buckets": {"X": "explode"}, "xids": {1: {"bucket": "X"}}})
    assert xid_table().rule(79).bucket == "RESTART_BM"


# ---------------------------------------------------------------------------------------- rendering


def test_json_shape_and_exit_codes() -> None:
    plans = [plan_host(facts()), plan_host(with_xids(xid_line(95)))]
    doc = json.loads(to_json(plans))
    assert [h["action"] for h in doc["hosts"]] == [NONE, RESET_GPU]
    host = doc["hosts"][1]
    assert set(host) == {"host", "action", "drain", "reasons", "gpus"}
    assert host["drain"] is True
    assert host["gpus"] == [
        {"index": 0, "pci": "0000:00:06.0", "action": RESET_GPU, "reasons": host["gpus"][0]["reasons"]}
    ]
    assert exit_code(plans[:1]) == 0 and exit_code(plans) == 1


def test_the_table_shows_host_text_safely() -> None:
    plan = plan_host(with_xids(xid_line(95, text="evil \x1b[2J\u202e")))
    plan.host = "h\x1b]0;x\x07"
    out = to_table([plan])
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b" in out


# ---------------------------------------------------------------------------------------------- CLI


def invoke(*args: str) -> tuple[int, str, str]:
    return invoke_verb("remediate", *args)


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    write_snapshot(tmp_path, "healthy", h200_probes())
    bad = h200_probes()
    bad[XML] = (0, set_gpu(raw("nvidia-smi-q-x.xml"), "remapped_rows/remapped_row_pending", "Yes"), "")
    write_snapshot(tmp_path, "pending", bad)
    return tmp_path


def test_cli_dry_run_on_a_snapshot_of_the_real_h200(snap: Path) -> None:
    rc, out, _ = invoke("--snapshot", str(snap), "--dry-run", "--format", "json")
    assert rc == 1
    assert {h["host"]: h["action"] for h in json.loads(out)["hosts"]} == {
        "healthy": NONE,
        "pending": RESET_GPU,
    }
    rc, out, _ = invoke("--snapshot", str(snap), "--dry-run", "--limit", "healthy")
    assert rc == 0 and "healthy" in out and "pending" not in out


def test_cli_without_dry_run_refuses_and_touches_nothing(snap: Path) -> None:
    rc, out, err = invoke("--snapshot", str(snap))
    assert rc == 2 and out == "" and "--dry-run" in err


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--format", "yaml"], "--format"),
        (["--limit", "nosuch"], "--limit nosuch"),
        (["--snapshot", "{empty}"], "no snapshot here"),
    ],
)
def test_cli_bad_input_is_exit_2_naming_the_problem(
    snap: Path, tmp_path: Path, args: list[str], names: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [a.replace("{empty}", str(empty)) for a in args]
    if "--snapshot" not in args:
        args = ["--snapshot", str(snap), *args]
    rc, out, err = invoke(*args, "--dry-run")
    assert rc == 2 and out == ""
    assert names in err


def test_xids_from_before_a_gpu_reset_are_what_the_reset_answered() -> None:
    f = with_xids(xid_line(48, t=100.0), xid_line(94, t=300.0))
    assert plan_host(f).action == RESET_GPU
    # reset at uptime 200: the Xid 48 before it is answered; the Xid 94 after it is new evidence
    after = gather(f, reset_at={"0000:00:06": 200.0})
    assert [e.xid for e in after.gpus[0].xids] == [94]
    assert plan_host(with_xids(xid_line(48, t=100.0)), reset_at={"0000:00:06": 200.0}).action == NONE
    # another GPU's reset answers nothing here
    assert plan_host(with_xids(xid_line(48, t=100.0)), reset_at={"0000:00:07": 200.0}).action == RESET_GPU
    # an Xid that asks for more than a reset is not answered by one
    assert plan_host(with_xids(xid_line(79, t=100.0)), reset_at={"0000:00:06": 200.0}).action == REBOOT


def test_an_xid_without_a_time_stamp_still_counts_after_a_reset() -> None:
    line = "Dec 05 10:00:00 h200 kernel: NVRM: Xid (PCI:0000:00:06): 48, pid=1, name=x, DBE"
    f = facts(**{KLOG: (0, kernel_log(line), "")})
    assert plan_host(f, reset_at={"0000:00:06": 1e9}).action == RESET_GPU


def test_cli_acting_options_are_checked_before_any_host(snap: Path, tmp_path: Path) -> None:
    for args, names in (
        (["--certify-level", "thorough"], "--certify-level"),
        (["--budget", "three/1h"], "--budget"),
        (["--max-concurrent", "0"], "--max-concurrent"),
        (["--watch"], "--watch"),
    ):
        rc, out, err = invoke("--snapshot", str(snap), "--dry-run", *args)
        assert rc == 2 and out == "" and names in err, (args, err)
    rc, out, err = invoke("-i", str(tmp_path / "nosuch.yml"), "--budget", "1/1x")
    assert rc == 2 and "--budget" in err
