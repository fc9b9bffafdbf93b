"""`gpuprov bootstrap` refuses bad input with exit 2 before any host is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Addresses from TEST-NET-1: if anything tried to reach them, the run would hang or fail, not pass.
INVENTORY = """
all:
  children:
    k8s_cluster:
      children:
        kube_control_plane:
          hosts:
            cp1: {ansible_host: 192.0.2.10}
        gpu_nodes:
          hosts:
            gpu1: {ansible_host: 192.0.2.11}
"""


def gpuprov(home: Path, *args: str, stdin: str | None = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUPROV_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=60,
    )


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    (tmp_path / "inv" / "group_vars").mkdir(parents=True)
    path = tmp_path / "inv" / "hosts.yml"
    path.write_text(INVENTORY)
    return path


def assert_untouched(home: Path) -> None:
    runs = home / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a run record means hosts were worked on"


def test_inventory_required(tmp_path: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "--yes")
    assert r.returncode == 2
    assert "-i/--inventory is required" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_inventory_file(tmp_path: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "-i", str(tmp_path / "nope.yml"), "--yes")
    assert r.returncode == 2
    assert "nope.yml: inventory not found" in r.stderr


def test_unknown_stage(tmp_path: Path, inv: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), "--only", "driver", "--yes")
    assert r.returncode == 2
    assert "--only: unknown stage driver" in r.stderr
    assert_untouched(tmp_path)


def test_bad_setting_names_file_and_key(tmp_path: Path, inv: Path) -> None:
    (inv.parent / "group_vars" / "all.yml").write_text("gpuprov_reboot_allowed: perhaps\n")
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), "--yes")
    assert r.returncode == 2
    assert "group_vars/all.yml: gpuprov_reboot_allowed: expected a boolean" in r.stderr
    assert_untouched(tmp_path)


def test_unknown_global_setting(tmp_path: Path, inv: Path) -> None:
    (inv.parent / "group_vars" / "gpu_nodes.yml").write_text("gpuprov_mirror: http://mirror.example\n")
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), "--yes")
    assert r.returncode == 2
    assert "gpu_nodes.yml: gpuprov_mirror: unknown setting" in r.stderr


def test_limit_matching_nothing(tmp_path: Path, inv: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), "--limit", "gpu9", "--yes")
    assert r.returncode == 2
    assert "no host selected by --limit gpu9" in r.stderr


def test_needs_yes_without_terminal(tmp_path: Path, inv: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv))
    assert r.returncode == 2
    assert "without --yes" in r.stderr
    assert_untouched(tmp_path)


def test_retry_failed_without_earlier_run(tmp_path: Path, inv: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), "--retry-failed", "--yes")
    assert r.returncode == 2
    assert "no earlier bootstrap run recorded" in r.stderr


def test_retry_failed_nothing_left(tmp_path: Path, inv: Path) -> None:
    record = tmp_path / "runs" / "20260101T000000Z-bootstrap"
    record.mkdir(parents=True)
    summary = {"inventory": str(inv.resolve()), "hosts": [{"host": "cp1", "status": "done"}]}
    (record / "summary.json").write_text(json.dumps(summary))
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), "--retry-failed", "--yes")
    assert r.returncode == 0
    assert "nothing to retry" in r.stderr


def test_help_lists_every_verb_fast(tmp_path: Path) -> None:
    r = gpuprov(tmp_path, "--help")
    assert r.returncode == 0
    for verb in ("bootstrap", "verify", "check", "snapshot", "lab", "stages"):
        assert verb in r.stdout
    # --help must not import Ansible (it would make every invocation slow)
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from provisioner import cli; print('ansible' in sys.modules)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "False"
