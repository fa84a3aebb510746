"""What docs/architecture.md says of the code, where a test can say it too (the layering's
claims are pyproject.toml's import-linter contracts and tests/unit/test_layering.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
FOLDERS = ("core", "edge", "functions", "build/bake", "ortserve")
# Where an error of the one hierarchy may be declared: core/errors.py, and the two the
# module table names beside what raises them.
ERROR_MODULES = {"core/errors.py", "core/content_filter.py", "functions/aws/errors.py"}


def _classes() -> dict[str, tuple[str, set[str]]]:
    """Every class of the package: its module's path and its bases' names."""
    found: dict[str, tuple[str, set[str]]] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py" if folder == "ortserve" else "**/*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                    found[node.name] = (path.relative_to(ROOT).as_posix(), bases)
    return found


def _errors(classes: dict[str, tuple[str, set[str]]]) -> dict[str, str]:
    """The classes that derive from OrtServeError (HTTP status and code), by name."""
    errors = {"OrtServeError": classes["OrtServeError"][0]}
    grew = True
    while grew:
        more = {n: m for n, (m, bases) in classes.items() if bases & errors.keys()}
        grew = not more.keys() <= errors.keys()
        errors |= more
    return errors


def test_every_error_with_a_status_is_where_the_docs_say() -> None:
    errors = _errors(_classes())
    assert len(errors) > 10 and "ContentFilterError" in errors  # the walk sees subclasses
    assert set(errors.values()) <= ERROR_MODULES, errors
    for module in ERROR_MODULES - {"core/errors.py"}:
        assert f"`{module}`" in ARCHITECTURE, module
