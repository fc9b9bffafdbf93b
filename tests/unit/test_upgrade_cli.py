"""`gpuprov upgrade-driver`: bad input exits 2 before anything is touched; the verb end to end over a
fake fleet (summary, state file, exit codes, dry run, resume, interruption)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_inventory import assert_untouched, gpuprov, inventory, write_inventory
from test_upgrade_fakes import FakeFleet, FakeHost

from provisioner.errors import InputError
from provisioner.rollout.render import Progress
from provisioner.upgrade import render, verb


def run_upgrade(*, output_format: str = "table", **kw: Any) -> int:
    """The verb as the CLI runs it: the library's result, then its rendering (progress on stderr)."""
    kw.setdefault("progress", Progress())
    return render.show(verb.run_upgrade(**kw), output_format)


INVENTORY = inventory(
    "gpu1: {ansible_host: 192.0.2.11}", "gpu2: {ansible_host: 192.0.2.12}", "gpu3: {ansible_host: 192.0.2.13}"
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    return write_inventory(tmp_path, INVENTORY)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return gpuprov(home, "upgrade-driver", *args, stdin=subprocess.DEVNULL, timeout=120, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "58"], "--to '58': expected a driver branch like 580"),
        (["--to", "580.159.04-1"], "without the package revision"),
        ([], "--to is required"),
        (["--to", "580", "--batch", "0"], "--batch 0: a batch needs at least 1 host"),
        (["--to", "580", "--batch", "150%"], "--batch 150%: a percentage must be between 1% and 100%"),
        (["--to", "580", "--canary", "-1"], "--canary -1: must be at least 0"),
        (["--to", "580", "--max-fail", "-2"], "--max-fail -2: must be at least 0"),
        (["--to", "580", "--limit", "gpu1,gpu9"], "--limit gpu1,gpu9: no host or group named 'gpu9'"),
        (["--to", "580", "--limit", "cp1"], "no host of group gpu_nodes selected by --limit cp1"),
        (["--to", "580", "--pause"], "--pause asks before each batch: standard input must be a terminal"),
        (["--resume"], "--resume: no upgrade-driver run recorded for"),
        (["--resume", "--dry-run"], "--resume and --dry-run together"),
        (["--to", "580", "--drain-timeout", "0"], "--drain-timeout 0: must be a number of seconds"),
        (["--to", "575"], "--to 575: no pinned 575.x version to install"),
    ],
)
def test_bad_input_exits_2_and_touches_nothing(home: Path, inv: Path, args: list[str], message: str) -> None:
    r = cli(home, "-i", str(inv), *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert_untouched(home)


def test_inventory_required_and_must_exist(home: Path, tmp_path: Path) -> None:
    r = cli(home, "--to", "580")
    assert (r.returncode, "-i/--inventory is required" in r.stderr) == (2, True)
    r = cli(home, "-i", str(tmp_path / "nope.yml"), "--to", "580")
    assert (r.returncode, "nope.yml: inventory not found" in r.stderr) == (2, True)


def test_bad_role_setting_is_bad_input(home: Path, inv: Path) -> None:
    (inv.parent / "group_vars").mkdir()
    (inv.parent / "group_vars" / "all.yml").write_text("gpuprov_reboot_allowed: perhaps\n")
    r = cli(home, "-i", str(inv), "--to", "580")
    assert r.returncode == 2
    assert "gpuprov_reboot_allowed: expected a boolean" in r.stderr
    assert_untouched(home)


# ------------------------------------------------------------------------------- over a fake fleet


class Factory:
    """Stands in for the real fleet; checks what the verb hands it."""

    def __init__(self, fleet: FakeFleet) -> None:
        self.fleet = fleet
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        inventory: Any,
        hosts: list[Any],
        control: Any,
        options: Any,
        record: Path | None,
        inventory_path: Path,
        progress: Any,
    ) -> FakeFleet:
        self.calls.append(
            {"hosts": [h.name for h in hosts], "control": control.name if control else None, "record": record}
        )
        return self.fleet


def three() -> FakeFleet:
    return FakeFleet([FakeHost("gpu1"), FakeHost("gpu2", version="580.159.04"), FakeHost("gpu3")])


def run(inv: Path, factory: Factory, **kw: Any) -> int:
    kw.setdefault("to", "580.159.04")
    return run_upgrade(inventory=inv, fleet_factory=factory, output_format="json", **kw)


