"""Local model stores for the CLI's tests: an entry made as `ortserve run` makes one (the
tiny model copied in, so nothing is baked), the environment that points the real `ortserve`
at it, and `make demo` run against it."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from benchmarks.support.servers import ServerProcess, free_port
from ortserve import store
from tests.models import ROOT

TINY = "builtin:tiny-llama"


def spec(source: str = TINY, target: str = "edge-x86_64", **choices: object) -> dict[str, object]:
    """The store spec `ortserve run SOURCE --target TARGET` keys its entry by (`choices`:
    precision, revision, ...)."""
    return {
        "source": source,
        "revision": None,
        "target": target,
        "precision": None,
        "options": {},
        **choices,
    }


def stored(home: Path, entry_spec: dict[str, object], model_dir: Path | None = None) -> str:
    """Put a model in the store under `home` as `ortserve run` would (a copy of
    `model_dir`, else a folder of one file); its id."""
    name = store.entry_name(entry_spec)
    entry = home / "models" / name
    if model_dir is not None:
        shutil.copytree(model_dir, entry / store.MODEL_SUBDIR)
    else:
        (entry / store.MODEL_SUBDIR).mkdir(parents=True)
        (entry / store.MODEL_SUBDIR / "model.onnx").write_bytes(b"x" * 1000)
    store.record(entry, entry_spec)
    return name


def store_env(home: Path) -> dict[str, str]:
    """The environment for the real `ortserve` (this tree's code) on the store at `home`."""
    return {
        "ORTSERVE_HOME": str(home),
        "ORTSERVE_CACHE_DIR": str(home.parent / "cache"),
        "PYTHONPATH": f"{ROOT}:{ROOT / 'build'}",
        "ORTSERVE_PROVIDERS": "cpu",
    }


def make_demo(
    home: Path, port: int, venv: Path, model: str = TINY, prompt: str | None = "Hi"
) -> ServerProcess:
    """`make demo` of `model` on `port`, with `venv` standing for the project's: started,
    in a session of its own (signals reach what make starts), not yet waited for; it asks
    `prompt` first (None: its own question)."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    for tool in ("python", "ortserve"):
        link = venv / "bin" / tool
        if not link.exists():
            link.symlink_to(Path(sys.executable).parent / tool)
    (venv / ".bake-installed").touch()  # -o below: make never reinstalls it either
    cmd = [
        "make",
        "--no-print-directory",
        "-C",
        str(ROOT),
        "demo",
        f"VENV={venv}",
        "-o",
        f"{venv}/.bake-installed",
        f"MODEL={model}",
        "TARGET=edge-x86_64",
        f"PORT={port}",
        *([f"PROMPT={prompt}"] if prompt is not None else []),
    ]
    return ServerProcess(cmd, {**os.environ, **store_env(home)}, port, group=True)


@contextlib.contextmanager
def demo(
    home: Path, venv: Path, model: str = TINY, prompt: str | None = "Hi"
) -> Iterator[ServerProcess]:
    """`make demo` of `model` while it serves; SIGTERM to it all after."""
    with make_demo(home, free_port(), venv, model, prompt) as server:
        server.wait_ready(300)
        yield server
        server.stop(60)
