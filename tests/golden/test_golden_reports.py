"""Golden-file tests: the exact outputs and exit codes of `gpuprov verify` and `gpuprov check`.

What is pinned: for each case in CASES, `python -m provisioner ARGS --format F` is run for the case's
formats, and compared byte for byte with tests/golden/data/:

- ``<case>.txt`` the table (``verify``: per-host tables; ``check``: the fleet drift table), rendered with
  COLUMNS=120, NO_COLOR=1, TERM=dumb (stdout is a pipe, so no colour either way);
- ``<case>.json`` the JSON report, ``<case>.xml`` the JUnit XML, ``<case>.prom`` the Prometheus text;
- ``<case>.rc`` the command line, then for each format its exit code and its stderr.

The files are compared byte for byte, trailing spaces (rich pads table lines) and final newlines
included: edit them only through update mode (tests/golden/.editorconfig keeps editors off them).

Inputs: the snapshot recorded on a real H200 host (tests/fixtures/snapshots/h200-device, host ``vm``),
the policies next to this file (policy-drift.yml: fails and warns; policy-warn.yml: warns only;
policy-bad-key.yml: refused), and a two-host fleet built in a temporary directory from that snapshot
(``gpu-a`` as recorded, ``gpu-b`` with an Xid 13 added to its kernel log: a warning).

Before comparison the outputs are normalised by `normalise` (and nothing else is): timestamps,
durations, the gpuprov version and the absolute paths of the temporary and repository directories
become placeholders (<TIMESTAMP>, <DURATION>, <VERSION>, <TMP>, <REPO>). Every output is also checked
to be well formed before it is normalised: the JSON loads, the XML parses, every Prometheus line is a
sample of the exposition format or a # HELP / # TYPE comment, the table has no escape sequences.

A mismatch fails with a unified diff (golden file → actual output). When an output is meant to change,
rewrite the golden files deliberately and review the change with git diff before committing it:

    GPUPROV_UPDATE_GOLDEN=1 python -m pytest tests/golden
    git diff tests/golden/data

In update mode every golden test rewrites its files instead of comparing them, then fails, naming the
files it rewrote and those whose content changed, so that a run in update mode never passes (in CI,
say). The exit code each case expects (Case.rc) is asserted in update mode too. A new case gets its
files the same way; a golden file that no case produces any more makes `test_no_stray_golden_files` fail.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioner import __version__

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA = HERE / "data"
UPDATE = os.environ.get("GPUPROV_UPDATE_GOLDEN") == "1"

# Paths relative to the repository root (the commands run there), so that none of them is absolute.
H200 = "tests/fixtures/snapshots/h200-device"
POLICY_DRIFT = "tests/golden/policy-drift.yml"
POLICY_WARN = "tests/golden/policy-warn.yml"
POLICY_BAD_KEY = "tests/golden/policy-bad-key.yml"
FLEET = "{fleet}"  # in a case's arguments: the two-host snapshot built in a temporary directory

EXT = {"table": "txt", "json": "json", "junit": "xml", "prometheus": "prom"}
ALL = ("table", "json", "junit", "prometheus")
WIDTH = 120


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]  # after `python -m provisioner`, without --format
    formats: tuple[str, ...]  # a golden file per format (see EXT), plus <name>.rc for all of them
    rc: int  # the exit code every format must give (also checked in update mode)
    stdout: bool = True  # False: bad input, stdout must be empty and no output file is kept


CASES = (
    # The real H200 host, no policy: everything passes or is skipped.
    Case("h200-verify", ("verify", "--snapshot", H200), ALL, 0),
    # A policy it does not meet: driver branch and GPU count fail, a missing held package warns.
    Case("h200-check-drift", ("check", "--snapshot", H200, "--policy", POLICY_DRIFT), ALL, 1),
    # --fail-on fail does not forgive the failures; JUnit shows the warning as passing case with output.
    Case(
        "h200-check-drift--fail-on-fail",
        ("check", "--snapshot", H200, "--policy", POLICY_DRIFT, "--fail-on", "fail"),
        ("junit",),
        1,
    ),
    # Warnings only: exit 1 by default and with an explicit --fail-on warn, 0 with --fail-on fail.
    Case(
        "h200-check-warn",
        ("check", "--snapshot", H200, "--policy", POLICY_WARN),
        ("table", "json", "junit"),
        1,
    ),
    Case(
        "h200-check-warn--fail-on-warn",
        ("check", "--snapshot", H200, "--policy", POLICY_WARN, "--fail-on", "warn"),
        ("junit",),
        1,
    ),
    Case(
        "h200-check-warn--fail-on-fail",
        ("check", "--snapshot", H200, "--policy", POLICY_WARN, "--fail-on", "fail"),
        ("table", "junit"),
        0,
    ),
    # Two hosts (more than one table, per-GPU Prometheus series, the source as an absolute tmp path).
    Case("fleet-verify", ("verify", "--snapshot", FLEET), ALL, 1),
    Case("fleet-verify--fail-on-fail", ("verify", "--snapshot", FLEET, "--fail-on", "fail"), ("json",), 0),
    Case("fleet-check-drift", ("check", "--snapshot", FLEET, "--policy", POLICY_DRIFT), ALL, 1),
    # Bad input: exit 2, one line (or click's usage text) on stderr, nothing on stdout.
    Case(
        "bad-policy-key",
        ("check", "--snapshot", H200, "--policy", POLICY_BAD_KEY),
        ("table",),
        2,
        stdout=False,
    ),
    Case("bad-check-id", ("verify", "--snapshot", H200, "--checks", "gpu.bogus"), ("json",), 2, stdout=False),
    Case("bad-format", ("verify", "--snapshot", H200, "--format", "html"), ("html",), 2, stdout=False),
)


# ------------------------------------------------------------------------------------- normalisation

TIMESTAMP = "<TIMESTAMP>"
DURATION = "<DURATION>"

# (format, pattern, replacement): the only rewriting done to an output before it is compared.
RULES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    # JSON: when the report was made and when the snapshot was collected; durations of run and hosts.
    ("json", re.compile(r'("(?:generated_at|collected_at)": )"[^"]*"'), rf'\1"{TIMESTAMP}"'),
    ("json", re.compile(r'("duration_s": )-?[0-9][0-9.eE+-]*'), rf'\1"{DURATION}"'),
    # JUnit: the run's and each host's duration (testcases say time="0" and stay pinned).
    ("junit", re.compile(r'(<testsuites? [^>]*\btime=")[^"]*(")'), rf"\1{DURATION}\2"),
    # Prometheus: probe durations and the run's Unix time.
    (
        "prometheus",
        re.compile(r"^(gpuprov_host_probe_duration_seconds\{[^}]*\} )\S+$", re.M),
        rf"\1{DURATION}",
    ),
    ("prometheus", re.compile(r"^(gpuprov_last_run_timestamp_seconds )\S+$", re.M), rf"\1{TIMESTAMP}"),
    # Table: the run's duration at the end of the summary line.
    ("table", re.compile(r"(— checks: [^\n]*\()[0-9.]+( s\))$", re.M), rf"\1{DURATION}\2"),
)


def normalise(text: str, fmt: str, *, tmp: Path) -> str:
    """`text` (the output in format `fmt`, or "rc" for the exit-code file) with its volatile parts
    replaced by placeholders: RULES for `fmt`, then in every format the gpuprov version and the
    absolute paths of the temporary directory and of the repository."""
    for rule_fmt, pattern, replacement in RULES:
        if rule_fmt == fmt:
            text = pattern.sub(replacement, text)
    text = text.replace(f"gpuprov {__version__}", "gpuprov <VERSION>")
    for path, placeholder in ((tmp, "<TMP>"), (REPO, "<REPO>")):
        for spelling in dict.fromkeys((str(path), str(path.resolve()))):
            text = text.replace(spelling, placeholder)
    return text


# --------------------------------------------------------------------------------------- well-formed

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
_LABELS = rf"\{{(?:[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE}(?:,[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE})*)?\}}"
_VALUE = r"(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|NaN|[+-]Inf)"
PROM_SAMPLE = re.compile(rf"^(?P<name>{_NAME})(?:{_LABELS})? {_VALUE}(?: -?[0-9]+)?$")
PROM_HELP = re.compile(rf"^# HELP (?P<name>{_NAME}) \S.*$")
PROM_TYPE = re.compile(rf"^# TYPE (?P<name>{_NAME}) (?:counter|gauge|histogram|summary|untyped)$")


def check_well_formed(text: str, fmt: str, *, drift: bool) -> None:
    if fmt == "json":
        doc = json.loads(text)
        assert isinstance(doc, dict) and isinstance(doc["hosts"], list), "JSON report without hosts"
    elif fmt == "junit":
        assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
        root = ET.fromstring(text.encode("utf-8"))
        assert root.tag == "testsuites" and all(s.tag == "testsuite" for s in root)
    elif fmt == "prometheus":
        assert text.endswith("\n")
        typed: set[str] = set()
        for n, line in enumerate(text[:-1].split("\n"), 1):
            if m := PROM_TYPE.match(line):
                typed.add(m["name"])
            elif PROM_HELP.match(line):
                pass
            else:
                m = PROM_SAMPLE.match(line)
                assert m, f"line {n} is not in the Prometheus exposition format: {line!r}"
                assert m["name"] in typed, f"line {n}: sample before its # TYPE: {line!r}"
    elif fmt == "table":
        assert "\x1b" not in text, "escape sequences in the table"
        if not drift:  # the drift grid may be wider than the terminal (it never wraps); the rest not
            wide = [line for line in text.splitlines() if len(line) > WIDTH]
            assert not wide, f"lines wider than {WIDTH} columns: {wide}"


# --------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def fleet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the two-host snapshot fleet/ (gpu-a, gpu-b) built from the H200 snapshot."""
    root = tmp_path_factory.mktemp("golden")
    for host in ("gpu-a", "gpu-b"):
        dest = root / "fleet" / host
        shutil.copytree(REPO / H200 / "vm", dest)
        meta = json.loads((dest / "meta.json").read_text())
        meta["host"] = host
        (dest / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    with (root / "fleet" / "gpu-b" / "kernel-log.txt").open("a") as log:
        log.write(
            "[  812.345678] NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python3, Graphics SM Warp "
            "Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address\n"
        )
    return root


def gpuprov(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE", "COLUMNS")}
    env.update(COLUMNS=str(WIDTH), NO_COLOR="1", TERM="dumb", PYTHONUTF8="1", PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args], capture_output=True, cwd=REPO, env=env, timeout=300
    )


class Golden:
    """Compares outputs with their golden files (or rewrites them in update mode); reports at the end."""

    def __init__(self) -> None:
        self.diffs: list[str] = []
        self.rewritten: list[str] = []
        self.changed: list[str] = []

    def check(self, name: str, actual: str) -> None:
        path = DATA / name
        expected = path.read_bytes().decode("utf-8") if path.exists() else None
        if UPDATE:  # always rewritten, so that update mode fails even where nothing changed
            DATA.mkdir(exist_ok=True)
            path.write_bytes(actual.encode("utf-8"))
            self.rewritten.append(name)
            if expected != actual:
                self.changed.append(name)
        elif expected == actual:
            return
        elif expected is None:
            self.diffs.append(f"{name}: no golden file (create it with GPUPROV_UPDATE_GOLDEN=1)")
        else:
            diff = difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"tests/golden/data/{name} (golden)",
                tofile=f"{name} (actual output, normalised)",
            )
            text = "".join(line if line.endswith("\n") else line + "\n" for line in diff)
            if expected.split() == actual.split():
                text += "(only whitespace differs: trailing spaces, blank lines or the final newline)\n"
            self.diffs.append(text)

    def finish(self) -> None:
        if self.diffs:
            pytest.fail(
                "output differs from the golden files (GPUPROV_UPDATE_GOLDEN=1 rewrites them):\n\n"
                + "\n".join(self.diffs),
                pytrace=False,
            )
        if self.rewritten:
            changed = ", ".join(self.changed) or "none"
            pytest.fail(
                f"GPUPROV_UPDATE_GOLDEN=1: golden files rewritten, not compared: {', '.join(self.rewritten)}"
                f" (changed: {changed}); review with git diff, then run without it",
                pytrace=False,
            )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden(case: Case, fleet_root: Path) -> None:
    args = [str(fleet_root / "fleet") if a == FLEET else a for a in case.args]
    golden = Golden()
    given = "--format" in case.args  # bad-format: the case gives its own --format
    command = " ".join(case.args).replace(FLEET, "<TMP>/fleet")
    rc_lines = [f"$ gpuprov {command}" + ("" if given else " --format FORMAT")]
    for fmt in case.formats:
        res = gpuprov(args if given else [*args, "--format", fmt])
        stdout, stderr = res.stdout.decode("utf-8"), res.stderr.decode("utf-8")
        assert res.returncode == case.rc, f"--format {fmt}: exit {res.returncode}, not {case.rc}\n{stderr}"
        rc_lines.append(f"--format {fmt}: exit {res.returncode}")
        rc_lines += ["  stderr:" + (f" {line}" if line else "") for line in stderr.splitlines()]
        if stderr and not stderr.endswith("\n"):
            rc_lines.append("  (stderr ends without a newline)")
        if case.stdout:
            check_well_formed(stdout, fmt, drift=case.args[0] == "check")
            golden.check(f"{case.name}.{EXT[fmt]}", normalise(stdout, fmt, tmp=fleet_root))
        else:
            assert stdout == "", f"--format {fmt}: bad input, yet something on stdout:\n{stdout}"
    golden.check(f"{case.name}.rc", normalise("\n".join(rc_lines) + "\n", "rc", tmp=fleet_root))
    golden.finish()


