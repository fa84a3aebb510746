"""What every target's packager shares: the model's folder name in a bundle, the runtime's
pinned distributions, and copying the runtime code (bake.package and the per-target
packagers import this; it imports none of them)."""

from __future__ import annotations

import importlib.util
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

MODEL_SUBDIR = "model"

# The runtime's dependencies, pinned to the versions installed (and tested) here.
RUNTIME_DISTRIBUTIONS = (
    "onnxruntime-genai", "pydantic", "pydantic-core", "pydantic-settings", "numpy", "jinja2",
    "tokenizers", "shtab",
)  # fmt: skip
# Versions this project was tested with, for tools the bake machine may not have.
_TESTED = {
    "functions-framework": "3.10.2",
    "uvicorn": "0.54.0",
    "h11": "0.16.0",
    "click": "8.5.1",
    "prometheus-client": "0.26.0",
}
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def write_lines(path: Path, lines: list[str]) -> None:
    """Write `lines` to `path`, one per line (requirements and constraints files)."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def package_dir(name: str) -> Path:
    """Where the importable package `name` lives (works for editable installs too)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name} is not importable: is ortserve installed?")
    return Path(next(iter(spec.submodule_search_locations)))


def pinned(distributions: tuple[str, ...]) -> list[str]:
    """`name==version` lines for the installed versions of `distributions`."""
    lines = []
    for dist in distributions:
        try:
            lines.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            lines.append(f"{dist}=={_TESTED[dist]}")
    return lines


def copy_runtime_code(dest: Path, functions_subpackages: tuple[str, ...]) -> None:
    """Copy the runtime packages (core and the named `functions` adapters) into `dest`."""
    shutil.copytree(package_dir("core"), dest / "core", ignore=IGNORE)
    functions = package_dir("functions")
    (dest / "functions").mkdir()
    shutil.copy2(functions / "__init__.py", dest / "functions" / "__init__.py")
    for sub in functions_subpackages:
        shutil.copytree(functions / sub, dest / "functions" / sub, ignore=IGNORE)
