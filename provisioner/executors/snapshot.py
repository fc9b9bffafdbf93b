"""A recorded snapshot as an executor: replays one host directory (docs: host-snapshot contract), its
files and its meta.json read as the untrusted data they are."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provisioner.errors import GpuprovError, InputError
from provisioner.executors.base import CommandResult, as_text, recorded_seconds, to_shell

# A snapshot is untrusted data: each file is read only when it is a regular file directly in the host's
# directory (never through a symlink, never a device or FIFO), by a plain name, and only up to a size.
MAX_SNAPSHOT_FILE = 16 * 1024 * 1024
MAX_SNAPSHOT_META = 4 * 1024 * 1024
_SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SnapshotFileRefused(GpuprovError):
    """A snapshot file that is not read (a link, a device, a FIFO, a bad name, too big)."""


def read_snapshot_file(host_dir: Path, name: str, limit: int = MAX_SNAPSHOT_FILE) -> bytes | None:
    """The bytes of one file of a host's snapshot directory; None when there is no such file."""
    if not _SNAPSHOT_NAME.fullmatch(name):
        raise SnapshotFileRefused(f"{name!r} is not a plain file name")
    path = host_dir / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise SnapshotFileRefused(f"{path} is a symbolic link") from exc
        raise SnapshotFileRefused(f"{path}: {exc.strerror}") from exc
    # Checked on the descriptor before it becomes a file object, which a directory cannot be.
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SnapshotFileRefused(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SnapshotFileRefused(f"{path} is larger than {limit // (1024 * 1024)} MiB")
    return data


MAX_SNAPSHOT_HOST_NAME = 255


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def checked_snapshot_meta(meta_path: Path, doc: object) -> dict[str, Any]:
    """meta.json as replay reads it, every key it uses of the type it must have.

    A value of another type must not be read as "absent": a `probes` that is not an object, or an
    entry that is not one, would turn every probe into "not collected" and every check into a skip,
    and a host judged on nothing into a healthy one. So it is bad input, naming the file and key.
    """

    def bad(key: str, why: str) -> InputError:
        return InputError(f"{meta_path}: {key}: {why}")

    if not isinstance(doc, dict):
        raise InputError(f"{meta_path}: snapshot metadata must be a JSON object, not {_json_kind(doc)}")
    for key in ("host", "collected_at", "collector", "error"):
        if key in doc and not isinstance(doc[key], str):
            raise bad(key, f"must be a string, not {_json_kind(doc[key])}")
    if "host" in doc and not 0 < len(doc["host"]) <= MAX_SNAPSHOT_HOST_NAME:
        raise bad("host", f"must be 1 to {MAX_SNAPSHOT_HOST_NAME} characters")
    probes = doc.get("probes")
    if not isinstance(probes, dict):
        what = f", not {_json_kind(probes)}" if "probes" in doc else " (there is none)"
        raise InputError(f"{meta_path}: snapshot metadata must have a 'probes' object{what}")
    for name, entry in probes.items():
        key = f"probes[{name[:64]!a}]"
        if not isinstance(entry, dict):
            raise bad(key, f"must be an object, not {_json_kind(entry)}")
        rc = entry.get("rc")
        if isinstance(rc, bool) or not isinstance(rc, int) or not 0 <= rc <= 255:
            raise bad(f"{key}.rc", "must be the probe's exit status, a whole number 0-255")
        for text_key in ("command", "stderr"):
            if text_key in entry and not isinstance(entry[text_key], str):
                raise bad(f"{key}.{text_key}", f"must be a string, not {_json_kind(entry[text_key])}")
    not_collected = doc.get("not_collected")
    if not_collected is not None and not (
        isinstance(not_collected, dict) and all(isinstance(v, str) for v in not_collected.values())
    ):
        raise bad("not_collected", "must be an object of strings")
    return doc


class SnapshotExecutor:
    """Replays one host directory of a snapshot (docs: host-snapshot contract).

    Probe collection reads the recorded files directly (`recorded`); `run` answers a command only
    when it is exactly a recorded probe's command, and otherwise says it was not recorded (rc 127),
    because a snapshot cannot run anything.
    """

    def __init__(self, host_dir: Path) -> None:
        self.host_dir = host_dir
        meta_path = host_dir / "meta.json"
        try:
            raw = read_snapshot_file(host_dir, "meta.json", MAX_SNAPSHOT_META)
        except SnapshotFileRefused as exc:
            raise InputError(f"{meta_path}: refused: {exc}") from exc
        if raw is None:
            raise InputError(f"{host_dir}: not a snapshot host directory (no meta.json)")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise InputError(f"{meta_path}: unreadable snapshot metadata: {exc}") from exc
        except RecursionError:
            raise InputError(f"{meta_path}: unreadable snapshot metadata: nested too deeply") from None
        self.meta: dict[str, Any] = checked_snapshot_meta(meta_path, doc)
        self.name = str(self.meta.get("host") or host_dir.name)

    @property
    def host_error(self) -> str | None:
        """Why the collector could not reach this host, when it could not."""
        err = self.meta.get("error")
        return str(err) if err else None

    def recorded(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """(meta entry, file text) for one probe; either may be None when not collected.
        SnapshotFileRefused when the file is there but may not be read."""
        entry = self.meta.get("probes", {}).get(name)
        data = read_snapshot_file(self.host_dir, name)
        text = None if data is None else as_text(data)
        return (entry if isinstance(entry, dict) else None), text

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        wanted = to_shell(command).strip()
        for name, entry in self.meta.get("probes", {}).items():
            if isinstance(entry, dict) and str(entry.get("command", "")).strip() == wanted:
                try:
                    _, text = self.recorded(name)
                except SnapshotFileRefused as exc:
                    return CommandResult(126, "", f"refused in snapshot: {exc}", 0.0)
                rc = entry.get("rc", 0)
                return CommandResult(
                    rc if isinstance(rc, int) and not isinstance(rc, bool) else 1,
                    text or "",
                    str(entry.get("stderr", "")),
                    recorded_seconds(entry.get("duration_s")),
                )
        return CommandResult(127, "", f"not recorded in snapshot {self.host_dir}", 0.0)

    def close(self) -> None:
        return None
