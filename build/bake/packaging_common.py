"""What every target's packager shares: the model's folder name in a bundle, the runtime's
pinned distributions, and copying the runtime code (bake.package and the per-target
packagers import this; it imports none of them)."""

from __future__ import annotations

import importlib.util
import shutil
from importlib.metadata import PackageNotFoundError, distribution, requires, version
from pathlib import Path

MODEL_SUBDIR = "model"

# What only the front (the `ortserve` command) uses: `ortserve completion`'s generator.
# The serverless images run core and an adapter, never the command: it stays out of them.
FRONT_DISTRIBUTIONS = ("shtab",)
# An editable install's own import hook: hatchling adds it to the editable wheel's metadata
# (`dev-mode-exact`), so a bake from a checkout sees it; no runtime imports it.
_EDITABLE_HOOK = "editables"


def runtime_distributions() -> tuple[str, ...]:
    """The runtime's dependencies, as ortserve's own metadata (pyproject.toml's
    `dependencies`) names them, but the front's: every image pins these to the versions
    installed (and tested) here."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        declared = [Requirement(line) for line in requires("ortserve") or []]
    except PackageNotFoundError:
        raise RuntimeError("ortserve's metadata is missing: is ortserve installed?") from None
    names = [canonicalize_name(r.name) for r in declared if r.marker is None]
    left_out = (*FRONT_DISTRIBUTIONS, _EDITABLE_HOOK)
    return tuple(n for n in dict.fromkeys(names) if n not in left_out)


RUNTIME_DISTRIBUTIONS = runtime_distributions()
# Versions this project was tested with, for tools the bake machine may not have.
_TESTED = {
    "functions-framework": "3.10.2",
    "uvicorn": "0.55.0",
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


def _copy_py(src: Path, dest: Path) -> None:
    """Copy the Python modules of one folder (no subfolders, no data files)."""
    dest.mkdir(parents=True)
    for path in sorted(src.glob("*.py")):
        shutil.copy2(path, dest / path.name)


def copy_runtime_code(
    dest: Path, functions_subpackages: tuple[str, ...] = (), *, edge: bool = False
) -> None:
    """Copy the runtime into `dest/ortserve`, as the wheel lays it out: the package's
    `__init__`, `ortserve.core` (with its data files), the named `ortserve.functions`
    adapters, and `ortserve.edge`'s modules when `edge` (the streaming Lambda image and
    Cloud Run run the edge daemon). The front's CLI, store and Python API stay out."""
    package = dest / "ortserve"
    package.mkdir()
    shutil.copy2(package_dir("ortserve") / "__init__.py", package / "__init__.py")
    shutil.copytree(package_dir("ortserve.core"), package / "core", ignore=IGNORE)
    if functions_subpackages:
        functions = package_dir("ortserve.functions")
        (package / "functions").mkdir()
        shutil.copy2(functions / "__init__.py", package / "functions" / "__init__.py")
        for sub in functions_subpackages:
            _copy_py(functions / sub, package / "functions" / sub)
    if edge:
        _copy_py(package_dir("ortserve.edge"), package / "edge")


# The marker environment of the images built from a bake (CPython 3.12 on Linux).
_IMAGE_PYTHON = "3.12"


def pinned_closure(distributions: tuple[str, ...], machine: str = "x86_64") -> list[str]:
    """`name==version` for `distributions` and every distribution they need, transitively.

    The versions are the ones installed (and tested) here; requirement markers are
    evaluated for the image (CPython 3.12, Linux, `machine`), not for this interpreter,
    so a dependency only 3.12 needs is not missed. An image installs the list with
    `--no-deps`: nothing floats.

    Raises:
        RuntimeError: A distribution of the closure is not installed here.
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = {
        "python_version": _IMAGE_PYTHON,
        "python_full_version": f"{_IMAGE_PYTHON}.0",
        "implementation_version": f"{_IMAGE_PYTHON}.0",
        "platform_machine": machine,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_version": "",
    }
    found: dict[str, tuple[str, str, frozenset[str]]] = {}  # key: (name, version, extras)
    todo = [(name, frozenset[str]()) for name in distributions]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in found and extras <= found[key][2]:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise RuntimeError(
                f"{name} is not installed here, so its dependencies cannot be pinned: "
                "install ortserve[edge] (or the package) in the bake's environment"
            ) from None
        found[key] = (key, dist.version, extras | found.get(key, ("", "", frozenset()))[2])
        for raw in dist.requires or []:
            req = Requirement(raw)
            wanted = extras | {""}
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in wanted):
                todo.append((req.name, frozenset(req.extras)))
    return [f"{name}=={ver}" for name, ver, _ in sorted(found.values())]
