"""Hostile snapshot bundles, built from the real H200 capture, replayed through the real CLI.

Whatever a bundle holds, `verify --snapshot` ends (no hang), prints no traceback, names the file at
fault, and never says a host is fine when nothing about it could be judged. Every bundle is replayed
once, a few at a time, and each case then checks its own outcome.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner.executors import MAX_SNAPSHOT_FILE, MAX_SNAPSHOT_META

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/snapshots/h200-device/vm"
SECRET = "TOPSECRET-outside-the-bundle"
HANG_GUARD_S = 60
JUDGED = {"pass", "warn", "fail"}


# ------------------------------------------------------------------------------------------- builders


def edit_meta(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        path = root / "vm/meta.json"
        meta = json.loads(path.read_text())
        change(meta)
        path.write_text(json.dumps(meta))
        return root

    return build


def meta_bytes(data: bytes) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        (root / "vm/meta.json").write_bytes(data)
        return root

    return build


def replace_file(name: str, make: Callable[[Path], None]) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        path = root / "vm" / name
        path.unlink()
        make(path)
        return root

    return build


def outside_link(path: Path) -> None:
    path.symlink_to(path.parents[2] / "secret.txt")


def smi_value(element: str, value: str) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        path = root / "vm/nvidia-smi-q.xml"
        text = path.read_text()
        changed = re.sub(rf"<{element}>[^<]*</{element}>", f"<{element}>{value}</{element}>", text, count=1)
        assert changed != text, element
        path.write_text(changed)
        return root

    return build


def every_probe_a_link(root: Path) -> Path:
    for path in (root / "vm").iterdir():
        if path.name != "meta.json":
            path.unlink()
            outside_link(path)
    return root


def second_dir_same_host(root: Path) -> Path:
    shutil.copytree(root / "vm", root / "vm-copy")
    return root


def empty_bundle(root: Path) -> Path:
    shutil.rmtree(root / "vm")
    return root


def bundle_through_link(root: Path) -> Path:
    link = root.parent / "link-to-bundle"
    link.symlink_to(root, target_is_directory=True)
    return link


def dangling_bundle_link(root: Path) -> Path:
    link = root.parent / "dangling"
    link.symlink_to(root.parent / "nowhere", target_is_directory=True)
    return link


def bundle_is_a_file(root: Path) -> Path:
    return root / "vm/os-release"


def only_a_linked_host_dir(root: Path) -> Path:
    elsewhere = root.parent / "elsewhere"
    (root / "vm").rename(elsewhere)
    (root / "vm").symlink_to(elsewhere, target_is_directory=True)
    return root


def nested(depth: int) -> bytes:
    return b'{"probes": {}, "x": ' + b"[" * depth + b"]" * depth + b"}"


def set_key(key: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda meta: meta.__setitem__(key, value)


def set_probe(name: str, key: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda meta: meta["probes"][name].__setitem__(key, value)


# ---------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], Path]  # edits a fresh copy of the bundle; returns what --snapshot gets
    exit: int
    says: tuple[str, ...] = ()  # on stderr (exit 2) or in the report


SMI = "nvidia-smi-q.xml"
META = "vm/meta.json"
NOISE = bytes(range(256)) * 16  # every byte value, as a binary file would hold
CASES = [
    # meta.json: wrong types
    Case("probes-a-list", edit_meta(set_key("probes", [])), 2, (META, "'probes' object")),
    Case("probes-a-string", edit_meta(set_key("probes", "all")), 2, (META, "'probes' object")),
    Case("probe-entry-a-number", edit_meta(lambda m: m["probes"].update({SMI: 5})), 2, (META, SMI)),
    Case("rc-a-string", edit_meta(set_probe(SMI, "rc", "0")), 2, (META, f"{SMI}'].rc")),
    Case("rc-a-boolean", edit_meta(set_probe(SMI, "rc", False)), 2, (META, ".rc")),
    Case("rc-negative", edit_meta(set_probe(SMI, "rc", -1)), 2, (META, ".rc")),
    Case("rc-huge", edit_meta(set_probe(SMI, "rc", 10**30)), 2, (META, ".rc")),
    Case("rc-nan", edit_meta(set_probe(SMI, "rc", float("nan"))), 2, (META, ".rc")),
    Case("command-a-list", edit_meta(set_probe(SMI, "command", ["nvidia-smi"])), 2, (META, ".command")),
    Case("stderr-a-number", edit_meta(set_probe(SMI, "stderr", 3)), 2, (META, ".stderr")),
    Case("host-a-list", edit_meta(set_key("host", ["vm"])), 2, (META, "host")),
    Case("host-empty", edit_meta(set_key("host", "")), 2, (META, "host")),
    Case("host-huge", edit_meta(set_key("host", "h" * 100_000)), 2, (META, "host")),
    Case("collected-at-a-number", edit_meta(set_key("collected_at", 1)), 2, (META, "collected_at")),
    Case("error-an-object", edit_meta(set_key("error", {"why": "x"})), 2, (META, "error")),
    Case("not-collected-a-list", edit_meta(set_key("not_collected", ["x"])), 2, (META, "not_collected")),
    # meta.json: missing keys, not an object, not JSON, too big, too deep
    Case("probes-missing", edit_meta(lambda m: m.pop("probes")), 2, (META, "'probes' object")),
    Case("probes-empty", edit_meta(set_key("probes", {})), 1, ("nothing these checks need",)),
    Case("top-level-array", meta_bytes(b"[]"), 2, (META, "JSON object")),
    Case("top-level-null", meta_bytes(b"null"), 2, (META, "JSON object")),
    Case("empty-file", meta_bytes(b""), 2, (META, "unreadable")),
    Case("not-json", meta_bytes(b"host: vm\nprobes: {}\n"), 2, (META, "unreadable")),
    Case("binary", meta_bytes(b"\xff\xfe\x00\x01" * 64), 2, (META, "unreadable")),
    Case("nested-deeply", meta_bytes(b"[" * 200_000), 2, (META, "nested too deeply")),
    Case("nested-deeply-closed", meta_bytes(nested(100_000)), 2, (META, "nested too deeply")),
    Case("meta-over-the-cap", meta_bytes(b" " * (MAX_SNAPSHOT_META + 1) + b"{}"), 2, (META, "larger than")),
    Case("meta-a-link", replace_file("meta.json", outside_link), 2, (META, "symbolic link")),
    Case("meta-a-fifo", replace_file("meta.json", os.mkfifo), 2, (META, "not a regular file")),
    Case("meta-a-directory", replace_file("meta.json", Path.mkdir), 2, (META, "not a regular file")),
    Case("host-recorded-unreachable", edit_meta(set_key("error", "connection refused")), 1, ("refused",)),
    # probe files
    Case("probe-a-link", replace_file(SMI, outside_link), 1, (f"vm/{SMI} is a symbolic link",)),
    Case("probe-a-fifo", replace_file("kernel-log.txt", os.mkfifo), 1, ("kernel-log.txt is not a regular",)),
    Case("probe-a-directory", replace_file("kernel-log.txt", Path.mkdir), 1, ("kernel-log.txt is not a",)),
    Case(
        "probe-over-the-cap",
        replace_file("kernel-log.txt", lambda p: p.write_bytes(b"x" * (MAX_SNAPSHOT_FILE + 1))),
        1,
        ("kernel-log.txt is larger than",),
    ),
    Case("probe-binary-xml", replace_file(SMI, lambda p: p.write_bytes(NOISE)), 1, ("nvidia-smi",)),
    Case("probe-nul-xml", replace_file(SMI, lambda p: p.write_bytes(b"\0" * 4096)), 1, ("nvidia-smi",)),
    Case(
        "probe-binary-os-release",
        replace_file("os-release", lambda p: p.write_bytes(b"\xff\x00ID=\x1b[31m\x00" * 50)),
        1,
        ("os.supported",),
    ),
    Case("every-probe-a-link", every_probe_a_link, 1, ("symbolic link",)),
    Case(
        "probe-name-walks-out",
        edit_meta(lambda m: m["probes"].update({"../../secret.txt": {"rc": 0, "command": "cat"}})),
        0,
    ),
    # ECC counters nvidia-smi cannot have printed for a working GPU
    Case("ecc-na", smi_value("dram_uncorrectable", "N/A"), 1, ("GPU 0", "N/A")),
    Case("ecc-negative", smi_value("dram_uncorrectable", "-7"), 1, ("GPU 0", "cannot be negative")),
    Case("ecc-not-a-number", smi_value("dram_uncorrectable", "many"), 1, ("GPU 0", "dram_uncorrectable")),
    # the bundle's layout
    Case("two-dirs-one-host", second_dir_same_host, 2, ("snap/vm and", "snap/vm-copy", "'vm'")),
    Case("empty-bundle", empty_bundle, 2, ("no snapshot here",)),
    Case("bundle-through-a-link", bundle_through_link, 0),
    Case("bundle-a-dangling-link", dangling_bundle_link, 2, ("not a directory",)),
    Case("bundle-a-file", bundle_is_a_file, 2, ("not a directory",)),
    Case("only-a-linked-host-dir", only_a_linked_host_dir, 2, ("no snapshot here",)),
]


# -------------------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Outcome:
    rc: int | None  # None: still running when the hang guard ran out
    stdout: str
    stderr: str


def replay(case: Case, base: Path) -> Outcome:
    work = base / case.name
    root = work / "snap"
    shutil.copytree(FIXTURE, root / "vm")
    (work / "secret.txt").write_text(f"{SECRET}\n")
    target = case.build(root)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "provisioner", "verify", "--snapshot", str(target), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200"},
        )
    except subprocess.TimeoutExpired:
        return Outcome(None, "", "")
    return Outcome(res.returncode, res.stdout, res.stderr)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    base = tmp_path_factory.mktemp("hostile-bundles")
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = pool.map(lambda c: (c.name, replay(c, base)), CASES)
        return dict(done)


def test_the_cases_have_distinct_names() -> None:
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_bundle(case: Case, outcomes: dict[str, Outcome]) -> None:
    out = outcomes[case.name]
    assert out.rc is not None, f"still running after {HANG_GUARD_S} s"
    both = out.stdout + out.stderr
    assert "Traceback" not in both, out.stderr
    assert SECRET not in both
    assert "\x1b" not in both
    assert out.rc == case.exit, both[-2000:]
    if out.rc == 2:
        assert out.stdout == "", "bad input is found before any report is made"
        assert all(s in out.stderr for s in case.says), out.stderr
        return
    report = json.loads(out.stdout)
    assert all(s in out.stdout for s in case.says), out.stdout[-2000:]
    for host in report["hosts"]:
        judged = [c for c in host["checks"] if c["status"] in JUDGED]
        if host["status"] in ("pass", "skip"):
            # A host reported fine was judged on something: never "ok" on nothing.
            assert judged, host
    if out.rc == 0:
        assert report["summary"]["hosts_ok"] == len(report["hosts"]) >= 1
