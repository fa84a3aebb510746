"""What the layering of docs/architecture.md needs beyond pyproject.toml's import-linter
contracts (`lint-imports`, run by `make lint`): the folders map into the one package, no
code imports a folder by its own name, only settings modules read the environment, and
what adapters import at start does not load onnxruntime-genai."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from hatch_build import FOLDERS

ROOT = Path(__file__).resolve().parents[2]
# The parts of the one package `ortserve`, by folder: the layout of docs/architecture.md.
# ortserve/core etc. are links to the folders; hatch_build.py maps the same folders into a
# wheel built from the sdist (which holds no links).
PARTS = FOLDERS
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


def test_every_folder_maps_into_the_one_package() -> None:
    """The links and the build hook's map say the same."""
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


def _loaded(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter has loaded once it imported `modules`."""
    code = (
        f"import sys; import {', '.join(modules)}; "
        f"print([m for m in {watched!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded: list[str] = ast.literal_eval(out.stdout.strip())
    return loaded


def test_adapters_records_and_the_api_import_without_onnxruntime_genai() -> None:
    """What adapters import at start (the API, records, error payloads, the SSE encoder,
    events) does not import onnxruntime-genai: it comes with the first model load."""
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
    assert _loaded(modules, ("onnxruntime_genai",)) == []


def test_the_daemons_commands_load_nothing_of_the_edge_extra() -> None:
    """`ortserve serve`, `reload` and `rollback` are registered from edge/cli.py in every
    install: importing it loads none of the `edge` extra (docs/architecture.md)."""
    assert _loaded(["ortserve.edge.cli"], ("uvicorn", "prometheus_client", "h11")) == []
    assert _loaded(["ortserve.edge.daemon"], ("uvicorn",)) == ["uvicorn"]  # the check sees it
