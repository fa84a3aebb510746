"""Import-graph rules beside docs/architecture.md's layering (tests/unit/test_layering.py): the
modules of `ortserve` (every part and the front) import each other without a cycle, and
the benchmarks never import the test suite."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported(path: Path, package: str) -> set[str]:
    """The modules of `package` that `path` imports when it runs, at module level or inside
    functions (`import package.x`, `from package.x import y`, `from package import x`)."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {  # `if TYPE_CHECKING:` imports run for the type checker alone
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == package:  # `from ortserve import store`: the module only
                names.update(f"{package}.{alias.name}" for alias in node.names)
            else:
                names.add(node.module)
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


def _modules() -> dict[str, Path]:
    """Every module of the one package `ortserve`, by its installed name (the parts' folders
    are linked into ortserve/: see pyproject.toml)."""
    found = {}
    paths = [
        Path(folder, name)
        for folder, _, names in os.walk(ROOT / "ortserve", followlinks=True)
        for name in names
        if name.endswith(".py")
    ]
    for path in sorted(paths):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = path
    return found


def test_the_package_covers_every_folder() -> None:
    modules = _modules()
    for name in (
        "ortserve.cli",
        "ortserve.core.engine",
        "ortserve.bake.sources",
        "ortserve.edge.daemon",
        "ortserve.functions.aws.handler",
    ):
        assert name in modules, name


def test_ortserve_modules_import_each_other_without_a_cycle() -> None:
    """Module-level and function-level imports alike, across core, functions, edge, the
    bake and the front."""
    modules = _modules()
    graph = {name: _imported(path, "ortserve") & modules.keys() for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_benchmarks_never_import_tests() -> None:
    paths = sorted((ROOT / "benchmarks").rglob("*.py"))
    assert paths, "no benchmarks?"
    for path in paths:
        assert not _imported(path, "tests"), f"{path.relative_to(ROOT)} imports the test suite"
