"""`gpuprov lab down` stops the dockerd gpuprov started only when nothing else runs in it.

No Docker here: the docker client is a script that answers like an engine (and records what it was
asked), and "dockerd" is a sleeping process whose command line says dockerd, started by the test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuprov_lab import engine, fleet

LAB = "t1"
STARTED_ENGINE = "unix:///var/run/docker.sock"

# The client answers `ps` for the engine gpuprov started (asked by its socket) from $ENGINE_PS, and for
# whatever engine the client points at by default (DOCKER_HOST, a context) from $DEFAULT_PS; a value of
# FAIL makes that listing fail as a client does when it reaches no engine.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >>"$CALLS"
answer() {
  if [ "$1" = FAIL ]; then echo "Cannot connect to the Docker daemon" >&2; exit 1; fi
  printf '%s' "$1"
}
case "$*" in
  "info --format {{json .}}") echo '{"ID": "fake-engine"}' ;;
  *"--filter label="*) ;;
  "--host $STARTED ps --all --quiet") answer "$ENGINE_PS" ;;
  "ps -aq"|"ps --all --quiet") answer "$DEFAULT_PS" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def lab_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[subprocess.Popen, Path]]:
    root = tmp_path / "state"
    (root / "labs").mkdir(parents=True)
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("GPUPROV_LAB_STATE_ROOT", str(root))
    monkeypatch.setenv("GPUPROV_DOCKER", str(docker))
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("STARTED", STARTED_ENGINE)
    monkeypatch.setattr(engine, "DAEMON_JSON", tmp_path / "daemon.json")
    dockerd = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "dockerd"], stdin=subprocess.DEVNULL
    )
    (root / "engine").mkdir()
    (root / "engine" / "dockerd.pid").write_text(f"{dockerd.pid}\n")
    try:
        yield dockerd, calls
    finally:
        if dockerd.poll() is None:
            dockerd.kill()
        with contextlib.suppress(ChildProcessError):  # already reaped by the stop under test
            dockerd.wait(timeout=10)


def _still_running(dockerd: subprocess.Popen) -> bool:
    return dockerd.poll() is None and engine.started_by_gpuprov() == dockerd.pid


def lab_down(
    monkeypatch: pytest.MonkeyPatch, engine_ps: str, default_ps: str
) -> tuple[fleet.DownReport, list[str]]:
    """`lab down`, the engine gpuprov started listing `engine_ps` and the client's default one
    `default_ps` (FAIL: the listing fails); its report and the progress it gave."""
    monkeypatch.setenv("ENGINE_PS", engine_ps)
    monkeypatch.setenv("DEFAULT_PS", default_ps)
    messages: list[str] = []
    return fleet.down(LAB, progress=messages.append), messages


def test_a_container_of_someone_else_keeps_the_engine(lab_env, monkeypatch: pytest.MonkeyPatch) -> None:
    dockerd, _ = lab_env
    report, _ = lab_down(monkeypatch, "f00dcafe\n", "f00dcafe\n")
    assert report.engine_stopped is False
    assert _still_running(dockerd)


def test_the_engine_asked_is_the_one_gpuprov_started(lab_env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client points elsewhere (DOCKER_HOST, a context) where nothing runs; the engine gpuprov
    started still runs someone's container: it stays up."""
    dockerd, calls = lab_env
    report, messages = lab_down(monkeypatch, "f00dcafe\n", "")
    assert report.engine_stopped is False
    assert _still_running(dockerd)
    assert f"--host {STARTED_ENGINE} ps --all --quiet" in calls.read_text()
    assert any("1 other container(s)" in m for m in messages), messages


def test_an_engine_that_cannot_be_asked_keeps_running(lab_env, monkeypatch: pytest.MonkeyPatch) -> None:
    dockerd, _ = lab_env
    report, messages = lab_down(monkeypatch, "FAIL", "FAIL")
    assert report.engine_stopped is False
    assert _still_running(dockerd)
    assert any("cannot tell whether anything uses it" in m for m in messages), messages


def test_an_idle_engine_gpuprov_started_is_stopped(lab_env, monkeypatch: pytest.MonkeyPatch) -> None:
    dockerd, _ = lab_env
    report, _ = lab_down(monkeypatch, "", "")
    assert report.engine_stopped is True
    assert dockerd.poll() is not None or not os.path.exists(f"/proc/{dockerd.pid}")
    assert not (Path(os.environ["GPUPROV_LAB_STATE_ROOT"]) / "engine").exists()
