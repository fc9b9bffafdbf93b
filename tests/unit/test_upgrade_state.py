"""The rolling change's state file, with the driver upgrade's steps: allowed step changes, atomic saves,
load back, resume lookup, one run at a time per inventory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.rollout.state import (
    RolloutState,
    StateError,
    inventory_lock,
    latest_for,
    resumable,
)
from provisioner.upgrade.rollout import DRIVER


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def new_state(
    home: Path,
    name: str = "20250101T000000Z-upgrade-driver",
    inventory: str = "/inv/hosts.yml",
    hosts: tuple[str, ...] = ("gpu1", "gpu2"),
) -> RolloutState:
    record = home / "runs" / name
    record.mkdir(parents=True)
    return RolloutState.create(
        record, DRIVER, inventory=inventory, options={"to": "580"}, plan={"target": "580"}, hosts=list(hosts)
    )


def test_every_step_has_successors_defined() -> None:
    assert set(DRIVER.next_steps) == set(DRIVER.steps)
    assert all(set(v) <= set(DRIVER.steps) for v in DRIVER.next_steps.values())


def test_steps_move_forward_only(home: Path) -> None:
    st = new_state(home)
    with pytest.raises(StateError, match="cannot go from pending to installing"):
        st.step("gpu1", "installing")
    st.start("gpu1")
    for step in ("cordoning", "draining", "stopping", "installing", "reloading", "verifying", "uncordoning"):
        st.step("gpu1", step)
    with pytest.raises(StateError, match="cannot go from uncordoning to draining"):
        st.step("gpu1", "draining")
    st.finish("gpu1", "upgraded")
    with pytest.raises(StateError, match="after the host ended"):
        st.step("gpu1", "uncordoning")
    with pytest.raises(StateError, match="unknown result"):
        st.finish("gpu2", "fine")


def test_drain_failure_may_go_back_to_uncordon(home: Path) -> None:
    st = new_state(home)
    st.start("gpu1")
    st.step("gpu1", "cordoning")
    st.step("gpu1", "draining")
    st.step("gpu1", "uncordoning")
    st.finish("gpu1", "failed", "drain: timed out")
    assert st.hosts["gpu1"].reason == "drain: timed out"


def test_saved_at_every_change_and_loads_back(home: Path) -> None:
    st = new_state(home)
    st.start("gpu1")
    st.update(
        "gpu1", was_cordoned=False, cordoned_by_us=True, paused_labels={"nvidia.com/gpu.deploy.dcgm": "true"}
    )
    st.step("gpu1", "cordoning")
    doc = json.loads(st.path.read_text())
    assert doc["hosts"]["gpu1"]["step"] == "cordoning"
    assert doc["hosts"]["gpu1"]["paused_labels"] == {"nvidia.com/gpu.deploy.dcgm": "true"}
    again = RolloutState.load(st.path.parent, DRIVER)
    assert again.hosts["gpu1"].to_dict() == st.hosts["gpu1"].to_dict()
    assert not list(st.path.parent.glob("*.tmp"))
    with pytest.raises(StateError, match="not a host state field"):
        st.update("gpu1", colour="red")


def test_reopen_puts_unfinished_hosts_back_and_leaves_finished_ones(home: Path) -> None:
    st = new_state(home, hosts=("a", "b", "c"))
    st.start("a")
    st.finish("a", "upgraded")
    st.start("b")
    st.step("b", "cordoning")
    st.finish("b", "failed", "drain: x")
    st.start("c")
    st.step("c", "stopping")  # crashed here: no result
    for h in ("a", "b", "c"):
        st.reopen(h)
    assert st.hosts["a"].result == "upgraded"
    assert (st.hosts["b"].step, st.hosts["b"].result) == ("pending", None)
    assert st.hosts["b"].history[-1][2:] == ["failed", "drain: x"]
    assert (st.hosts["c"].step, st.hosts["c"].result) == ("pending", None)
    st.start("b")
    assert st.hosts["b"].attempts == 2


def test_durations_add_up_over_attempts(home: Path) -> None:
    st = new_state(home)
    st.start("gpu1")
    st.hosts["gpu1"].started_at -= 10  # type: ignore[operator]
    st.finish("gpu1", "failed")
    st.reopen("gpu1")
    st.start("gpu1")
    st.hosts["gpu1"].started_at -= 5  # type: ignore[operator]
    st.finish("gpu1", "upgraded")
    assert 15 <= st.hosts["gpu1"].duration_s < 16


def test_resume_finds_the_latest_run_of_that_inventory(home: Path) -> None:
    older = new_state(home, "20250101T000000Z-upgrade-driver")
    newer = new_state(home, "20250102T000000Z-upgrade-driver")
    new_state(home, "20250103T000000Z-upgrade-driver", inventory="/other/hosts.yml")
    assert latest_for("/inv/hosts.yml", "upgrade-driver") == newer.path.parent
    assert resumable("/inv/hosts.yml", DRIVER) == newer.path.parent
    for h in newer.hosts:
        newer.start(h)
        newer.finish(h, "upgraded")
    # The latest one finished: an older unfinished run is stale, not something to resume.
    assert not RolloutState.load(older.path.parent, DRIVER).finished
    with pytest.raises(InputError, match="finished; nothing to resume"):
        resumable("/inv/hosts.yml", DRIVER)
    with pytest.raises(InputError, match="no upgrade-driver run recorded for /nowhere"):
        resumable("/nowhere", DRIVER)


def test_corrupt_state_file_is_bad_input(home: Path) -> None:
    st = new_state(home)
    st.path.write_text("{not json")
    with pytest.raises(InputError, match="unreadable upgrade state"):
        RolloutState.load(st.path.parent, DRIVER)
    st.path.write_text(
        json.dumps({"format": 1, "verb": "upgrade-driver", "hosts": {"a": {"step": "flying"}}})
    )
    with pytest.raises(InputError, match="unknown step 'flying'"):
        RolloutState.load(st.path.parent, DRIVER)


def test_one_upgrade_at_a_time_per_inventory(home: Path) -> None:
    code = (
        "import sys, time\n"
        "from provisioner.rollout.state import inventory_lock\n"
        "with inventory_lock('/inv/hosts.yml'):\n"
        "    print('locked', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    env = dict(os.environ, GPUPROV_HOME=str(home))
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with (
            pytest.raises(
                InputError, match=rf"another rolling run \(upgrade-driver or mig apply, pid {holder.pid}\)"
            ),
            inventory_lock("/inv/hosts.yml"),
        ):
            pass
        with inventory_lock("/other/hosts.yml"):
            pass
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=30)
    with inventory_lock("/inv/hosts.yml"):
        pass
