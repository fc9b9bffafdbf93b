"""The host's ledger (roles/host_ledger/files/gpuprov_ledger.py), run as the roles run it, against a
scratch tree and stand-ins for dpkg-query, dpkg and apt-get that answer from a JSON file: what a stage
added is what reset takes back, files come back as they were, someone else's change is left alone, a
later stage blocks an earlier one, and the proof holds once everything is back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LEDGER = REPO / "roles" / "host_ledger" / "files" / "gpuprov_ledger.py"

# The stand-ins: the installed packages and holds live in $FAKE_DPKG (JSON).
DPKG_QUERY = """#!/usr/bin/env python3
import json, os
s = json.load(open(os.environ["FAKE_DPKG"]))
for name, version in sorted(s["packages"].items()):
    print(f"{name}\\t{version}\\t{'hi' if name in s['holds'] else 'ii'} ")
print("gone-package\\t1.0\\trc ")
"""
DPKG = """#!/usr/bin/env python3
import json, os
s = json.load(open(os.environ["FAKE_DPKG"]))
for name in sorted(s["packages"]):
    print(f"{name}\\t\\t\\t{'hold' if name in s['holds'] else 'install'}")
"""
APT_GET = """#!/usr/bin/env python3
import json, os, sys
s = json.load(open(os.environ["FAKE_DPKG"]))
names = [a for a in sys.argv[1:] if not a.startswith("-") and a not in ("purge", "Debug::NoLocking=1")]
for n in names + [d for n in names for d in s.get("rdeps", {}).get(n, [])]:
    print(f"Purg {n} [1.0]")
"""


class Host:
    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "host"
        self.root.mkdir()
        self.ledger = tmp / "var-lib-gpuprov" / "ledger"  # its parent is not there before either
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for name, text in (("dpkg-query", DPKG_QUERY), ("dpkg", DPKG), ("apt-get", APT_GET)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        self.state_file = tmp / "dpkg.json"
        self.state = {"packages": {"base-files": "12.4", "gpg": "2.2"}, "holds": [], "rdeps": {}}
        self.save()
        self.env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DPKG=str(self.state_file))

    def save(self) -> None:
        self.state_file.write_text(json.dumps(self.state))

    def p(self, rel: str) -> Path:
        return self.root / rel

    def run(self, *args: str, ok: bool = True) -> dict | subprocess.CompletedProcess:
        res = subprocess.run(
            [sys.executable, str(LEDGER), "--dir", str(self.ledger), *args],
            capture_output=True,
            text=True,
            env=self.env,
            check=False,
        )
        if not ok:
            return res
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def start(self, stage: str) -> dict:
        return self.run(
            "start",
            stage,
            "--path",
            str(self.p("etc/docker")),
            "--path",
            str(self.p("etc/fstab")),
            "--path",
            str(self.p("etc/containerd")),
            "--state-dir",
            str(self.p("var/lib/docker")),
        )


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(tmp_path)
    (h.p("etc")).mkdir()
    h.p("etc/fstab").write_text("/dev/sda2 none swap sw 0 0\n")
    h.p("etc/containerd").mkdir()
    h.p("etc/containerd/config.toml").write_text("version = 2\n")  # the site's own
    return h


def run_docker_stage(host: Host) -> None:
    """What a docker stage does: packages and a hold, a new directory and file, an edited file, data."""
    host.state["packages"].update({"docker.io": "26.1", "containerd": "1.7"})
    host.state["holds"].append("docker.io")
    host.save()
    host.p("etc/docker").mkdir()
    host.p("etc/docker/daemon.json").write_text('{"runtimes": {}}\n')
    host.p("etc/fstab").write_text("# /dev/sda2 none swap sw 0 0  # swap off (gpuprov)\n")
    host.p("var/lib/docker").mkdir(parents=True)
    host.p("var/lib/docker/image.tar").write_text("layers")
    host.p("etc/containerd/certs.d/mirror").mkdir(parents=True)  # a directory made in a watched one
    host.p("etc/containerd/certs.d/mirror/hosts.toml").write_text("server = 'x'\n")


def take_back(host: Host, plan: dict) -> None:
    """What the host_ledger role's undo does with a plan."""
    for name in plan["packages"]:
        host.state["packages"].pop(name)
    host.state["holds"] = [h for h in host.state["holds"] if h not in plan["holds"]]
    host.save()
    for item in plan["restore"]:
        Path(item["path"]).write_bytes(Path(item["kept"]).read_bytes())
    for path in plan["remove"]:
        Path(path).unlink()
    for path in plan["wipe"]:
        subprocess.run(["rm", "-rf", path], check=True)
    for path in plan["dirs"]:
        Path(path).rmdir()


