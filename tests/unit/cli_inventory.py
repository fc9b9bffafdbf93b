"""What the CLI tests share: a test inventory, `python -m provisioner` as a child process, and the check
that no run was recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Addresses from TEST-NET-1: if anything tried to reach them, the run would hang or fail, not pass.
_HEAD = """
all:
  children:
    k8s_cluster:
      children:
        kube_control_plane:
          hosts:
            cp1: {ansible_host: 192.0.2.10}
        gpu_nodes:
"""


def inventory(*gpu_hosts: str, gpu_vars: tuple[str, ...] = ()) -> str:
    """A hosts.yml: one control plane, and the gpu_nodes group with these host lines (and group vars)."""
    text = _HEAD
    if gpu_vars:
        text += "          vars:\n" + "".join(f"            {v}\n" for v in gpu_vars)
    return text + "          hosts:\n" + "".join(f"            {h}\n" for h in gpu_hosts)


def write_inventory(tmp_path: Path, text: str, *, group_vars: bool = False) -> Path:
    (tmp_path / "inv").mkdir()
    if group_vars:
        (tmp_path / "inv" / "group_vars").mkdir()
    path = tmp_path / "inv" / "hosts.yml"
    path.write_text(text)
    return path


def gpuprov(home: Path, *args: str, **run: Any) -> subprocess.CompletedProcess[str]:
    """`python -m provisioner ARGS` with GPUPROV_HOME=home, text captured; `run` goes to subprocess.run."""
    env = dict(os.environ, GPUPROV_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args], capture_output=True, text=True, env=env, **run
    )


def assert_untouched(home: Path) -> None:
    runs = home / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a run record means hosts were worked on"
