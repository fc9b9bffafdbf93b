"""The probe registry: every fact module's probes are collected once, in the contract's order, and what
the checks name resolves to them (a check naming a probe that is not there would silently lose it:
probes_for keeps only known names)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import provisioner.probes as probes_pkg
from provisioner.checks import CHECK_IDS, probes_for
from provisioner.checks.model import REGISTRY
from provisioner.probes import LEGACY_PROBES, PROBES, PROBES_BY_NAME, SNAPSHOT_PROBES


def fact_modules() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(probes_pkg.__path__):
        module = importlib.import_module(f"{probes_pkg.__name__}.{info.name}")
        found[info.name] = module
    return found


def test_every_checks_probes_are_probes_hosts_run() -> None:
    live = {p.name for p in PROBES}
    unknown = {c.id: [p for p in c.probes if p not in live] for c in REGISTRY.values()}
    assert {k: v for k, v in unknown.items() if v} == {}
    for check_id in CHECK_IDS:
        wanted = set(REGISTRY[check_id].probes)
        assert set(probes_for([check_id], smoke=True)) == wanted


def test_every_fact_modules_probes_are_collected_once() -> None:
    declared = [p for m in fact_modules().values() for p in getattr(m, "PROBES", ())]
    assert sorted(p.name for p in declared) == sorted(p.name for p in PROBES)
    assert len(PROBES_BY_NAME) == len(PROBES) + len(LEGACY_PROBES)
    assert set(SNAPSHOT_PROBES) <= set(PROBES_BY_NAME)


def test_no_two_accessors_share_a_cache_entry() -> None:
    """HostFacts.parsed caches by key: two facts under one key would read each other's value."""
    keys: dict[str, str] = {}
    for name, module in fact_modules().items():
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parsed" and node.args):
                continue
            arg = node.args[0]
            key = arg.value if isinstance(arg, ast.Constant) else getattr(module, ast.unparse(arg))
            assert key not in keys, f"{name} and {keys[key]} both cache under {key!r}"
            keys[key] = name
    assert "smi" in keys and "hostfacts" in keys
