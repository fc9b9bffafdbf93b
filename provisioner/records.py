"""Run records: one directory per run (events, stats, summary), kept for audit and `--retry-failed`.

Records live under `$GPUPROV_HOME/runs/` (default `~/.gpuprov/runs/`), named `<UTC time>-<verb>`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from provisioner import __version__


def home() -> Path:
    return Path(os.environ.get("GPUPROV_HOME") or Path.home() / ".gpuprov")


def runs_dir() -> Path:
    return home() / "runs"


# Records hold host facts, inventory variables and Ansible's output: readable by their owner only.
DIR_MODE = 0o700
FILE_MODE = 0o600


def new_record(verb: str) -> Path:
    """A fresh, unique run record directory (0700, under a 0700 runs directory).

    Its record.json says which verb and which gpuprov version made it, so a record read later (for
    `--retry-failed`, `--resume` or an audit) is never mistaken for another version's.
    """
    base = runs_dir()
    base.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(base, DIR_MODE)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        path = base / (f"{stamp}-{verb}" if n == 0 else f"{stamp}-{verb}-{n}")
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(path, DIR_MODE)
        write_json(path / "record.json", {"verb": verb, "gpuprov_version": __version__, "started_at": stamp})
        return path
    raise RuntimeError(f"cannot create a run record under {base}")


def write_json(path: Path, doc: Any) -> None:
    """Write atomically: a crash never leaves a half-written record file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    os.chmod(tmp, FILE_MODE)
    tmp.replace(path)


def make_private(root: Path) -> None:
    """Owner-only modes on everything under a record (what ansible-runner wrote follows the umask)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, DIR_MODE)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, FILE_MODE)


def latest(verb: str, where: str | None = None) -> Path | None:
    """The newest record of `verb` whose summary says it ran against `where` (an inventory path)."""
    base = runs_dir()
    if not base.is_dir():
        return None
    for path in sorted(base.glob(f"*-{verb}*"), reverse=True):
        summary = path / "summary.json"
        if not summary.is_file():
            continue
        try:
            doc = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        if where is None or doc.get("inventory") == where:
            return path
    return None
