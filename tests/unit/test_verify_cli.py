"""`gpuprov verify / check / snapshot` end to end: exit codes, bad input, snapshots, SSH fleets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import verify_fixtures as vf

from provisioner.checks import CHECK_IDS
from provisioner.probes import SNAPSHOT_PROBES
from provisioner.verification import snapshot_hosts, verify_hosts, verify_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from loopback_sshd import LoopbackFleet, available

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_POLICY = REPO / "docs" / "examples" / "policy.yml"
# Contract files a snapshot of any host has (the rest depend on what the host has).
ALWAYS = {
    "meta.json",
    "os-release",
    "uname-r",
    "host-facts.json",  # PCI functions, modules, driver, Secure Boot: the preflight role's own probe
    "kernel-log.txt",
    "packages.tsv",
    "service-processes.tsv",
}


def gpuprov(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    vf.write_snapshot(root, "gpu1", vf.h200_probes())
    bad = vf.h200_probes()
    bad["nvidia-smi-q.xml"] = (
        0,
        vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), "remapped_rows/remapped_row_pending", "Yes"),
        "",
    )
    vf.write_snapshot(root, "gpu2", bad)
    return root


def test_verify_snapshot_json_and_exit_code(snapshots: Path) -> None:
    good = gpuprov("verify", "--snapshot", str(snapshots / "gpu1"), "--format", "json")
    assert good.returncode == 0, good.stderr
    doc = json.loads(good.stdout)
    assert [c["id"] for c in doc["hosts"][0]["checks"]] == list(CHECK_IDS)
    both = gpuprov("verify", "--snapshot", str(snapshots), "--format", "json")
    assert both.returncode == 1
    hosts = {h["host"]: h for h in json.loads(both.stdout)["hosts"]}
    assert hosts["gpu1"]["status"] == "pass"
    remap = [c for c in hosts["gpu2"]["checks"] if c["id"] == "gpu.memory_remap"]
    assert [(c["status"], c["gpu"]) for c in remap] == [("warn", 0)]
    # A warning alone does not fail the run with --fail-on fail.
    assert (
        gpuprov("verify", "--snapshot", str(snapshots), "--fail-on", "fail", "--format", "json").returncode
        == 0
    )
    limited = gpuprov("verify", "--snapshot", str(snapshots), "--limit", "gpu1", "--format", "json")
    assert [h["host"] for h in json.loads(limited.stdout)["hosts"]] == ["gpu1"]


def test_check_with_policy_shows_drift(snapshots: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.xml"
    res = gpuprov("check", "--snapshot", str(snapshots), "--policy", str(EXAMPLE_POLICY))
    assert res.returncode == 1
    assert "fleet drift (host × check)" in res.stdout
    # The capture's host has no containerd and is no Kubernetes node: the example policy wants both.
    assert "containerd: not installed (no containerd to ask) (policy.yml)" in res.stdout
    assert "expected a Kubernetes node (policy.yml)" in res.stdout
    junit = gpuprov(
        "check",
        "--snapshot",
        str(snapshots),
        "--policy",
        str(EXAMPLE_POLICY),
        "--format",
        "junit",
        "--output",
        str(out),
    )
    assert junit.returncode == 1 and junit.stdout == ""
    assert out.read_text().startswith("<?xml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "say which hosts"),
        (("--local", "--snapshot", "/tmp"), "choose one of"),
        (("--snapshot", "/nonexistent-snapshot"), "not a directory"),
        (("--local", "--policy", "/nonexistent.yml"), "policy file not found"),
        (("--local", "--checks", "gpu.bogus"), "unknown check id 'gpu.bogus'"),
        (("--local", "--output", "/nonexistent-dir/report.json"), "does not exist"),
        (("--local", "--limit", "gpu1"), "--limit applies to"),
        (("-i", "/nonexistent/inventory.yml"), "inventory not found"),
        (("--local", "--format", "html"), "html"),
    ],
)
def test_bad_input_is_exit_2(args: tuple[str, ...], message: str) -> None:
    res = gpuprov("verify", *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr
    assert res.stdout == ""


def test_bad_policy_key_is_exit_2_naming_file_and_key(tmp_path: Path, snapshots: Path) -> None:
    policy = tmp_path / "p.yml"
    policy.write_text("groups:\n  gpu_nodes:\n    gpu.cnt: 8\n")
    res = gpuprov("check", "--snapshot", str(snapshots), "--policy", str(policy))
    assert res.returncode == 2
    assert f"{policy}: groups.gpu_nodes.gpu.cnt: unknown key" in res.stderr
    assert gpuprov("check", "--snapshot", str(snapshots)).returncode == 2  # --policy is required


def test_verify_local_is_honest_here() -> None:
    res = gpuprov("verify", "--local", "--format", "json")
    doc = json.loads(res.stdout)
    (host,) = doc["hosts"]
    statuses = [c["status"] for c in host["checks"]]
    assert res.returncode == (1 if set(statuses) & {"warn", "fail", "error"} else 0)
    gpus_here = (
        [
            d
            for d in Path("/sys/bus/pci/devices").glob("*")
            if (d / "vendor").read_text().strip() == "0x10de"
            and (d / "class").read_text().strip()[:6] in ("0x0300", "0x0302")
        ]
        if Path("/sys/bus/pci/devices").exists()
        else []
    )
    present = next(c for c in host["checks"] if c["id"] == "gpu.present")
    assert present["status"] == ("pass" if gpus_here else "fail")
    if not gpus_here:
        assert res.returncode == 1
        for c in host["checks"]:
            if c["id"].startswith("gpu.") and c["id"] not in ("gpu.present", "gpu.xid"):
                assert c["status"] == "skip" and "no NVIDIA GPU" in c["detail"]


def test_snapshot_local_then_replay_matches_live(tmp_path: Path) -> None:
    res = gpuprov("snapshot", "--local", "-o", str(tmp_path))
    assert res.returncode == 0, res.stderr
    (host_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    files = {p.name for p in host_dir.iterdir()}
    assert files >= ALWAYS
    assert files <= set(SNAPSHOT_PROBES) | {"meta.json"}
    meta = json.loads((host_dir / "meta.json").read_text())
    assert meta["host"] == host_dir.name and meta["collector"].startswith("gpuprov ")
    assert meta["collected_at"].endswith("Z")
    assert set(meta["probes"]) == set(SNAPSHOT_PROBES)
    for entry in meta["probes"].values():
        assert {"rc", "duration_s", "command"} <= set(entry)
    live = json.loads(gpuprov("verify", "--local", "--format", "json").stdout)["hosts"][0]["checks"]
    replay = json.loads(gpuprov("verify", "--snapshot", str(tmp_path), "--format", "json").stdout)
    replayed = replay["hosts"][0]["checks"]
    stable = [c for c in CHECK_IDS if c not in ("dcgm.diag", "container.smoke")]
    assert [(c["id"], c["status"]) for c in live if c["id"] in stable] == [
        (c["id"], c["status"]) for c in replayed if c["id"] in stable
    ]
    # A second snapshot into the same directory replaces the host's directory.
    assert gpuprov("snapshot", "--local", "-o", str(tmp_path)).returncode == 0
    assert [d.name for d in tmp_path.iterdir()] == [host_dir.name]


def test_snapshot_refuses_to_overwrite_a_foreign_directory(tmp_path: Path) -> None:
    import socket

    (tmp_path / socket.gethostname()).mkdir()
    (tmp_path / socket.gethostname() / "precious.txt").write_text("mine")
    res = gpuprov("snapshot", "--local", "-o", str(tmp_path))
    assert res.returncode == 2 and "not a snapshot" in res.stderr
    assert (tmp_path / socket.gethostname() / "precious.txt").read_text() == "mine"


# ------------------------------------------------------------------------------ over SSH, library


needs_sshd = pytest.mark.skipif(available() is not None, reason=str(available()))


@needs_sshd
def test_verify_hosts_over_ssh_with_one_unreachable(tmp_path: Path) -> None:
    with LoopbackFleet(tmp_path / "sshd", count=2, first=81) as fleet:
        hosts = [
            fleet.host_spec("a", "127.0.0.81"),
            fleet.host_spec("dead", "127.0.0.89"),
            fleet.host_spec("b", "127.0.0.82"),
        ]
        report = verify_hosts(hosts, parallel=2, checks=["os.supported", "gpu.present", "gpu.xid"])
        local = verify_snapshot  # noqa: F841 - keeps the import honest for readers
        by_host = {h.host: h for h in report.hosts}
        assert [h.host for h in report.hosts] == ["a", "dead", "b"]
        for name in ("a", "b"):
            assert by_host[name].error is None
            assert by_host[name].status_of("os.supported") == "pass"  # this machine is Debian 12
        dead = by_host["dead"]
        assert dead.error and "connection refused" in dead.error
        assert [(f.id, f.status) for f in dead.findings] == [
            ("os.supported", "error"),
            ("gpu.present", "error"),
            ("gpu.xid", "error"),
        ]
        assert all("connection refused" in f.detail for f in dead.findings)
        assert report.exit_code() == 1

        out = tmp_path / "snap"
        results = snapshot_hosts(hosts, out, parallel=3)
        assert [(r.host, bool(r.error)) for r in results] == [("a", False), ("dead", True), ("b", False)]
        assert {p.name for p in (out / "a").iterdir()} >= ALWAYS
        dead_meta = json.loads((out / "dead" / "meta.json").read_text())
        assert "connection refused" in dead_meta["error"] and dead_meta["probes"] == {}
        replay = verify_snapshot(out, checks=["os.supported"])
        assert {h.host: h.status for h in replay.hosts} == {"a": "pass", "b": "pass", "dead": "error"}


class _Recorder:
    """An executor that records the argv it is asked to run and answers like an empty host."""

    name = "rec"

    def __init__(self) -> None:
        self.argv: list[str] = []

    def run(self, command: list[str] | str, timeout: float) -> object:
        from provisioner.executors import CommandResult

        self.argv = list(command)
        return CommandResult(1, "", "sudo: a password is required", 0.01)

    def close(self) -> None:
        return None


def test_become_runs_the_script_under_sudo_and_a_failed_start_is_an_error() -> None:
    from provisioner.executors import ExecutorError
    from provisioner.verification import collect, ssh_targets

    spec = SimpleNamespace(
        name="g1",
        address="10.0.0.5",
        port=2222,
        user="ubuntu",
        private_key_file="~/k",
        known_hosts_file="~/kh",
        strict_host_key_checking=True,
        password=None,
        groups=["gpu_nodes"],
        vars={"ansible_become": "yes"},
    )
    (target,) = ssh_targets([spec])
    assert target.become and target.address == "10.0.0.5" and target.groups == ("gpu_nodes",)
    rec = _Recorder()
    with pytest.raises(ExecutorError, match="the probe script did not run: sudo: a password is required"):
        collect(rec, ["os-release"], 10, become=target.become)  # type: ignore[arg-type]
    assert rec.argv[:5] == ["sudo", "-n", "--", "sh", "-c"]
    root = SimpleNamespace(**{**vars(spec), "user": "root"})
    assert not ssh_targets([root])[0].become
