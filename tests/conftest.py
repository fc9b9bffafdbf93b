"""Fixtures shared by the whole suite; above all ``lab``: one local lab per test session.

The lab is brought up once per session under a unique name (LAB_HOSTS hosts: cp1 and one GPU host per
containerd generation) with the real CLI and taken down by a finalizer, also when tests fail. Tests that
use it are lab tests (marked ``lab``). When the engine cannot run here the lab tests are skipped, unless
``GPUPROV_REQUIRE_LAB=1`` (set by scripts/test.sh and CI): then they fail loudly, so a broken lab never
passes as "skipped".

The session lab changes as the suite goes on, so every module that uses it says, in ``LAB_PHASE``, which
state of the lab it needs; lab tests run in the order of ``LAB_PHASES`` (stable within a phase):

- ``fresh``: bare hosts, as ``lab up`` made them (tests of the lab itself);
- ``bootstrapped``: the whole fleet bootstrapped with the default settings, read or faulted and cleared;
- ``day2``: day-2 operations on the bootstrapped fleet (MIG layouts, sharing, tenants); whole GPUs and
  schedulable nodes are put back after, the operator's settings are left to the next phase;
- ``reset``: `gpuprov reset` takes a worker and the operator back, and bootstrap brings them back (the
  fleet is as the default settings make it again);
- ``reprovisions``: tests that bootstrap the fleet with other settings (another driver branch).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from labkit import LAB_HOSTS, Lab, gpuprov, lab_from_inventory, require_lab, unique_lab_name


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """The session's lab (cp1, gpu1..gpu3); always taken down afterwards."""
    require_lab()
    name = unique_lab_name()
    try:
        up = gpuprov("lab", "up", "--lab", name, "--hosts", str(LAB_HOSTS))
        if up.returncode != 0:
            pytest.fail(
                f"gpuprov lab up --lab {name} failed (rc {up.returncode}):\n{up.stderr}", pytrace=False
            )
        inv = gpuprov("lab", "inventory", "--lab", name)
        if inv.returncode != 0:
            pytest.fail(f"gpuprov lab inventory failed:\n{inv.stderr}", pytrace=False)
        path = Path(inv.stdout.strip().splitlines()[-1])
        yield lab_from_inventory(name, path)
    finally:
        down = gpuprov("lab", "down", "--lab", name)
        if down.returncode != 0:
            sys.stderr.write(f"gpuprov lab down --lab {name} failed:\n{down.stderr}\n")


LAB_PHASES = ("fresh", "bootstrapped", "day2", "reset", "reprovisions")


def _lab_phase(item: pytest.Item) -> int:
    """0 for a test that does not use the session lab, else 1 + the index of its module's LAB_PHASE."""
    uses_lab = any(name in getattr(item, "fixturenames", ()) for name in ("lab", "bootstrapped"))
    module = getattr(item, "module", None)
    phase = getattr(module, "LAB_PHASE", None)
    if phase is None:
        if uses_lab:
            raise pytest.UsageError(f"{item.nodeid}: uses the session lab; set LAB_PHASE in its module")
        return 0
    if phase not in LAB_PHASES:
        raise pytest.UsageError(f"{item.nodeid}: LAB_PHASE {phase!r} is not one of {', '.join(LAB_PHASES)}")
    return 1 + LAB_PHASES.index(phase)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the lab is a lab test, marked or not; lab tests run phase by phase."""
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()) and item.get_closest_marker("lab") is None:
            item.add_marker(pytest.mark.lab)
    items.sort(key=_lab_phase)