def test_full_run_prints_a_json_summary_and_records_state(
    home: Path, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = Factory(three())
    assert run(inv, factory, batch="2") == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert factory.calls[0]["hosts"] == ["gpu1", "gpu2", "gpu3"]  # GPU hosts only
    assert factory.calls[0]["control"] == "cp1"
    rows = {h["host"]: h for h in summary["hosts"]}
    assert {h: r["result"] for h, r in rows.items()} == {
        "gpu1": "upgraded",
        "gpu2": "skipped",
        "gpu3": "upgraded",
    }
    assert (rows["gpu1"]["from"], rows["gpu1"]["to"]) == ("570.195.03", "580.159.04")
    assert rows["gpu2"]["reason"] == "already at 580.159.04: 580.159.04 loaded"
    assert all(isinstance(r["duration_s"], float) for r in rows.values())
    assert summary["status"] == "finished" and not summary["resumable"]
    record = Path(summary["record"])
    assert json.loads((record / "state.json").read_text())["status"] == "finished"
    assert json.loads((record / "summary.json").read_text()) == summary
    # Live progress per host and step went to stderr.
    assert "gpu1                 cordoning" in err
    assert "gpu3                 upgraded 570.195.03 → 580.159.04" in err
    assert factory.fleet.closed


def test_dry_run_prints_the_plan_and_changes_nothing(
    home: Path, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = three()
    factory = Factory(fleet)
    assert (
        run_upgrade(inventory=inv, to="580.159.04", batch="1", canary=1, dry_run=True, fleet_factory=factory)
        == 0
    )
    out = capsys.readouterr().out
    assert "canary (1 host, in parallel):\n  gpu1                 570.195.03 → 580.159.04" in out
    assert "batch 1 (1 host, in parallel):\n  gpu3" in out
    assert "skip   gpu2" in out
    assert {c[0] for c in fleet.calls} == {"probe"}
    assert factory.calls[0]["record"] is None
    assert_untouched(home)
    assert (
        run_upgrade(inventory=inv, to="580", dry_run=True, output_format="json", fleet_factory=factory) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["waves"] == [["gpu1"], ["gpu3"]]
    assert doc["hosts"]["gpu2"]["action"] == "skip"
    assert doc["hosts"]["gpu1"]["needs"][:2] == ["cordon", "drain"]


def test_a_dry_run_that_could_not_probe_a_host_does_not_report_success(
    home: Path, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = three()
    fleet.hosts["gpu3"].faults.add("unreachable")
    factory = Factory(fleet)
    assert run_upgrade(inventory=inv, to="580", dry_run=True, fleet_factory=factory) == 1
    captured = capsys.readouterr()
    assert "gpu3" in captured.out and "1 of 3 host(s) could not be probed (gpu3)" in captured.err
    assert_untouched(home)


def test_failure_stops_then_resume_completes_the_rest(
    home: Path, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = FakeFleet([FakeHost("gpu1", faults={"install-fail"}), FakeHost("gpu2"), FakeHost("gpu3")])
    factory = Factory(fleet)
    assert run(inv, factory, batch="1", max_fail=0) == 1
    first = json.loads(capsys.readouterr().out)
    assert [h["result"] for h in first["hosts"]] == ["failed", "not-started", "not-started"]
    assert first["status"] == "stopped" and first["resumable"]
    assert fleet.touched("gpu2") == [] and fleet.touched("gpu3") == []

    fleet.hosts["gpu1"].faults.clear()
    fleet.upgrade_calls.clear()
    # Plan-shaping options may not change on resume.
    with pytest.raises(InputError, match="--batch 2 differs"):
        run_upgrade(inventory=inv, to=None, resume=True, batch="2", fleet_factory=factory)
    assert run_upgrade(inventory=inv, to=None, resume=True, fleet_factory=factory, output_format="json") == 0
    second = json.loads(capsys.readouterr().out)
    assert second["record"] == first["record"]
    assert [h["result"] for h in second["hosts"]] == ["upgraded"] * 3
    assert fleet.upgrade_calls == [["gpu1"], ["gpu2"], ["gpu3"]]
    # A finished run cannot be resumed.
    with pytest.raises(InputError, match="nothing to resume"):
        run_upgrade(inventory=inv, to=None, resume=True, fleet_factory=factory)


def test_resume_does_not_redo_finished_hosts(
    home: Path, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = FakeFleet([FakeHost("gpu1"), FakeHost("gpu2", faults={"install-fail"}), FakeHost("gpu3")])
    factory = Factory(fleet)
    assert run(inv, factory, batch="1", max_fail=0) == 1
    capsys.readouterr()
    fleet.hosts["gpu2"].faults.clear()
    fleet.upgrade_calls.clear()
    fleet.calls.clear()
    assert run_upgrade(inventory=inv, to="580.159.04", resume=True, fleet_factory=factory) == 0
    assert fleet.upgrade_calls == [["gpu2"], ["gpu3"]]
    assert fleet.touched("gpu1") == []


def test_interrupted_run_exits_3_with_state_recorded(
    home: Path, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = FakeFleet([FakeHost("gpu1", faults={"interrupt-here"}), FakeHost("gpu2"), FakeHost("gpu3")])
    assert run(inv, Factory(fleet), batch="1") == 3
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "interrupted"
    assert [h["result"] for h in summary["hosts"]] == ["interrupted", "not-started", "not-started"]
    state = json.loads((Path(summary["record"]) / "state.json").read_text())
    assert state["hosts"]["gpu1"]["step"] == "installing"
    assert state["status"] == "interrupted"


def test_reboot_pending_exits_1(home: Path, inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = FakeFleet([FakeHost("gpu1", faults={"unload-busy"}), FakeHost("gpu2"), FakeHost("gpu3")])
    assert run(inv, Factory(fleet), batch="3") == 1
    rows = {h["host"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}
    assert rows["gpu1"]["result"] == "reboot-pending"
    assert rows["gpu1"]["cordoned"] is True
    assert rows["gpu2"]["result"] == "upgraded"


def test_table_output(home: Path, inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_upgrade(inventory=inv, to="580", fleet_factory=Factory(three()), batch="3") == 0
    out = capsys.readouterr().out
    assert "upgrade-driver → 580" in out
    assert "hosts: 1 skipped, 2 upgraded; record:" in out


def interrupted_run(inv: Path, signum: signal.Signals, at: str) -> FakeFleet:
    """An upgrade, a batch a host, that gets `signum` as `at` installs: exit 3, and the signal's handler
    put back afterwards."""
    fleet = FakeFleet([FakeHost("gpu1"), FakeHost("gpu2"), FakeHost("gpu3")])
    fleet.on_install = lambda name: os.kill(os.getpid(), signum) if name == at else None
    previous = signal.getsignal(signum)
    assert run(inv, Factory(fleet), batch="1") == 3
    assert signal.getsignal(signum) is previous
    return fleet


def test_ctrl_c_stops_cleanly_with_exit_3(home: Path, inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = interrupted_run(inv, signal.SIGINT, at="gpu2")
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert [h["result"] for h in summary["hosts"]] == ["upgraded", "interrupted", "not-started"]
    assert summary["hosts"][1]["reason"] == "interrupted at reloading; node left cordoned"
    assert fleet.interrupts == 1
    assert "interrupted: stopping after the steps in progress" in err
    assert fleet.touched("gpu3") == []


def test_note_when_the_inventory_pins_another_version(
    home: Path, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (inv.parent / "group_vars").mkdir()
    (inv.parent / "group_vars" / "gpu_nodes.yml").write_text(
        'nvidia_driver_branch: "570"\nnvidia_driver_version: "570.195.03"\n'
    )
    assert run(inv, Factory(three()), to="580", batch="3") == 0
    out, err = capsys.readouterr()
    notes = json.loads(out)["notes"]
    assert notes == [
        "nvidia_driver_version is 570.195.03 for gpu1, gpu3 (inventory or role default): "
        "set it to 580.159.04, or the next gpuprov bootstrap installs 570.195.03 again"
    ]
    assert "note: nvidia_driver_version is 570.195.03" in err


def test_sigterm_is_taken_as_ctrl_c(home: Path, inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    interrupted_run(inv, signal.SIGTERM, at="gpu1")
    summary = json.loads(capsys.readouterr().out)
    assert [h["result"] for h in summary["hosts"]] == ["interrupted", "not-started", "not-started"]
