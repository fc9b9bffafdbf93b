"""The molecule scenarios under molecule/ (each: its own lab up, converge, idempotence, verify, lab down).

Every scenario directory with a molecule.yml is run with `molecule test`, under a lab name unique to this
run (GPUPROV_MOLECULE_LAB, which the scenarios read), so that runs on a shared machine never meet. The lab
is taken down afterwards even when molecule stops half way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from labkit import REPO, gpuprov, require_lab, unique_lab_name

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCENARIOS = sorted(
    p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml") if p.parent.name != "shared"
)


def test_scenarios_found() -> None:
    assert "gpu_node" in SCENARIOS, SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: str) -> None:
    require_lab()
    lab = unique_lab_name(f"m-{scenario.replace('_', '-')[:8]}-")  # lab names are at most 24 characters
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "GPUPROV_MOLECULE_LAB": lab,
        "ANSIBLE_NOCOLOR": "1",
        "PY_COLORS": "0",
    }
    try:
        res = subprocess.run(
            [str(Path(bin_dir) / "molecule"), "test", "-s", scenario],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=3000,
            check=False,
        )
    finally:
        gpuprov("lab", "down", "--lab", lab, timeout=600)
    out = re.sub(r"\x1b\[[0-9;]*m", "", res.stdout + res.stderr)
    assert res.returncode == 0, f"molecule test -s {scenario} failed (rc {res.returncode}):\n{out[-8000:]}"
    # Every scenario proves idempotence and checks state: both steps must have run and passed.
    for step in ("converge", "idempotence", "verify"):
        assert f"{step}: Executed: Successful" in out, f"{scenario}: no successful {step} step\n{out[-4000:]}"
