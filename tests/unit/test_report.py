"""Report renderers and exit codes, over snapshots built from the real H200 capture."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import verify_fixtures as vf

from provisioner.checks.model import Finding
from provisioner.errors import InputError
from provisioner.report import check_output_path, render, write_output
from provisioner.report.model import HostReport, Report
from provisioner.verification import verify_snapshot


@pytest.fixture(scope="module")
def fleet_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """gpu1 healthy; gpu2 with Xid 79 on its GPU; gpu3 with a narrowed PCIe link (warn only)."""
    root = tmp_path_factory.mktemp("snap")
    vf.write_snapshot(root, "gpu1", vf.h200_probes())
    bad = vf.h200_probes()
    bad["kernel-log.txt"] = (0, vf.kernel_log(vf.xid_line(79, text="GPU has fallen off the bus.")), "")
    vf.write_snapshot(root, "gpu2", bad)
    warn = vf.h200_probes()
    warn["nvidia-smi-q.xml"] = (
        0,
        vf.set_gpu(
            vf.raw("nvidia-smi-q-x.xml"), "pci/pci_gpu_link_info/link_widths/current_link_width", "8x"
        ),
        "",
    )
    vf.write_snapshot(root, "gpu3", warn)
    return verify_snapshot(root)


def test_json_shape_and_summary(fleet_report: Report) -> None:
    doc = json.loads(render(fleet_report, "json"))
    assert [h["host"] for h in doc["hosts"]] == ["gpu1", "gpu2", "gpu3"]
    gpu2 = doc["hosts"][1]
    xid = [c for c in gpu2["checks"] if c["id"] == "gpu.xid"]
    assert xid == [
        {
            "id": "gpu.xid",
            "status": "fail",
            "severity": "critical",
            "gpu": 0,
            "bus_id": "0000:00:06.0",
            "detail": xid[0]["detail"],
            "data": {"xids": [79]},
        }
    ]
    for host in doc["hosts"]:
        for c in host["checks"]:
            assert set(c) >= {"id", "status", "severity", "detail"}
    counts = {s: 0 for s in ("pass", "warn", "fail", "skip", "error")}
    for host in doc["hosts"]:
        worst: dict[str, str] = {}
        order = ["pass", "skip", "warn", "error", "fail"]
        for c in host["checks"]:
            if c["id"] not in worst or order.index(c["status"]) > order.index(worst[c["id"]]):
                worst[c["id"]] = c["status"]
        for s in worst.values():
            counts[s] += 1
    assert doc["summary"]["checks"] == counts
    assert doc["summary"]["hosts"] == 3
    assert doc["summary"]["hosts_ok"] == 1
    assert doc["summary"]["hosts_with_findings"] == 2
    assert doc["summary"]["status"] == "fail"


def test_exit_codes() -> None:
    def rep(*statuses: str, error: str | None = None) -> Report:
        findings = [Finding(f"c{i}", s, "high", "x") for i, s in enumerate(statuses)]
        return Report([HostReport("h", findings, error=error)], [f"c{i}" for i in range(len(statuses))], "t")

    assert rep("pass", "skip").exit_code("warn") == 0
    assert rep("pass", "warn").exit_code("warn") == 1
    assert rep("pass", "warn").exit_code("fail") == 0
    assert rep("pass", "fail").exit_code("fail") == 1
    assert rep("pass", "error").exit_code("fail") == 1
    assert rep("pass", error="unreachable").exit_code("fail") == 1


def test_junit(fleet_report: Report) -> None:
    root = ET.fromstring(render(fleet_report, "junit", fail_on="warn"))
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["gpu1", "gpu2", "gpu3"]
    assert suites["gpu1"].get("failures") == "0"
    xid_case = suites["gpu2"].find("testcase[@name='gpu.xid[gpu 0]']")
    assert xid_case is not None and xid_case.find("failure") is not None
    assert xid_case.find("failure").get("type") == "fail"  # type: ignore[union-attr]
    assert suites["gpu3"].get("failures") == "1"
    skipped = sum(1 for _ in suites["gpu1"].iter("skipped"))
    assert suites["gpu1"].get("skipped") == str(skipped) and skipped > 0
    lenient = ET.fromstring(render(fleet_report, "junit", fail_on="fail"))
    gpu3 = next(s for s in lenient.findall("testsuite") if s.get("name") == "gpu3")
    assert gpu3.get("failures") == "0"
    assert any("warn" in (o.text or "") for o in gpu3.iter("system-out"))
    assert root.get("tests") == str(sum(len(h.findings) for h in fleet_report.hosts))


def test_prometheus_textfile(fleet_report: Report) -> None:
    text = render(fleet_report, "prometheus")
    sample = re.compile(r'^[a-z_]+(\{[a-z_]+="(?:[^"\\]|\\.)*"(,[a-z_]+="(?:[^"\\]|\\.)*")*\})? -?[0-9.e+]+$')
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert 'gpuprov_check_status{host="gpu2",check="gpu.xid"} 4' in text
    assert 'gpuprov_check_status{host="gpu3",check="gpu.pcie_link"} 2' in text
    assert 'gpuprov_check_status{host="gpu1",check="gpu.xid"} 0' in text
    assert 'gpuprov_check_ok{host="gpu2",check="gpu.xid"} 0' in text
    assert 'gpuprov_gpu_check_status{host="gpu2",check="gpu.xid",gpu="0"} 4' in text
    assert 'gpuprov_host_reachable{host="gpu1"} 1' in text


def test_prometheus_escapes_labels() -> None:
    rep = Report(
        [HostReport('we"ird\\host\n', [Finding("gpu.ecc", "pass", "high", "ok")])],
        ["gpu.ecc"],
        "2026-12-02T15:03:54Z",
    )
    text = render(rep, "prometheus")
    assert 'host="we\\"ird\\\\host\\n"' in text
    assert "gpuprov_last_run_timestamp_seconds 1796223834" in text


def test_tables(fleet_report: Report) -> None:
    text = render(fleet_report, "table", width=200)
    for host in ("gpu1", "gpu2", "gpu3"):
        assert host in text
    assert "gpu.xid" in text and "Xid 79" in text
    assert "3 host(s): 1 ok, 2 with findings" in text
    drift = render(fleet_report, "table", drift=True, width=200)
    row = next(line for line in drift.splitlines() if "gpu2" in line and "✗" in line)
    assert row.count("✗") == 1
    assert "xid=gpu.xid" in drift and "✓ pass" in drift
    assert "GPU 0 (0000:00:06.0): Xid 79" in drift


def test_large_fleet_table_hides_passes(tmp_path: Path) -> None:
    for i in range(5):
        vf.write_snapshot(tmp_path, f"n{i}", vf.h200_probes())
    text = render(verify_snapshot(tmp_path), "table", width=200)
    assert "pass/skip result(s) not shown" in text
    assert "os.supported" not in text


def test_write_output_atomic_and_checked(tmp_path: Path) -> None:
    out = tmp_path / "gpuprov.prom"
    write_output("a 1\n", out)
    write_output("a 2\n", out)
    assert out.read_text() == "a 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gpuprov.prom"]
    with pytest.raises(InputError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "x.json")
    with pytest.raises(InputError, match="is a directory"):
        check_output_path(tmp_path)
    with pytest.raises(InputError, match="unknown format"):
        render(Report([], [], "t"), "html")


def test_output_never_replaces_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """Run as root, --output must not turn a symlink, a FIFO or a device node into a report file."""
    import os

    secret = tmp_path / "shadow"
    secret.write_text("root:x:0\n")
    link = tmp_path / "report.json"
    link.symlink_to(secret)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A device node of its own (never the machine's /dev/null, which a regression would replace).
    device = tmp_path / "null"
    os.mknod(device, 0o20666, os.makedev(1, 3))
    cases = ((link, "symbolic link"), (fifo, "not a regular file"), (device, "not a regular"))
    for path, why in cases:
        with pytest.raises(InputError, match=why):
            check_output_path(path)
        with pytest.raises(InputError, match=why):
            write_output("x", path)
    assert link.is_symlink() and secret.read_text() == "root:x:0\n"
    assert fifo.is_fifo() and device.is_char_device()
    with pytest.raises(InputError, match="cannot create a file"):
        check_output_path(Path("/proc/gpuprov-report.json"))


def test_a_new_report_gets_the_users_umask_and_an_old_one_keeps_its_mode(tmp_path: Path) -> None:
    import os

    old = os.umask(0o077)
    try:
        write_output("x", tmp_path / "new.json")
    finally:
        os.umask(old)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o600
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o640)
    write_output("new", kept)
    assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_text() == "new"


HOSTILE = "gpu9\x1b]0;owned\x07\x1b[2J\u202e[/red][bold]x\x00"


def hostile_report() -> Report:
    finding = Finding("gpu.xid", "fail", "high", f"Xid 79 from process {HOSTILE}", gpu=0, data={"p": HOSTILE})
    return Report([HostReport(HOSTILE, [finding], address=HOSTILE)], ["gpu.xid"], "2026-12-03T00:00:00Z")


@pytest.mark.parametrize("fmt", ["table", "junit", "prometheus"])
@pytest.mark.parametrize("drift", [False, True])
def test_host_text_cannot_drive_the_terminal_or_break_the_output(fmt: str, drift: bool) -> None:
    """Host names, addresses and details (Xid process names, probe output) come from hosts: no escape
    sequence, bidi override or NUL reaches the terminal raw, rich markup in them is text, and the JUnit
    XML stays well-formed."""
    out = render(hostile_report(), fmt, drift=drift)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f\u202e]", out), repr(out)
    assert "\\x1b" in out
    if fmt == "junit":
        ET.fromstring(out)
    if fmt == "table":
        assert "[/red][bold]x" in out


def test_json_keeps_the_hosts_text_escaped_by_json() -> None:
    doc = json.loads(render(hostile_report(), "json"))
    assert doc["hosts"][0]["host"] == HOSTILE


def test_every_check_has_a_short_name_in_the_drift_table() -> None:
    from provisioner.checks import CHECK_IDS
    from provisioner.report.table import SHORT

    assert list(SHORT) == list(CHECK_IDS)
    assert len(set(SHORT.values())) == len(SHORT)