def test_no_stray_golden_files() -> None:
    """Every file in data/ is produced by a case (a renamed or dropped case leaves none behind)."""
    expected = {f"{c.name}.rc" for c in CASES} | {
        f"{c.name}.{EXT[f]}" for c in CASES if c.stdout for f in c.formats
    }
    stray = sorted(p.name for p in DATA.iterdir() if p.name not in expected)
    assert not stray, f"golden files no case produces (remove them): {stray}"


def test_normalise_touches_only_volatile_fields(tmp_path: Path) -> None:
    """The rules replace what they name and leave look-alikes alone."""
    text = '"generated_at": "2026-01-01T00:00:00Z",\n"duration_s": 0.004,\n"detail": "duration_s 5"\n'
    assert normalise(text, "json", tmp=tmp_path) == (
        f'"generated_at": "{TIMESTAMP}",\n"duration_s": "{DURATION}",\n"detail": "duration_s 5"\n'
    )
    xml = '<testsuite name="vm" time="0.004" tests="1">\n<testcase name="x" time="0" />\n'
    assert normalise(xml, "junit", tmp=tmp_path) == (
        f'<testsuite name="vm" time="{DURATION}" tests="1">\n<testcase name="x" time="0" />\n'
    )
    prom = 'gpuprov_host_probe_duration_seconds{host="a"} 0.004\ngpuprov_check_ok{host="a"} 1\n'
    assert normalise(prom, "prometheus", tmp=tmp_path) == (
        f'gpuprov_host_probe_duration_seconds{{host="a"}} {DURATION}\ngpuprov_check_ok{{host="a"}} 1\n'
    )
    assert normalise(f"snapshot {tmp_path}/fleet, gpuprov {__version__}", "table", tmp=tmp_path) == (
        "snapshot <TMP>/fleet, gpuprov <VERSION>"
    )
