"""Import-graph rules beside DESIGN.md's layering: the bake's modules import each other
without a cycle, and the benchmarks never import the test suite."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BAKE = ROOT / "build" / "bake"


def _imported(path: Path, package: str) -> set[str]:
    """The modules of `package` that `path` imports, at module level or inside functions
    (`import package.x`, `from package.x import y`, `from package import x`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module == package:
                names.update(f"{package}.{alias.name}" for alias in node.names)
    return {name for name in names if name == package or name.startswith(f"{package}.")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (its nodes in order, the first repeated last), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_cycle_finder_sees_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_bake_modules_import_each_other_without_a_cycle() -> None:
    modules = {f"bake.{p.stem}": p for p in sorted(BAKE.glob("*.py"))}
    assert "bake.sources" in modules and "bake.package" in modules
    graph = {name: _imported(path, "bake") & modules.keys() for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "bake import cycle: " + " -> ".join(cycle or [])


def test_benchmarks_never_import_tests() -> None:
    paths = sorted((ROOT / "benchmarks").rglob("*.py"))
    assert paths, "no benchmarks?"
    for path in paths:
        assert not _imported(path, "tests"), f"{path.relative_to(ROOT)} imports the test suite"