def test_reset_takes_back_exactly_what_the_stage_added_and_the_proof_holds(host: Host) -> None:
    assert host.start("docker")["first"] is True
    run_docker_stage(host)
    assert host.run("end", "docker")["added_packages"] == ["containerd", "docker.io"]

    plan = host.run("plan", "docker")
    assert plan["recorded"] is True
    assert plan["packages"] == ["containerd", "docker.io"] and plan["holds"] == ["docker.io"]
    assert plan["collateral"] == [] and plan["blocked_by"] == [] and plan["foreign"] == []
    assert plan["remove"] == [
        str(host.p("etc/containerd/certs.d/mirror/hosts.toml")),
        str(host.p("etc/docker/daemon.json")),
    ]
    assert [r["path"] for r in plan["restore"]] == [str(host.p("etc/fstab"))]
    assert Path(plan["restore"][0]["kept"]).read_text() == "/dev/sda2 none swap sw 0 0\n"
    assert plan["wipe"] == [str(host.p("var/lib/docker"))]
    assert plan["dirs"] == [  # deepest first
        str(host.p("etc/containerd/certs.d/mirror")),
        str(host.p("etc/containerd/certs.d")),
        str(host.p("etc/docker")),
    ]
    assert plan["existed"][str(host.p("etc/docker"))] is False

    proof = host.run("proof")
    assert proof["clean"] is False and proof["stages"] == ["docker"]
    assert "package docker.io installed since" in proof["differences"]

    take_back(host, plan)
    after = host.run("plan", "docker")
    assert (after["packages"], after["holds"], after["restore"], after["remove"], after["wipe"]) == (
        [],
        [],
        [],
        [],
        [],
    )
    assert host.run("forget", "docker")["left"] == []
    proof = host.run("proof", "--drop")
    assert proof == {"recorded": True, "clean": True, "differences": [], "stages": []}
    assert not host.ledger.exists() and not host.ledger.parent.exists()  # nothing of gpuprov's is left
    assert host.p("etc/fstab").read_text() == "/dev/sda2 none swap sw 0 0\n"
    # A second reset finds nothing recorded and has nothing to do.
    again = host.run("plan", "docker")
    assert again["recorded"] is False and again["packages"] == []


def test_a_file_that_was_there_before_and_a_purge_took_comes_back(host: Host) -> None:
    """The site's own containerd config.toml, untouched by the stage, goes with the package's purge
    (dpkg took it as the package's conffile): the plan read after the purge puts it back."""
    host.start("docker")
    run_docker_stage(host)
    host.run("end", "docker")
    assert str(host.p("etc/containerd/config.toml")) not in [
        r["path"] for r in host.run("plan", "docker")["restore"]
    ]
    host.p("etc/containerd/config.toml").unlink()  # what the purge did
    plan = host.run("plan", "docker")
    (item,) = [r for r in plan["restore"] if r["path"].endswith("config.toml")]
    assert Path(item["kept"]).read_text() == "version = 2\n" and plan["foreign"] == []


def test_a_later_stages_file_gone_with_its_reset_is_not_brought_back(host: Host) -> None:
    """A rerun of docker sees kubernetes' apt pin (written by gpuprov after docker's first run); once
    kubernetes' reset removed it, docker's reset must not put it back as if it were the host's own."""
    host.start("docker")
    run_docker_stage(host)
    host.run("end", "docker")
    pin = host.p("etc/containerd/kubernetes.pref")  # stands for any watched file a later stage writes
    host.run("start", "kubernetes", "--path", str(host.p("etc/containerd")))
    pin.write_text("Package: kubelet\n")
    host.run("end", "kubernetes")
    host.start("docker")  # the rerun: docker sees the pin for the first time
    host.run("end", "docker")
    pin.unlink()  # kubernetes' reset
    plan = host.run("plan", "docker")
    assert str(pin) not in [r["path"] for r in plan["restore"]], plan["restore"]


