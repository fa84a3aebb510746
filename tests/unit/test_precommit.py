"""The pre-commit hooks (.pre-commit-config.yaml; #28 item 9): the lint hooks run
`make lint`'s own tools, and the commit-msg hook refuses a subject over 72 characters."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    assert set(config["default_install_hook_types"]) == {"pre-commit", "commit-msg"}
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_the_lint_hooks_are_make_lints_tools() -> None:
    hooks = _hooks()
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for name in ("ruff-format", "ruff-check", "mypy"):
        command = hooks[name]["entry"].replace(".venv/bin/", "$(BIN)/")
        assert command in makefile, command  # the same command as `make lint`
        assert (ROOT / hooks[name]["entry"].split()[0]).is_file()


def test_a_long_commit_subject_is_refused(tmp_path: Path) -> None:
    entry = shlex.split(_hooks()["subject-length"]["entry"])
    for subject, refused in (("x" * 72, False), ("x" * 73, True)):
        message = tmp_path / "COMMIT_EDITMSG"
        message.write_text(f"{subject}\n\nThe story, as long as it needs to be.\n")
        proc = subprocess.run([*entry, str(message)], capture_output=True, text=True, check=False)
        assert (proc.returncode != 0) == refused, proc.stderr
        assert ("73 characters" in proc.stderr) == refused


def test_ruff_format_owns_the_layout() -> None:
    """No ruff-format skip markers (there were 390): the formatter's layout, everywhere."""
    skipped = [
        str(path.relative_to(ROOT))
        for folder in ("core", "edge", "functions", "build", "ortserve", "tests", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if "# fmt: " + "skip" in path.read_text(encoding="utf-8")
    ]
    assert not skipped, skipped
