"""The session lab bootstrapped once, end to end, for every test that needs a fully provisioned fleet.

Bootstrap runs twice: the first run provisions every stage, the second must change nothing (idempotence).
Both results are kept for the tests to inspect.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from labkit import Lab, gpuprov


@dataclass(frozen=True)
class BootstrapRun:
    rc: int
    summary: dict[str, Any]
    stderr: str

    def host(self, name: str) -> dict[str, Any]:
        return next(h for h in self.summary["hosts"] if h["host"] == name)


@dataclass(frozen=True)
class Bootstrapped:
    lab: Lab
    first: BootstrapRun
    second: BootstrapRun


def _bootstrap(lab: Lab) -> BootstrapRun:
    res = gpuprov("bootstrap", "-i", str(lab.inventory), "--yes", "--format", "json", timeout=3600)
    try:
        summary = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"bootstrap printed no JSON summary (rc {res.returncode}):\n{res.stderr[-4000:]}")
    return BootstrapRun(res.returncode, summary, res.stderr)


@pytest.fixture(scope="session")
def bootstrapped(lab: Lab) -> Iterator[Bootstrapped]:
    first = _bootstrap(lab)
    if first.rc != 0:
        bad = [h for h in first.summary["hosts"] if h["status"] != "done"]
        pytest.fail(f"first bootstrap failed (rc {first.rc}): {bad}\n{first.stderr[-4000:]}", pytrace=False)
    second = _bootstrap(lab)
    yield Bootstrapped(lab, first, second)
    for host in lab.hosts:
        lab.cli("lab", "fault", host, "clear")
