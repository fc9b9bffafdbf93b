"""This machine as an executor: commands through `/bin/sh`, for `--local` (the real GPU host has no sshd)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

from provisioner.executors.base import (
    STREAM_READ,
    CommandResult,
    CommandTimeout,
    ExecutorError,
    as_text,
)


def _start(command: Sequence[str] | str, *, stdin: int, stderr: int) -> subprocess.Popen[bytes] | str:
    """Start a command (a string runs through `/bin/sh -c`), stdout piped, in a process group of its own so
    that a timeout can stop the whole group; a command that cannot start gives why: "<program>: <reason>"."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    try:
        return subprocess.Popen(
            argv, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True
        )
    except OSError as exc:
        return f"{argv[0]}: {exc.strerror}"


class LocalExecutor:
    """This machine, through `/bin/sh`. Used by `--local` (the real GPU host has no sshd)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or socket.gethostname()

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        start = time.monotonic()
        proc = _start(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if isinstance(proc, str):
            return CommandResult(127, "", proc, time.monotonic() - start)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CommandTimeout(self.name, f"command timed out after {timeout:g} s") from None
        return CommandResult(proc.returncode, as_text(out), as_text(err), time.monotonic() - start)

    def open_stream(self, command: Sequence[str] | str) -> LocalStream:
        proc = _start(command, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if isinstance(proc, str):
            raise ExecutorError(self.name, proc)
        return LocalStream(self.name, proc)

    def close(self) -> None:
        return None


class LocalStream:
    """A command of this machine kept running; read through select() on its stdout pipe."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self.name = name
        self.proc = proc
        self.ended = False

    def send(self, data: bytes, timeout: float) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            self.ended = True
            raise ExecutorError(self.name, "the command ended") from exc

    def read(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        if self.ended or not select.select([fd], [], [], max(0.0, timeout))[0]:
            return b""
        data = os.read(fd, STREAM_READ)
        self.ended = not data
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the command sees end of input and ends
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.ended = True
