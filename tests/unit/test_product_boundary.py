"""The product stands alone: nothing in provisioner/ imports the lab, and the lab reaches the product's
CLI only through the `gpuprov.cli` entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import provisioner

PRODUCT = Path(provisioner.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_product_module_names_the_lab() -> None:
    offenders = {
        str(p.relative_to(PRODUCT)): sorted(n for n in _imports(p) if n.split(".")[0] == "gpuprov_lab")
        for p in PRODUCT.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_every_product_module_loads_nothing_of_the_lab() -> None:
    # A fresh interpreter: every module of the package imported, then sys.modules inspected.
    script = (
        "import importlib, pkgutil, sys, provisioner\n"
        "for m in pkgutil.walk_packages(provisioner.__path__, 'provisioner.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'gpuprov_lab'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_lab_verbs_arrive_through_the_entry_point() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="gpuprov.cli")}
    assert eps.get("lab") == "gpuprov_lab.cli:app"
    res = subprocess.run(
        [sys.executable, "-m", "provisioner", "lab", "--help"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0 and "up" in res.stdout and "down" in res.stdout


def test_version_is_the_packages() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "provisioner", "--version"], capture_output=True, text=True, check=False
    )
    assert (res.returncode, res.stdout.strip()) == (0, f"gpuprov {provisioner.__version__}")
