"""What every executor is: the one interface (`run(argv_or_script, timeout) -> CommandResult`, and for a
long-lived command a `CommandStream`), the errors a host's failure becomes, and the set of executors a run
has open so that Ctrl-C can close them."""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from provisioner.errors import GpuprovError


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str
    duration_s: float


class ExecutorError(GpuprovError):
    """A command could not be run on a host; `reason` says why in a few words."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


class HostUnreachable(ExecutorError):
    """Could not connect or authenticate: the host was not touched."""


class CommandTimeout(ExecutorError):
    """The command ran past its timeout and was stopped."""


class Executor(Protocol):
    """Runs read-only commands on one host."""

    name: str

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult: ...

    def close(self) -> None: ...


class CommandStream(Protocol):
    """A long-lived command on a host: its stdin stays open, its stdout is read as it comes."""

    ended: bool

    def send(self, data: bytes, timeout: float) -> None: ...

    def read(self, timeout: float) -> bytes:
        """Stdout that arrived within `timeout` (b"" when none did; `ended` once the command is gone)."""
        ...

    def close(self) -> None: ...


STREAM_READ = 1 << 16


def to_shell(command: Sequence[str] | str) -> str:
    """A script stays as written; an argv is quoted so that no argument is re-split by a shell."""
    if isinstance(command, str):
        return command
    return shlex.join(list(command))


def as_text(data: bytes) -> str:
    """A command's output as text; bytes that are not UTF-8 become U+FFFD, never an error."""
    return data.decode("utf-8", errors="replace")


def recorded_seconds(value: object) -> float:
    """A recorded duration; anything but a finite non-negative number (a string, a list, NaN) is 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if 0 <= value < float("inf") else 0.0


class OpenConnections:
    """Executors in use by a run, so that Ctrl-C can close their connections: blocked reads return and
    worker threads end instead of holding the exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, Executor] = {}

    def add(self, ex: Executor) -> None:
        with self._lock:
            self._by_id[id(ex)] = ex

    def discard(self, ex: Executor) -> None:
        with self._lock:
            self._by_id.pop(id(ex), None)

    def close_all(self) -> None:
        with self._lock:
            live = list(self._by_id.values())
            self._by_id.clear()
        for ex in live:
            with contextlib.suppress(Exception):
                ex.close()
