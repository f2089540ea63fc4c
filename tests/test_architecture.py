"""The house rules of docs/architecture.md, read from the code: each room imports only rooms on lower floors (so
no circle), no module over 600 lines, the package's own modules imported at the top (where a room imports one
inside a function, it says why), and the guarantee questions answered by streamproof/guarantees.py alone.

Pure Python (the package's source read with ``ast``): nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "streamproof"
MAX_LINES = 600
# The floor plan of docs/architecture.md: a room (a top-level module, or a folder) by its floor.
FLOORS = {
    "streamproof.__main__": 12,
    "streamproof.cli": 11,
    "streamproof": 10, "streamproof.demo": 10,
    "streamproof.api": 9, "streamproof.bench": 9, "streamproof.jobs": 9, "streamproof.render": 9,
    "streamproof.testing": 9,
    "streamproof.harness": 8,
    "streamproof.pipeline": 7, "streamproof.reconcile": 7, "streamproof.infra": 7, "streamproof.maintenance": 7,
    "streamproof.checkpoint": 6, "streamproof.jvm": 6,
    "streamproof.sinks": 5,
    "streamproof.sources": 4, "streamproof.your_code": 4, "streamproof.generator": 4,
    "streamproof.transform": 3, "streamproof.kafka_client": 3,
    "streamproof.config": 2,
    "streamproof.guarantees": 1, "streamproof.faults": 1, "streamproof.storage": 1,
    "streamproof.errors": 0, "streamproof.metrics": 0,
}  # fmt: skip
# Imports of the package's own modules made inside a function, each with the reason its room gives for it.
DEFERRED = {
    # pytest loads the plugin in every run of a suite: the rooms that bring Spark come when a fixture needs them.
    "streamproof/testing.py",
    # A command imports the rooms it calls when it runs: every pipeline start is a `streamproof run` process (the crash
    # harness starts hundreds), and importing every command's rooms cost it 2.0 core-s, now 1.1 (`python -X
    # importtime`); `streamproof --help` 2.3 s, now 1.2.
    "streamproof/cli/generate.py",
    "streamproof/cli/infra.py",
    "streamproof/cli/jobs.py",
    "streamproof/cli/operations.py",
    "streamproof/cli/pipeline.py",
    # The PostgreSQL sink brings psycopg (0.18 s a start): only a pipeline with one opens it.
    "streamproof/sinks/__init__.py",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(path): (path, ast.parse(path.read_text(encoding="utf-8"))) for path in PACKAGE.rglob("*.py")}


def _imported(node: ast.AST, modules: set[str]) -> list[str]:
    """The package's modules an import statement names (``from streamproof import faults`` names the module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        named = [f"{node.module}.{alias.name}" for alias in node.names]
        return [name for name in named if name in modules] or ([node.module] if node.module in modules else [])
    return []


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    for name, (_, tree) in sources.items():
        targets = {target for node in ast.walk(tree) for target in _imported(node, modules)}
        graph[name] = {target for target in targets if target != name}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else module


def test_every_room_imports_only_rooms_below_it() -> None:
    graph = _graph()
    unplaced = sorted({_room(module) for module in graph} - set(FLOORS))
    assert unplaced == [], "place each new room on a floor of docs/architecture.md and of FLOORS"
    upward = sorted(
        f"{module} -> {target}" for module, targets in graph.items() for target in targets
        if _room(module) != _room(target) and FLOORS[_room(target)] >= FLOORS[_room(module)]
    )  # fmt: skip
    assert upward == []


def test_no_module_imports_itself_through_others() -> None:
    assert _circle(_graph()) is None


def test_the_circle_finder_finds_a_planted_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circle(graph) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda path: path.relative_to(REPO).as_posix())
def test_no_room_holds_two(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines: a hint that it holds two rooms"


def test_own_modules_are_imported_at_the_top() -> None:
    sources = _sources()
    modules = set(sources)
    deferred = []
    for _, (path, tree) in sources.items():
        where = path.relative_to(REPO).as_posix()
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if _imported(node, modules) and where not in DEFERRED:
                    deferred.append(f"{where}:{node.lineno}")
    assert deferred == []


def test_only_the_guarantees_table_compares_guarantee_names() -> None:
    names = {"exactly-once", "at-least-once", "at-most-once"}
    found = []
    for _, (path, tree) in _sources().items():
        if path.name == "guarantees.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                constants = [part for part in (node.left, *node.comparators) if isinstance(part, ast.Constant)]
                if any(constant.value in names for constant in constants):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
