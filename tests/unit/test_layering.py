"""The layering rules of docs/architecture.md, checked by parsing imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = {"flask", "functions_framework", "awslambdaric", "boto3", "uvicorn", "starlette"}
# The parts of the one package `ortserve`, by folder: the layout of docs/architecture.md
# (pyproject.toml; ortserve/core etc. are links to the folders).
PARTS = {"core": "core", "functions": "functions", "edge": "edge", "bake": "build/bake"}
FRONT = ROOT / "ortserve"
OLD_NAMES = {"core", "functions", "edge", "bake", "build"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "ortserve":  # `from ortserve import store`
                names.update(f"ortserve.{alias.name}" for alias in node.names)
    return names


def _py(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def _front() -> list[Path]:
    """The front's own modules: ortserve/*.py (not the parts linked in)."""
    return sorted(FRONT.glob("*.py"))


def _part(name: str) -> str | None:
    """Which part of ortserve the module `name` is in: core, functions, edge, bake, or
    "front" (ortserve itself and its own modules); None outside ortserve."""
    pieces = name.split(".")
    if pieces[0] != "ortserve":
        return None
    return pieces[1] if len(pieces) > 1 and pieces[1] in PARTS else "front"


def _parts_imported(path: Path) -> set[str]:
    return {p for p in map(_part, _imports(path)) if p is not None}


def test_every_folder_maps_into_the_one_package() -> None:
    for part, folder in PARTS.items():
        link = FRONT / part
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), part
    assert {p.name for p in FRONT.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(PARTS)


def test_code_imports_only_the_one_name() -> None:
    """No module anywhere (the parts, the front, tests, benchmarks) imports a part by its
    folder's name: `import core` works in a source checkout only, never from the wheel."""
    paths = _py(*PARTS.values(), "tests", "benchmarks") + _front()
    for path in paths:
        tops = {name.split(".")[0] for name in _imports(path)}
        assert not tops & OLD_NAMES, f"{path.relative_to(ROOT)} imports {tops & OLD_NAMES}"


def test_core_imports_only_core() -> None:
    assert _py("core"), "core has no modules?"
    for path in _py("core"):
        tops = {name.split(".")[0] for name in _imports(path)}
        assert not tops & PLATFORM, f"{path.name} imports {tops & PLATFORM}"
        assert _parts_imported(path) <= {"core"}, f"{path.name} imports {_parts_imported(path)}"


def test_bake_imports_core_and_itself_only() -> None:
    """The bake is a library the front drives: it never imports the front (CLI, store),
    the daemon or the serverless adapters."""
    for path in _py("build"):
        parts = _parts_imported(path)
        assert parts <= {"core", "bake"}, f"{path.relative_to(ROOT)} imports {parts}"


def test_adapters_import_core_and_never_the_front_or_the_bake() -> None:
    for path in _py("edge", "functions"):
        parts = _parts_imported(path)
        assert parts <= {"core", "edge", "functions"}, f"{path.relative_to(ROOT)} imports {parts}"


def test_the_front_imports_its_parts_by_the_one_name() -> None:
    """The front (CLI, store, Python API) sits on top: it may import every part; the
    checks above make sure no part imports it. Here: the front imports only ortserve's
    own parts and modules by the one name."""
    assert {p.name for p in _front()} >= {"__init__.py", "cli.py", "store.py", "textgen.py"}
    for path in _front():
        assert _parts_imported(path) <= {*PARTS, "front"}, path


def test_onnxruntime_genai_is_imported_in_exactly_one_module() -> None:
    """The runtime's og is core.engine's; the bake's is og's model builder, run (with its
    work-arounds) from bake.upstream alone."""
    users = [
        p.relative_to(ROOT).as_posix()
        for p in _py("core", "edge", "functions", "build")
        if any(n.split(".")[0] == "onnxruntime_genai" for n in _imports(p))
    ]
    assert users == ["core/engine.py", "build/bake/upstream.py"]


_ENV_NAMES = {"environ", "environb", "getenv", "getenvb"}


def _reads_environment(source: str) -> bool:
    """Whether `source` reads the process environment: `os.environ`, `os.getenv`, or the
    same names imported from os (`from os import environ`)."""
    if "os.environ" in source or "getenv" in source:
        return True
    tree = ast.parse(source)
    os_names = {"os"} | {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "os" and alias.asname
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and node.level == 0:
            if any(alias.name in _ENV_NAMES for alias in node.names):
                return True
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in _ENV_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id in os_names
        ):
            return True
    return False


def test_environment_is_read_only_in_settings_modules() -> None:
    """Every part and the front read ORTSERVE_* (and the rest of the environment) through
    their settings modules alone."""
    for path in _py(*PARTS.values()) + _front():
        if path.name == "settings.py":
            continue
        assert not _reads_environment(path.read_text(encoding="utf-8")), path


def test_the_environment_check_sees_every_spelling() -> None:
    for source in (
        "import os\nx = os.environ['A']",
        "import os\nos.getenv('A')",
        "from os import environ\nx = environ['A']",
        "from os import getenv as g",
        "import os as o\nx = o.environ",
    ):
        spelled = source.replace("os.environ", "os .environ").replace("os.getenv", "os .getenv")
        assert _reads_environment(source) and _reads_environment(spelled), source
    assert not _reads_environment("def f(request):\n    return request.environ['PATH_INFO']")


# Each adapter is a package of its own; the streaming Lambda image runs the edge daemon
# (its ASGI app behind the Lambda Web Adapter): the one allowed edge between adapters.
_ADAPTER_PACKAGES = ("ortserve.edge", "ortserve.functions.aws", "ortserve.functions.gcp")
_ALLOWED = {("functions/aws/serve.py", "ortserve.edge")}


def _adapter(module: str) -> str | None:
    return next((a for a in _ADAPTER_PACKAGES if module == a or module.startswith(f"{a}.")), None)


def test_adapters_never_import_each_other() -> None:
    for path in _py("edge", "functions"):
        rel = path.relative_to(ROOT).as_posix()
        own = _adapter("ortserve." + rel.removesuffix(".py").replace("/", "."))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _imports(path) | {
            f"{node.module}.{alias.name}"  # `from ortserve.functions import gcp`
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module in ("ortserve.functions", "ortserve.edge")
            for alias in node.names
        }
        others = {a for a in map(_adapter, names) if a is not None and a != own}
        assert others <= {a for r, a in _ALLOWED if r == rel}, f"{rel} imports {others}"


def test_adapters_records_and_the_api_import_without_onnxruntime_genai() -> None:
    """What adapters import at start (the API, records, error payloads, the SSE encoder,
    events) does not import onnxruntime-genai: it comes with the first model load."""
    import subprocess
    import sys

    modules = [
        "ortserve.core.api",
        "ortserve.core.state",
        "ortserve.core.records",
        "ortserve.core.http",
        "ortserve.core.logs",
        "ortserve.edge.asgi",
        "ortserve.edge.logs",
        "ortserve.edge.metrics",
        "ortserve.functions.aws.buffer",
        "ortserve.functions.aws.events",
        "ortserve.functions.aws.coldstart",
        "ortserve.functions.gcp.translate",
    ]
    code = f"import sys; import {', '.join(modules)}; print('onnxruntime_genai' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "False", out.stderr
