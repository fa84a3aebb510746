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
    users = [
        p.relative_to(ROOT).as_posix()
        for p in _py("core", "edge", "functions", "build")
        if any(n.split(".")[0] == "onnxruntime_genai" for n in _imports(p))
    ]
    assert users == ["core/engine.py"]


def test_runtime_never_imports_bake() -> None:
    for path in _py("core", "edge", "functions"):
        tops = {name.split(".")[0] for name in _imports(path)}
        assert "bake" not in tops, f"{path} imports bake"


def test_environment_is_read_only_in_settings_modules() -> None:
    for path in _py("core", "edge", "functions"):
        if path.name == "settings.py":
            continue
        assert "os.environ" not in path.read_text(encoding="utf-8"), path
        assert "getenv" not in path.read_text(encoding="utf-8"), path


def test_the_python_api_package_is_a_name_over_core() -> None:
    for path in _py("ortserve"):
        tops = {name.split(".")[0] for name in _imports(path)}
        assert tops <= {"__future__", "core"}, f"{path.name} imports {tops}"


def test_adapters_records_and_the_api_import_without_onnxruntime_genai() -> None:
    """What adapters import at start (the API, records, error payloads, the SSE encoder,
    events) does not import onnxruntime-genai: it comes with the first model load."""
    import subprocess
    import sys

    modules = ["core.api", "core.state", "core.records", "core.http", "edge.asgi", "edge.logs",
               "edge.metrics", "functions.aws.buffer", "functions.aws.events"]  # fmt: skip
    code = f"import sys; import {', '.join(modules)}; print('onnxruntime_genai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr
