"""`gpuprov lab down` while the engine is down (after a reboot or a crash) still removes the lab.

Docker keeps a stopped engine's containers, networks and volumes and restarts the lab's containers
(restart policy) when it starts again: forgetting the lab's state then would leave a running fleet with
nothing that knows of it, on addresses a new lab may be given. No Docker here: the engine's answers
are stubs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuprov_lab import engine, fleet, paths
from gpuprov_lab.errors import LabError

LAB = "t1"


class _StoppedEngineNowStarted:
    """The engine once started: it lists the lab's objects and records what is removed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def lines(self, *args: str, **_: object) -> list[str]:
        if args[:2] == ("ps", "-aq") and f"label={paths.LABEL}={LAB}" in args:
            return ["c0ffee", "decade"]
        return []

    def __call__(self, *args: str, **_: object) -> None:
        self.calls.append(args)


@pytest.fixture
def lab_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_LAB_STATE_ROOT", str(tmp_path / "state"))
    root = paths.LabPaths(LAB).root
    (root / "hosts" / "gpu1").mkdir(parents=True)
    monkeypatch.setattr(engine.Docker, "info", lambda self: None)  # no engine answers
    return root


def test_the_engine_is_started_to_remove_what_it_still_holds(lab_state: Path, monkeypatch) -> None:
    started = _StoppedEngineNowStarted()
    monkeypatch.setattr(engine, "ensure_engine", lambda progress=None: started)
    report = fleet.down(LAB)
    assert ("rm", "-f", "-v", "c0ffee", "decade") in started.calls
    assert report.containers == ["c0ffee", "decade"]
    assert report.state_removed and not lab_state.exists()


def test_an_engine_that_cannot_start_keeps_the_labs_state(lab_state: Path, monkeypatch) -> None:
    def cannot_start(progress=None):
        raise LabError("dockerd did not become ready")

    monkeypatch.setattr(engine, "ensure_engine", cannot_start)
    with pytest.raises(LabError, match="did not become ready"):
        fleet.down(LAB)
    assert lab_state.is_dir()  # a later `lab down` can still find and remove the lab
