"""Every package a module imports is declared where that module runs: the runtime's
dependencies for core/ and the front, the `edge`, `aws`, `gcp` and `bake` extras for their
folders, `dev` for tests and benchmarks (`bench` too for the benchmarks). Imports inside
functions count: a lazy import still fails where its package is missing. A package that
another's dependency brings is declared all the same when a module imports it (h11 beside
uvicorn, httpx2 beside huggingface_hub 2.x, flask beside functions-framework): else its
bound could move under us."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.tools import tool

ROOT = Path(__file__).resolve().parents[2]
# Folder → the requirement groups its modules may import from ("" is the runtime's own).
GROUPS = {
    "core": ("",),
    "ortserve": ("",),  # the front: ortserve/*.py only (the parts are linked folders)
    "edge": ("", "edge"),
    "functions/aws": ("", "aws"),
    "functions/gcp": ("", "gcp"),
    "functions": ("",),  # what both functions share
    "build/bake": ("", "bake"),
    "tests": ("dev",),
    "benchmarks": ("dev", "bench"),
}
# Imported names with no installed distribution to look up (the `bench` extra is not
# installed by `make test`; og's model builder is a module of onnxruntime-genai run as a
# script, on its own sys.path).
NOT_INSTALLED = {
    "llama_cpp": "llama-cpp-python",
    "matplotlib": "matplotlib",
    "builders": "onnxruntime-genai",
}
FIRST_PARTY = {"ortserve", "tests", "benchmarks", "hatch_build", "__future__"}


def _declared() -> dict[str, set[str]]:
    """Each group's requirement names, with `ortserve[...]` self-references expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    raw = {"": project["dependencies"], **project["optional-dependencies"]}
    groups: dict[str, set[str]] = {}

    def expand(group: str) -> set[str]:
        if group not in groups:
            names: set[str] = set() if group == "" else set(expand(""))
            for spec in raw[group]:
                req = Requirement(spec)
                if canonicalize_name(req.name) == "ortserve":
                    for extra in req.extras:
                        names |= expand(extra)
                else:
                    names.add(canonicalize_name(req.name))
            groups[group] = names
        return groups[group]

    for group in raw:
        expand(group)
    return groups


def _modules(folder: str) -> list[Path]:
    base = ROOT / folder
    if folder == "ortserve":
        return sorted(base.glob("*.py"))
    nested = [f for f in GROUPS if f != folder and f.startswith(f"{folder}/")]
    return [
        p
        for p in sorted(base.rglob("*.py"))
        if "node_modules" not in p.parts and not any(p.is_relative_to(ROOT / n) for n in nested)
    ]


def _imported(path: Path) -> set[str]:
    """Top-level names of the packages `path` imports when it runs, anywhere in it; not
    those under `if TYPE_CHECKING:` (stubs for mypy: the dev extra's boto3-stubs)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in FIRST_PARTY}


@functools.cache
def _installed() -> Mapping[str, list[str]]:
    return md.packages_distributions()


def _distributions(name: str) -> set[str]:
    if name in NOT_INSTALLED:
        return {NOT_INSTALLED[name]}
    found = _installed().get(name)
    assert found, f"{name} is imported but no installed distribution provides it"
    return {canonicalize_name(d) for d in found}


def test_every_imported_package_is_declared_for_its_folder() -> None:
    declared = _declared()
    missing: list[str] = []
    for folder, groups in GROUPS.items():
        allowed = set().union(*(declared[g] for g in groups))
        for path in _modules(folder):
            for name in sorted(_imported(path)):
                if not _distributions(name) & allowed:
                    where = path.relative_to(ROOT)
                    missing.append(f"{where}: {name} ({'/'.join(g or 'runtime' for g in groups)})")
    assert missing == []


def test_the_rule_sees_each_folder_and_a_missing_declaration() -> None:
    """The check reads every folder it names (none empty), and knows an undeclared import
    when it meets one: h11 is only uvicorn's dependency, not the runtime's."""
    assert all(_modules(folder) for folder in GROUPS)
    declared = _declared()
    assert "h11" in _imported(ROOT / "edge" / "connections.py")
    assert not _distributions("h11") & declared[""]
    assert _distributions("h11") & declared["edge"]


def test_a_missing_system_tool_fails_and_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/tools.py: a tool the suite runs is found, or the test fails (never skips)."""
    assert Path(tool("make")).is_file()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"shellcheck is missing: make system-deps"):
        tool("shellcheck")
