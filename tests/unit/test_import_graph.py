"""The product's modules form no import cycle, counting imports made inside functions too: a lazy import
hides a cycle from the interpreter, not from a reader. A package's __init__ counts as a module like any
other: one that imports its own modules is a cycle with any of them that imports the package back.

The layers import one way: the probes (a fact's command, parser and accessor) know nothing of the checks
that read them nor of the executors that carry their script; the executors know nothing of either."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import provisioner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from importgraph import cycles, imported_from, module_name

ROOT = Path(provisioner.__file__).resolve().parent


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p, ROOT): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        # Imports under `if TYPE_CHECKING:` only name types for annotations: no dependency at all.
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body
            for n in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = imported_from(node, package)
                # `from pkg import mod` imports a module when pkg.mod is one.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def test_the_graph_is_read_right() -> None:
    graph = import_graph()
    assert "provisioner.upgrade.plan" in graph["provisioner.upgrade.rollout"]
    assert "provisioner.rollout.engine" in graph["provisioner.migapply.rollout"]
    assert "provisioner.errors" in graph["provisioner.cli"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_product() -> None:
    assert cycles(import_graph()) == []


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _under(names: set[str], *packages: str) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in packages))


def test_the_probes_import_nothing_that_reads_or_carries_them() -> None:
    graph = import_graph()
    probes = [n for n in graph if n == "provisioner.probes" or n.startswith("provisioner.probes.")]
    assert "provisioner.probes.smi" in probes and "provisioner.probes.smi" in graph["provisioner.probes"]
    readers = ("provisioner.checks", "provisioner.verification", "provisioner.executors", "provisioner.top")
    assert {n: _under(reach(graph, n), *readers) for n in probes} == {n: [] for n in probes}


def test_each_executor_backend_stands_on_the_interface_alone() -> None:
    graph = import_graph()
    backends = {
        "provisioner.executors.local": ["provisioner.executors.base"],
        "provisioner.executors.snapshot": ["provisioner.executors.base"],
        "provisioner.executors.ssh_target": [],
        "provisioner.executors.ssh": ["provisioner.executors.base", "provisioner.executors.ssh_target"],
    }
    assert {n: _under(graph[n], "provisioner.executors") for n in backends} == backends
    executors = [n for n in graph if n.startswith("provisioner.executors")]
    others = ("provisioner.probes", "provisioner.checks", "provisioner.verification")
    assert {n: _under(reach(graph, n), *others) for n in executors} == {n: [] for n in executors}


def test_shared_engines_know_none_of_their_clients() -> None:
    """provisioner.rollout runs any rolling change and provisioner.playbookverb any playbook verb: neither
    imports a verb built on it, and the rolling changes do not import each other."""
    graph = import_graph()
    engines = {
        "provisioner.rollout": ("provisioner.upgrade", "provisioner.migapply"),
        "provisioner.playbookverb": ("provisioner.bootstrap",),
    }
    for name in graph:
        reached = reach(graph, name)
        for engine, clients in engines.items():
            if name.startswith(engine):
                assert not [m for m in reached if m.startswith(clients)], name
            for client in clients:
                others = tuple(c for c in clients if c != client)
                if name.startswith(client) and others:
                    assert not [m for m in reached if m.startswith(others)], name
