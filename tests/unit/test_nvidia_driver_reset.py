"""The driver's reset refuses while a process holds a GPU, and names it, but not for the GPU services'
own daemons, which it stops next (roles/nvidia_driver/tasks/reset.yml): on a real host nvidia-persistenced,
the fabric manager and DCGM's host engine keep /dev/nvidia* open. The role's own shell runs here in a
private mount namespace whose /dev holds stand-in device files, with a stand-in systemctl on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from provisioner.content import ROLES_DIR

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a private /dev",
)


def _holder_script() -> str:
    tasks = yaml.safe_load((ROLES_DIR / "nvidia_driver" / "tasks" / "reset.yml").read_text())
    block = next(t for t in tasks if "block" in t)["block"]
    task = next(t for t in block if t["name"] == "Find the processes that hold a GPU")
    services = yaml.safe_load((ROLES_DIR / "nvidia_driver" / "vars" / "main.yml").read_text())[
        "__nvidia_driver_reset_services"
    ]
    return jinja2.Template(task["ansible.builtin.shell"]).render(__nvidia_driver_reset_services=services)


def _holders(tmp_path: Path, service_is_holder: bool) -> list[str]:
    """Two processes hold /dev/nvidia0: one is a service's main process (when `service_is_holder`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        '#!/bin/sh\ncase "$*" in *MainPID*) cat "$SERVICE_PID_FILE"; echo; echo 0;; esac\n'
    )
    (bin_dir / "systemctl").chmod(0o755)
    (tmp_path / "role.sh").write_text(_holder_script())
    inner = f"""
set -e
mount -t tmpfs none /dev
touch /dev/nvidia0 /dev/nvidiactl
sleep 30 </dev/nvidia0 & service=$!
sleep 30 </dev/nvidiactl & workload=$!
echo {"$service" if service_is_holder else "0"} > "$SERVICE_PID_FILE"
bash {tmp_path / "role.sh"} | sed "s/^$service /SERVICE /; s/^$workload /WORKLOAD /"
kill $service $workload
"""
    env = {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "SERVICE_PID_FILE": str(tmp_path / "pid")}
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", inner],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_a_workload_holding_a_gpu_is_named_and_a_gpu_service_is_not(tmp_path: Path) -> None:
    assert _holders(tmp_path, service_is_holder=True) == ["WORKLOAD sleep"]


def test_without_the_services_every_holder_is_named(tmp_path: Path) -> None:
    assert sorted(_holders(tmp_path, service_is_holder=False)) == ["SERVICE sleep", "WORKLOAD sleep"]
