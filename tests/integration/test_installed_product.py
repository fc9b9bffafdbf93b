"""The product as a user installs it: a non-editable wheel of gpuprov alone, in a clean virtualenv outside
the source tree, runs verify, check, snapshot, bootstrap (check mode) and upgrade-driver (dry run) against
the session lab. The wheel carries the roles, playbooks and ansible.cfg; it has no `gpuprov lab` and
cannot import the lab.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from labkit import REPO, Lab

pytestmark = pytest.mark.lab
LAB_PHASE = "bootstrapped"  # see tests/conftest.py


class Installed:
    def __init__(self, venv: Path, home: Path) -> None:
        self.venv = venv
        self.home = home

    def env(self) -> dict[str, str]:
        # Nothing of the source tree or of the test venv leaks in: no PYTHONPATH, no roles path.
        leaks = ("ANSIBLE_", "PYTHON", "VIRTUAL_ENV")
        keep = {k: v for k, v in os.environ.items() if not k.startswith(leaks)}
        path = os.pathsep.join([str(self.venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin"])
        return {**keep, "PATH": path, "GPUPROV_HOME": str(self.home)}

    def run(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "gpuprov"), *args],
            capture_output=True, text=True, timeout=timeout, cwd=self.home, env=self.env(), check=False,
        )  # fmt: skip

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "python"), "-c", code],
            capture_output=True, text=True, cwd=self.home, env=self.env(), check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, bootstrapped) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    assert not root.resolve().is_relative_to(REPO)
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(REPO)], check=True, timeout=600)
    (wheel,) = wheels.glob("gpuprov-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    vpip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*vpip, "install", str(wheel)], check=True, timeout=900)
    home = root / "home"
    home.mkdir()
    return Installed(venv, home)


def test_the_wheel_carries_the_ansible_content_and_no_lab(installed: Installed) -> None:
    res = installed.python(
        "import json, provisioner, provisioner.content as c\n"
        "paths = [provisioner.__file__, c.ROLES_DIR, c.PLAYBOOKS_DIR, c.ANSIBLE_CFG]\n"
        "print(json.dumps([str(p) for p in paths]))"
    )
    assert res.returncode == 0, res.stderr
    module, roles, playbooks, cfg = (Path(p) for p in json.loads(res.stdout))
    assert module.is_relative_to(installed.venv) and not module.is_relative_to(REPO)
    for path in (roles, playbooks, cfg):
        assert path.is_relative_to(installed.venv), path
    assert (roles / "nvidia_driver" / "meta" / "argument_specs.yml").is_file()
    assert (playbooks / "site.yml").is_file()
    assert installed.python("import gpuprov_lab").returncode != 0
    lab = installed.run("lab", "--help")
    assert lab.returncode == 2 and "No such command 'lab'" in lab.stderr
    assert installed.run("--version").stdout.strip().startswith("gpuprov ")


def test_verify_check_and_snapshot_from_the_installed_wheel(installed: Installed, bootstrapped) -> None:
    lab: Lab = bootstrapped.lab
    res = installed.run("verify", "-i", str(lab.inventory), "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    hosts = {h["host"]: h for h in json.loads(res.stdout)["hosts"]}
    assert set(hosts) == set(lab.hosts)
    assert all(not h.get("error") for h in hosts.values()), hosts

    policy = installed.home / "policy.yml"
    policy.write_text("groups:\n  gpu_nodes:\n    gpu.present: true\n")
    res = installed.run("check", "-i", str(lab.inventory), "--policy", str(policy), "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    checked = {h["host"]: h for h in json.loads(res.stdout)["hosts"]}
    assert set(checked) == set(lab.hosts)
    for name in (n for n in lab.hosts if n.startswith("gpu")):
        present = [c["status"] for c in checked[name]["checks"] if c["id"] == "gpu.present"]
        assert present == ["pass"], (name, present)

    out = installed.home / "bundle"
    res = installed.run("snapshot", "-i", str(lab.inventory), "-o", str(out), "--limit", "gpu1")
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "gpu1" / "meta.json").read_text())
    assert meta["collector"] == installed.run("--version").stdout.strip()


def test_bootstrap_check_and_upgrade_dry_run_from_the_installed_wheel(
    installed: Installed, bootstrapped
) -> None:
    lab: Lab = bootstrapped.lab
    res = installed.run(
        "bootstrap", "-i", str(lab.inventory), "--check", "--yes", "--limit", "gpu1",
        "--only", "preflight,nvidia_driver", "--format", "json", timeout=1200,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    summary = json.loads(res.stdout)
    assert [h["host"] for h in summary["hosts"]] == ["gpu1"]
    assert summary["hosts"][0]["status"] == "done", summary
    (record,) = (installed.home / "runs").glob("*-bootstrap*")
    made_by = json.loads((record / "record.json").read_text())
    assert (made_by["verb"], "gpuprov " + made_by["gpuprov_version"]) == (
        "bootstrap",
        installed.run("--version").stdout.strip(),
    )

    # The version gpu1 is pinned to (the inventory's, else the role's default): a plan to stay there.
    version = _host_var(lab.inventory, "gpu1", "nvidia_driver_version") or _role_default_version()
    res = installed.run(
        "upgrade-driver", "-i", str(lab.inventory), "--limit", "gpu1", "--to", version, "--dry-run"
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"target {version}" in res.stdout and "gpu1" in res.stdout, res.stdout


def _host_var(inventory: Path, host: str, key: str) -> str | None:
    import yaml

    def walk(node: object) -> str | None:
        if isinstance(node, dict):
            hosts = node.get("hosts")
            if isinstance(hosts, dict) and isinstance(hosts.get(host), dict) and key in hosts[host]:
                return str(hosts[host][key])
            for value in node.values():
                found = walk(value)
                if found:
                    return found
        return None

    return walk(yaml.safe_load(inventory.read_text()))


def _role_default_version() -> str:
    import yaml

    defaults = yaml.safe_load((REPO / "roles" / "nvidia_driver" / "defaults" / "main.yml").read_text())
    return str(defaults["nvidia_driver_version"])
