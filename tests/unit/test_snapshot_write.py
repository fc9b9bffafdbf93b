"""What `gpuprov snapshot` writes: owner-only modes whatever the umask, and never through a link.

A snapshot holds container engine configs (registry credentials), kernel logs and package lists.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.errors import GpuprovError
from provisioner.probes.base import ProbeResult
from provisioner.verification import write_host_snapshot

REPO = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()  # the directory `snapshot --local` writes


def snapshot_local(out: Path, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", "snapshot", "--local", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=lambda: os.umask(umask),
    )


def modes(root: Path) -> dict[str, int]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def one_result() -> dict[str, ProbeResult]:
    return {"os-release": ProbeResult("os-release", 0, 'ID=debian\nVERSION_ID="12"\n', "", 0.01)}


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_a_snapshot_is_owner_only_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    out = tmp_path / "new" / "snap"
    res = snapshot_local(out, umask)
    assert res.returncode in (0, 1), res.stderr
    found = modes(tmp_path / "new")
    assert f"snap/{HOST}/meta.json" in found and len(found) > 3
    for rel, mode in found.items():
        want = 0o700 if (tmp_path / "new" / rel).is_dir() else 0o600
        assert mode == want, f"{rel}: {oct(mode)}"


def test_a_replaced_host_directory_is_owner_only_and_leaves_nothing_behind(tmp_path: Path) -> None:
    old_umask = os.umask(0)
    try:
        write_host_snapshot(tmp_path, "h1", one_result(), None, "2026-12-02T15:03:54Z")
        write_host_snapshot(tmp_path, "h1", one_result(), None, "2026-12-02T15:04:54Z")
    finally:
        os.umask(old_umask)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h1"]
    assert modes(tmp_path) == {"h1": 0o700, "h1/meta.json": 0o600, "h1/os-release": 0o600}
    assert "15:04:54" in (tmp_path / "h1/meta.json").read_text()


@pytest.mark.parametrize("target", ["snapshot", "dangling"])
def test_a_symlinked_host_directory_is_refused_before_probing(tmp_path: Path, target: str) -> None:
    out = tmp_path / "snap"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    if target == "snapshot":
        elsewhere.mkdir()
        (elsewhere / "meta.json").write_text('{"host": "x", "probes": {}}\n')
    (out / HOST).symlink_to(elsewhere, target_is_directory=True)
    res = snapshot_local(out)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2, res.stdout + res.stderr
    assert str(out / HOST) in res.stderr and "symbolic link" in res.stderr
    assert "probes →" not in res.stdout  # no host was probed
    assert sorted(p.name for p in out.iterdir()) == [HOST] and (out / HOST).is_symlink()
    if target == "snapshot":
        assert sorted(p.name for p in elsewhere.iterdir()) == ["meta.json"]


def test_a_link_that_appears_while_probing_is_not_written_through(tmp_path: Path) -> None:
    """The destination was checked before probing; a link put there since is refused at writing."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "meta.json").write_text("{}")
    out = tmp_path / "snap"
    out.mkdir()
    (out / "h1").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(GpuprovError, match="symbolic link"):
        write_host_snapshot(out, "h1", one_result(), None, "2026-12-02T15:03:54Z")
    assert sorted(p.name for p in out.iterdir()) == ["h1"] and (out / "h1").is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["meta.json"]
