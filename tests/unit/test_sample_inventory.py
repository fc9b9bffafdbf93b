"""inventory/sample documents every knob of every role and passes gpuprov's own settings check; the real
H200 host's inventory (inventory/real-h200) is valid too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from provisioner.config import load_role_specs, validate_inventory_settings
from provisioner.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventory" / "sample"
# Helper roles: their variables are passed by other roles, not set by users.
INTERNAL_ROLES = {"apt_signed_repo", "containerd_config", "host_ledger"}


def role_knobs() -> dict[str, str]:
    knobs: dict[str, str] = {}
    for spec in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        role = spec.parent.parent.name
        if role in INTERNAL_ROLES:
            continue
        doc = yaml.safe_load(spec.read_text()) or {}
        for entry in (doc.get("argument_specs") or {}).values():
            for name in (entry or {}).get("options") or {}:
                knobs[name] = role
    return knobs


def test_every_role_knob_is_documented_in_the_sample() -> None:
    text = "\n".join(p.read_text() for p in sorted((SAMPLE / "group_vars").rglob("*.yml")))
    documented = set(re.findall(r"^#?\s?([a-z][a-z0-9_]*):", text, re.M))
    missing = {k: r for k, r in role_knobs().items() if k not in documented}
    assert not missing, f"knobs missing from inventory/sample/group_vars (add them, commented): {missing}"


@pytest.mark.parametrize("inventory", ["sample/hosts.yml", "real-h200/hosts.yml"])
def test_inventory_settings_are_valid(inventory: str) -> None:
    inv = load_inventory(REPO / "inventory" / inventory)
    hosts = inv.select(None)
    assert hosts
    validate_inventory_settings(inv, hosts, load_role_specs())
