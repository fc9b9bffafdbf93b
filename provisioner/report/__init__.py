"""Report renderers: table (rich), fleet drift table, JSON, JUnit XML, Prometheus textfile.

Every renderer takes a Report and returns text; `write_output` puts it in a file atomically (a
textfile collector must never read half a file).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from provisioner.errors import InputError
from provisioner.report.model import FAIL_ON, HostReport, Report, sanitized

FORMATS = ("table", "json", "junit", "prometheus")

__all__ = ["FAIL_ON", "FORMATS", "HostReport", "Report", "check_output_path", "render", "write_output"]


def render(
    report: Report,
    fmt: str,
    *,
    fail_on: str = "warn",
    drift: bool = False,
    color: bool = False,
    width: int | None = None,
) -> str:
    if fmt == "json":
        # JSON escapes control characters itself and keeps the data as the host gave it.
        return json.dumps(report.to_dict(), indent=2) + "\n"
    report = sanitized(report)
    if fmt == "junit":
        from provisioner.report.junit import render_junit

        return render_junit(report, fail_on=fail_on)
    if fmt == "prometheus":
        from provisioner.report.prometheus import render_prometheus

        return render_prometheus(report)
    if fmt == "table":
        from provisioner.report.table import render_drift, render_table

        return (render_drift if drift else render_table)(report, color=color, width=width)
    raise InputError(f"--format: unknown format {fmt!r} (formats: {', '.join(FORMATS)})")


def _refuse_non_regular(path: Path, target: Path) -> None:
    """A report only ever replaces a regular file: never a symlink (it may point anywhere), a device
    node, a FIFO or a socket, which root would otherwise replace with a file."""
    try:
        st = target.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(f"--output {path}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise InputError(f"--output {path}: is a symbolic link (give the file it points to)")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"--output {path}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"--output {path}: is not a regular file (a device, FIFO or socket)")


def _umask() -> int:
    """The process's umask, read without changing it (other threads may be creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_output(text: str, path: Path) -> None:
    """Write next to the target, then rename over it. A new file gets the user's umask; an existing
    file keeps its mode."""
    target = path.expanduser()
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"--output {path}: directory {directory} does not exist")
    _refuse_non_regular(path, target)
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"--output {path}: cannot write: {exc.strerror}") from exc


def check_output_path(path: Path) -> None:
    """Fail before any host is probed when the report could not be written anyway."""
    target = path.expanduser()
    _refuse_non_regular(path, target)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"--output {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise InputError(f"--output {path}: directory {directory} is not writable")
    # Some places refuse new files even to root (/proc, a read-only mount): try, before any host is probed.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as exc:
        raise InputError(f"--output {path}: cannot create a file in {directory}: {exc.strerror}") from exc
    os.close(fd)
    os.unlink(probe)