def test_a_file_someone_else_changed_is_reported_and_left(host: Host) -> None:
    host.start("docker")
    run_docker_stage(host)
    host.run("end", "docker")
    host.p("etc/docker/daemon.json").write_text('{"log-driver": "journald"}\n')
    host.p("etc/docker/site.json").write_text("{}\n")
    plan = host.run("plan", "docker")
    assert plan["remove"] == [str(host.p("etc/containerd/certs.d/mirror/hosts.toml"))]
    foreign = {Path(f["path"]).name: f["why"] for f in plan["foreign"]}
    assert foreign == {
        "daemon.json": "changed by someone else since gpuprov wrote it",
        "site.json": "not gpuprov's: appeared after the stage ran",
    }


def test_a_rerun_keeps_the_first_original_and_knows_every_content_gpuprov_left(host: Host) -> None:
    host.start("docker")
    run_docker_stage(host)
    host.run("end", "docker")
    assert host.start("docker")["first"] is False
    host.p("etc/docker/daemon.json").write_text('{"runtimes": {"nvidia": {}}}\n')
    host.state["packages"]["docker-cli"] = "26.1"  # the rerun installs one more
    host.save()
    assert host.run("end", "docker")["added_packages"] == ["docker-cli"]
    host.p("etc/docker/daemon.json").write_text('{"runtimes": {}}\n')  # an earlier content of gpuprov's
    plan = host.run("plan", "docker")
    assert plan["foreign"] == [] and str(host.p("etc/docker/daemon.json")) in plan["remove"]
    assert plan["packages"] == ["containerd", "docker-cli", "docker.io"]
    assert Path(plan["restore"][0]["kept"]).read_text() == "/dev/sda2 none swap sw 0 0\n"


def test_a_run_that_failed_half_way_counts_from_its_own_start(host: Host) -> None:
    host.start("docker")
    host.state["packages"]["containerd"] = "1.7"  # installed, then the run failed: no end
    host.save()
    host.start("docker")
    host.state["packages"]["docker.io"] = "26.1"
    host.save()
    assert host.run("end", "docker")["added_packages"] == ["containerd", "docker.io"]


def test_a_later_stage_blocks_and_collateral_is_named(host: Host) -> None:
    host.start("docker")
    run_docker_stage(host)
    host.run("end", "docker")
    host.run("start", "kubernetes", "--path", str(host.p("etc/kubernetes")))
    host.run("end", "kubernetes")
    host.state["packages"]["site-agent"] = "1.0"
    host.state["rdeps"] = {"containerd": ["site-agent"]}
    host.save()
    plan = host.run("plan", "docker", "--later", "nvidia_container_toolkit", "--later", "kubernetes")
    assert plan["blocked_by"] == ["kubernetes"]
    assert plan["collateral"] == ["site-agent"]
    proof = host.run("proof", "--drop")
    assert proof["clean"] is False and host.ledger.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["start", "Docker;rm", "--path", "/etc/docker"],
        ["start", "docker", "--path", "etc/docker"],
        ["start", "docker", "--path", "/etc/../etc/docker"],
        ["plan", "../docker"],
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(host: Host, args: list[str]) -> None:
    res = host.run(*args, ok=False)
    assert res.returncode == 2, res.stderr
    assert "gpuprov-ledger:" in res.stderr
    assert not host.ledger.exists()


def test_an_unreadable_ledger_file_is_an_error_not_a_guess(host: Host) -> None:
    host.start("docker")
    (host.ledger / "stages" / "docker.json").write_text("{not json")
    res = host.run("plan", "docker", ok=False)
    assert res.returncode == 2 and "unreadable ledger file" in res.stderr
