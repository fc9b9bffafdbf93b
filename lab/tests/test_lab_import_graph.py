"""The lab's modules form no import cycle, counting imports made inside functions too (a lazy import hides
a cycle from the interpreter, not from a reader); the lab may import the product, never the other way
round (tests/unit/test_product_boundary.py); and the GPU stand-in, which runs inside lab hosts with their
own python3, imports nothing but the standard library, PyYAML (the host image's python3-yaml) and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import gpuprov_lab

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from importgraph import cycles, imported_from, module_name

ROOT = Path(gpuprov_lab.__file__).resolve().parent


def _imports(path: Path, package: str) -> set[str]:
    """Every module name an import statement of the file names (relative ones made absolute)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, package)
            names.update(f"{base}.{a.name}" for a in node.names)
            names.add(base)
    return names


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p, ROOT): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {
            t
            for t in _imports(path, package)
            if t in modules and t != name and not (path.name == "__init__.py" and t.startswith(name + "."))
        }
    return graph


def test_the_graph_is_read_right() -> None:
    graph = import_graph()
    assert "gpuprov_lab.fleet" in graph["gpuprov_lab.cli"]  # an import inside a function
    assert "gpuprov_lab.gpu.core" in graph["gpuprov_lab.gpu.smi"]  # a relative import
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_lab() -> None:
    assert cycles(import_graph()) == []


def test_the_gpu_stand_in_needs_only_the_standard_library() -> None:
    gpu = ROOT / "gpu"
    outside = {
        f"{p.name}: {n}"
        for p in gpu.glob("*.py")
        for n in _imports(p, "gpuprov_lab.gpu")
        if n.split(".")[0] not in {*sys.stdlib_module_names, "yaml"} and not n.startswith("gpuprov_lab.gpu")
    }
    assert outside == set()
