"""`gpuprov lab up` without the vendor artifacts stops before it starts anything (no engine, no mirror)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuprov_lab import engine, fleet
from gpuprov_lab.errors import LabError


def test_missing_vendor_artifacts_stop_up_before_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPROV_VENDOR_DIR", str(tmp_path / "vendor"))
    monkeypatch.setenv("GPUPROV_LAB_STATE_ROOT", str(tmp_path / "state"))

    def no_engine(*_a: object, **_k: object) -> None:
        raise AssertionError("the engine was started before the vendor artifacts were checked")

    monkeypatch.setattr(engine, "ensure_engine", no_engine)
    with pytest.raises(LabError, match=r"vendor artifact .* not found under"):
        fleet.up(fleet.UpRequest(lab="vendorless", hosts=2))
    assert not (tmp_path / "state" / "labs" / "vendorless").exists()
