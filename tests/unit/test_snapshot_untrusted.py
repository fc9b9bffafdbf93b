"""A snapshot is untrusted data: its files are read only as regular files directly inside the host's
directory, by plain names and up to a size. A link, a device, a FIFO, a file too big or a name that
walks out of the bundle gives an error finding (or exit 2 for meta.json), never its target's content,
never a hang and never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.executors import MAX_SNAPSHOT_FILE

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/snapshots/h200-device/vm"
SECRET = "TOPSECRET-controller-only-line"


def gpuprov(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
        cwd=REPO,
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "snap"
    shutil.copytree(FIXTURE, root / "vm")
    (tmp_path / "secret.txt").write_text(f"{SECRET}\nNVRM: Xid (PCI:0000:00:06): 79, {SECRET}\n")
    return root


def checks(res: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    return {c["id"]: c for c in doc["hosts"][0]["checks"]}


def test_the_untouched_bundle_passes(bundle: Path) -> None:
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert checks(res)["gpu.xid"]["status"] == "pass", res.stdout


def test_a_symlinked_probe_file_is_refused_not_followed(bundle: Path) -> None:
    log = bundle / "vm/kernel-log.txt"
    log.unlink()
    log.symlink_to(bundle.parent / "secret.txt")
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    found = checks(res)
    assert SECRET not in res.stdout + res.stderr
    assert found["gpu.xid"]["status"] == "error"
    assert "symbolic link" in found["gpu.xid"]["detail"]


def test_a_fifo_is_refused_without_blocking(bundle: Path) -> None:
    log = bundle / "vm/kernel-log.txt"
    log.unlink()
    os.mkfifo(log)
    found = checks(gpuprov("verify", "--snapshot", str(bundle), "--format", "json"))
    assert found["gpu.xid"]["status"] == "error"
    assert "not a regular file" in found["gpu.xid"]["detail"]


def test_a_file_over_the_cap_is_an_error_finding(bundle: Path) -> None:
    line = "[    1.000000] NVRM: nothing to see here\n"
    (bundle / "vm/kernel-log.txt").write_text(line * (MAX_SNAPSHOT_FILE // len(line) + 2))
    found = checks(gpuprov("verify", "--snapshot", str(bundle), "--format", "json"))
    assert found["gpu.xid"]["status"] == "error"
    assert "larger than" in found["gpu.xid"]["detail"]


def test_a_symlinked_meta_json_exits_2(bundle: Path) -> None:
    meta = bundle / "vm/meta.json"
    (bundle.parent / "meta.json").write_text(meta.read_text())
    meta.unlink()
    meta.symlink_to(bundle.parent / "meta.json")
    res = gpuprov("verify", "--snapshot", str(bundle / "vm"), "--format", "json")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "meta.json" in res.stderr and "symbolic link" in res.stderr


def test_a_symlinked_host_directory_is_not_followed(bundle: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    shutil.copytree(FIXTURE, outside)
    (bundle / "other").symlink_to(outside, target_is_directory=True)
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert "Traceback" not in res.stderr
    assert [h["host"] for h in json.loads(res.stdout)["hosts"]] == ["vm"]


def test_a_probe_name_that_walks_out_of_the_bundle_is_refused(bundle: Path) -> None:
    """meta.json names the probes `run` answers from: a name with a path in it is never opened."""
    from provisioner.executors import SnapshotExecutor

    meta_path = bundle / "vm/meta.json"
    meta = json.loads(meta_path.read_text())
    meta["probes"]["../../secret.txt"] = {"command": "cat /etc/hostname", "rc": 0}
    meta_path.write_text(json.dumps(meta))
    res = SnapshotExecutor(bundle / "vm").run("cat /etc/hostname", 5)
    assert res.rc == 126 and SECRET not in res.stdout
    assert "not a plain file name" in res.stderr


@pytest.mark.parametrize("duration", ["slow", [1, 2], None, {"s": 1}, -5, True])
def test_odd_recorded_durations_do_not_crash(bundle: Path, duration: object) -> None:
    meta_path = bundle / "vm/meta.json"
    meta = json.loads(meta_path.read_text())
    for entry in meta["probes"].values():
        entry["duration_s"] = duration
    meta_path.write_text(json.dumps(meta))
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    assert checks(res)["driver.loaded"]["status"] == "pass"


def test_a_missing_probe_file_is_not_collected_not_garbled(bundle: Path) -> None:
    """meta.json says nvidia-smi succeeded, but its file is gone: the output is unknown (skip), not
    'printed nothing' (error)."""
    (bundle / "vm/nvidia-smi-q.xml").unlink()
    found = checks(gpuprov("verify", "--snapshot", str(bundle), "--format", "json"))
    assert found["gpu.ecc"]["status"] == "skip"
    assert "file is missing from the snapshot" in found["gpu.ecc"]["detail"]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"probes": []}, "'probes' object"),
        ({"probes": None}, "'probes' object"),
        ({"host": 7}, "host: must be a string"),
        ({"collected_at": ["today"]}, "collected_at: must be a string"),
        ({"probes": {"nvidia-smi-q.xml": 5}}, "probes['nvidia-smi-q.xml']: must be an object"),
        ({"probes": {"nvidia-smi-q.xml": {"rc": "0", "command": "x"}}}, "probes['nvidia-smi-q.xml'].rc"),
        ({"probes": {"nvidia-smi-q.xml": {"rc": True, "command": "x"}}}, "probes['nvidia-smi-q.xml'].rc"),
    ],
)
def test_metadata_of_the_wrong_type_is_bad_input_naming_the_key(bundle: Path, change: dict, key: str) -> None:
    """Read as "absent", such values made every probe "not collected", every check skip, exit 0."""
    meta_path = bundle / "vm/meta.json"
    meta = json.loads(meta_path.read_text())
    meta.update(change)
    meta_path.write_text(json.dumps(meta))
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert "Traceback" not in res.stderr
    assert res.returncode == 2, res.stdout + res.stderr
    assert str(meta_path) in res.stderr and key in res.stderr


def test_a_host_judged_on_nothing_is_an_error_not_ok(bundle: Path) -> None:
    meta_path = bundle / "vm/meta.json"
    meta_path.write_text(json.dumps({"host": "vm", "probes": {}}))
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert "Traceback" not in res.stderr
    assert res.returncode == 1, res.stdout
    (host,) = json.loads(res.stdout)["hosts"]
    assert host["status"] == "error" and "nothing these checks need could be read" in host["error"]
    assert {c["status"] for c in host["checks"]} == {"error"}


def test_a_file_meta_json_does_not_list_is_not_read(bundle: Path) -> None:
    """meta.json records what was collected and how it ended; a file it does not list is not judged."""
    meta_path = bundle / "vm/meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["probes"]["kernel-log.txt"]
    meta_path.write_text(json.dumps(meta))
    found = checks(gpuprov("verify", "--snapshot", str(bundle), "--format", "json"))
    assert found["gpu.xid"]["status"] != "pass"
    assert "meta.json does not list it" in found["gpu.xid"]["detail"]


def test_two_directories_of_one_host_are_refused(bundle: Path) -> None:
    shutil.copytree(bundle / "vm", bundle / "vm-again")
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert "Traceback" not in res.stderr
    assert res.returncode == 2, res.stdout
    assert str(bundle / "vm") in res.stderr and str(bundle / "vm-again") in res.stderr
    assert "'vm'" in res.stderr


def test_a_directory_left_by_an_interrupted_snapshot_is_not_a_host(bundle: Path) -> None:
    shutil.copytree(bundle / "vm", bundle / ".vm.old-x1y2z3")
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert [h["host"] for h in json.loads(res.stdout)["hosts"]] == ["vm"]


def test_a_directory_in_place_of_a_probe_file_is_an_error_finding(bundle: Path) -> None:
    log = bundle / "vm/kernel-log.txt"
    log.unlink()
    log.mkdir()
    found = checks(gpuprov("verify", "--snapshot", str(bundle), "--format", "json"))
    assert found["gpu.xid"]["status"] == "error"
    assert "not a regular file" in found["gpu.xid"]["detail"]


@pytest.mark.parametrize("make", [os.mkfifo, Path.mkdir], ids=["fifo", "directory"])
def test_a_meta_json_that_is_no_file_is_named(bundle: Path, make) -> None:
    meta = bundle / "vm/meta.json"
    meta.unlink()
    make(meta)
    res = gpuprov("verify", "--snapshot", str(bundle), "--format", "json")
    assert "Traceback" not in res.stderr
    assert res.returncode == 2 and str(meta) in res.stderr and "not a regular file" in res.stderr
