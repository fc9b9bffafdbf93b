"""Running commands and owning background processes, with failures turned into LabError."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuprov_lab.errors import LabError


def run(
    argv: Sequence[str],
    *,
    input: bytes | None = None,
    timeout: float = 600,
    check: bool = True,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    what: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv, capture text output; on failure raise LabError naming the command and its stderr tail."""
    try:
        res = subprocess.run(
            list(argv),
            input=input.decode() if input is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError as exc:
        raise LabError(
            f"{what or argv[0]}: {argv[0]} is not installed (./scripts/setup.sh installs it)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{what or ' '.join(argv[:3])}: no answer within {timeout:.0f} s") from exc
    if check and res.returncode != 0:
        raise LabError(
            f"{what or ' '.join(argv[:3])} failed (rc {res.returncode}): {tail(res.stderr or res.stdout)}"
        )
    return res


def tail(text: str, lines: int = 6) -> str:
    """The last lines of a command's output, on one line, for error messages."""
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(kept) or "(no output)"


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def alive(pid: int) -> bool:
    """True when the PID exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def pid_matches(pid: int, needles: Sequence[str]) -> bool:
    """Is PID still the process we started? (its command line holds every needle)."""
    line = " ".join(cmdline(pid))
    return alive(pid) and all(n in line for n in needles)


def recorded_pid(pid_file: Path, needle: str) -> int | None:
    """The PID a file records, if that process still runs and its command line holds needle."""
    pid = read_pid(pid_file)
    return pid if pid and pid_matches(pid, [needle]) else None


def spawn(argv: Sequence[str], log: Path, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start a server in a session of its own (it outlives us), its output appended to log."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )


def wait_started(
    child: subprocess.Popen[bytes], answers: Callable[[], bool], timeout: float, log: Path, what: str
) -> None:
    """Wait until a server just spawned answers; if it exits or stays silent, stop it and say why."""
    deadline = time.monotonic() + timeout
    while not answers():
        if child.poll() is not None or time.monotonic() > deadline:
            stop_pid(child.pid)
            raise LabError(f"{what} did not start: {tail(log.read_text(errors='replace'))}")
        time.sleep(0.1)


def stop_recorded(pid_file: Path, needle: str) -> bool:
    """Stop the server a PID file records (if it is still that server), drop the file; True if stopped."""
    pid = recorded_pid(pid_file, needle)
    if pid:
        stop_pid(pid, timeout=10)
    pid_file.unlink(missing_ok=True)
    return pid is not None


def stop_pid(pid: int, *, timeout: float = 20.0) -> None:
    """SIGTERM one process we started, wait, then SIGKILL it if it is still there."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(50):
        _reap(pid)
        if not alive(pid):
            return
        time.sleep(0.1)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def run_bytes(argv: Sequence[str], *, timeout: float = 120, what: str | None = None) -> bytes:
    """Run argv and return its raw stdout (keys, archives); LabError on failure."""
    try:
        res = subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise LabError(f"{what or argv[0]}: {argv[0]} is not installed") from exc
    if res.returncode != 0:
        raise LabError(f"{what or ' '.join(argv[:3])} failed: {tail(res.stderr.decode(errors='replace'))}")
    return res.stdout
