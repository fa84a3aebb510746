"""The layering rules of DESIGN.md, checked by parsing imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = {"flask", "functions_framework", "awslambdaric", "boto3", "uvicorn", "starlette"}
ADAPTERS = {"functions", "edge", "bake", "build"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _py(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def test_core_imports_no_adapter_bake_or_platform_library() -> None:
    assert _py("core"), "core has no modules?"
    for path in _py("core"):
        tops = {name.split(".")[0] for name in _imports(path)}
        assert not tops & (ADAPTERS | PLATFORM), (
            f"{path.name} imports {tops & (ADAPTERS | PLATFORM)}"
        )


def test_onnxruntime_genai_is_imported_in_exactly_one_module() -> None:
    """The runtime's og is core.engine's; the bake's is og's model builder, run (with its
    work-arounds) from bake.upstream alone."""
    users = [
        p.relative_to(ROOT).as_posix()
        for p in _py("core", "edge", "functions", "build")
        if any(n.split(".")[0] == "onnxruntime_genai" for n in _imports(p))
    ]
    assert users == ["core/engine.py", "build/bake/upstream.py"]


def test_runtime_never_imports_bake() -> None:
    for path in _py("core", "edge", "functions"):
        tops = {name.split(".")[0] for name in _imports(path)}
        assert "bake" not in tops, f"{path} imports bake"


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
    for path in _py("core", "edge", "functions"):
        if path.name == "settings.py":
            continue
        assert not _reads_environment(path.read_text(encoding="utf-8")), path


def test_the_environment_check_sees_every_spelling() -> None:
    for source in ("import os\nx = os.environ['A']", "import os\nos.getenv('A')",
                   "from os import environ\nx = environ['A']", "from os import getenv as g",
                   "import os as o\nx = o.environ"):  # fmt: skip
        spelled = source.replace("os.environ", "os .environ").replace("os.getenv", "os .getenv")
        assert _reads_environment(source) and _reads_environment(spelled), source
    assert not _reads_environment("def f(request):\n    return request.environ['PATH_INFO']")


# Each adapter is a package of its own; the streaming Lambda image runs the edge daemon
# (its ASGI app behind the Lambda Web Adapter): the one allowed edge between adapters.
_ADAPTER_PACKAGES = ("edge", "functions.aws", "functions.gcp")
_ALLOWED = {("functions/aws/serve.py", "edge")}


def _adapter(module: str) -> str | None:
    return next((a for a in _ADAPTER_PACKAGES if module == a or module.startswith(f"{a}.")), None)


def test_adapters_never_import_each_other() -> None:
    for path in _py("edge", "functions"):
        rel = path.relative_to(ROOT).as_posix()
        own = _adapter(rel.removesuffix(".py").replace("/", "."))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _imports(path) | {
            f"{node.module}.{alias.name}"  # `from functions import gcp`
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in ("functions", "edge")
            for alias in node.names
        }
        others = {a for a in map(_adapter, names) if a is not None and a != own}
        assert others <= {a for r, a in _ALLOWED if r == rel}, f"{rel} imports {others}"


def test_the_python_api_package_is_a_name_over_core() -> None:
    for path in _py("ortserve"):
        tops = {name.split(".")[0] for name in _imports(path)}
        assert tops <= {"__future__", "core"}, f"{path.name} imports {tops}"


def test_adapters_records_and_the_api_import_without_onnxruntime_genai() -> None:
    """What adapters import at start (the API, records, error payloads, the SSE encoder,
    events) does not import onnxruntime-genai: it comes with the first model load."""
    import subprocess
    import sys

    modules = ["core.api", "core.state", "core.records", "core.http", "core.logs", "edge.asgi",
               "edge.logs", "edge.metrics", "functions.aws.buffer", "functions.aws.events",
               "functions.aws.coldstart", "functions.gcp.translate"]  # fmt: skip
    code = f"import sys; import {', '.join(modules)}; print('onnxruntime_genai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr
