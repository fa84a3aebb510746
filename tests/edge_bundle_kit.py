"""Edge bundles for the tests and what the tests do with them: install, list, serve.

`edge_bundle(target)` packages the cached tiny-model bake with the real
`bake.package_edge` (the wheels come from its own cache) and caches the bundle under
`.cache/test-models/`, keyed by everything that goes into it; `synthetic_bundle` writes
a small bundle without wheels for tests that stop before pip runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.support.servers import serve_process
from ortserve.bake.package_edge import INFO_NAME, package_edge, write_bundle_manifest
from ortserve.bake.targets import get_target
from tests import models

ROOT = models.ROOT
EDGE = ROOT / "edge"
MODEL_SOURCE = "builtin:tiny-llama"
UNIT_REL = "etc/systemd/system/ortserve.service"
ENV_REL = "etc/ortserve/ortserve.env"
VENV_REL = "opt/ortserve/venv"
MODEL_REL = "var/lib/ortserve/current"  # a symlink to models/<manifest digest>


def _bundle_key(target: str) -> str:
    """Everything that shapes a bundle: the code in the ortserve wheel, edge/'s files,
    pyproject.toml (pins, build backend) and the installed versions (via models' key)."""
    digest = hashlib.sha256(models._key(MODEL_SOURCE, target).encode())
    files = [ROOT / "pyproject.toml"]
    for folder in ("core", "edge", "functions", "build/bake"):
        files += (p for p in (ROOT / folder).rglob("*") if p.is_file())
    for path in sorted(p for p in files if "__pycache__" not in p.parts):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def edge_bundle(target: str) -> Path:
    """The tiny model's edge bundle for `target` (edge-aarch64 or edge-x86_64), cached.

    Packaged here from the bake's model rather than taken from the bake's output, so
    that it follows changes to edge/ (install.sh, the unit) at once.
    """
    model = models.baked(MODEL_SOURCE, target=target, package=False) / "model"
    name = f"edge-bundle-{target}-{_bundle_key(target)}"
    if not (models.CACHE / name / ".complete").is_file():
        # Each bundle is ~110 MB: older ones for this target go.
        for old in models.CACHE.glob(f"edge-bundle-{target}-*"):
            if old.name.removesuffix(".lock") != name:
                shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()

    def make(out: Path) -> None:
        bundle = out / "bundle"
        bundle.mkdir(parents=True)
        shutil.copytree(model, bundle / "model")
        package_edge(get_target(target), bundle)

    return models._cached(name, make) / "bundle"


def copy_bundle(bundle: Path, dest: Path) -> Path:
    """A copy of `bundle` that the test may change (hard links: change files by replacing)."""
    shutil.copytree(bundle, dest, copy_function=os.link)
    return dest


def replace_file(path: Path, data: bytes) -> None:
    """Give `path` new contents without touching other hard links to it."""
    path.unlink()
    path.write_bytes(data)


def synthetic_bundle(dest: Path, arch: str = "x86_64") -> Path:
    """A bundle with the real install.sh, unit and settings file, a fake model and fake
    wheels: enough for everything install.sh does before it runs pip."""
    dest.mkdir(parents=True)
    for name, source in (
        ("install.sh", "install.sh"),
        ("ortserve.service", "ortserve.service"),
        ("ortserve.env", "ortserve.env"),
    ):
        shutil.copy2(EDGE / source, dest / name)
    (dest / "model").mkdir()
    (dest / "model" / "manifest.json").write_text('{"model_name": "fake"}\n', encoding="utf-8")
    (dest / "model" / "model.onnx").write_bytes(b"not really a model")
    (dest / "wheels").mkdir()
    for wheel in ("pip-23.2.1-py3-none-any.whl", "ortserve-0.1.0-py3-none-any.whl"):
        (dest / "wheels" / wheel).write_bytes(b"not really a wheel")
    (dest / "requirements.txt").write_text("ortserve[edge]==0.1.0\npip==23.2.1\n", "utf-8")
    (dest / "constraints.txt").write_text("ortserve==0.1.0\n", encoding="utf-8")
    (dest / INFO_NAME).write_text(
        f"target=edge-{arch}\narch={arch}\npython=3.11 3.12\nglibc=2.28\nortserve=0.1.0\n",
        encoding="utf-8",
    )
    write_bundle_manifest(dest)
    return dest


def fake_python(folder: Path, report: str) -> Path:
    """A `--python` that answers install.sh's probe with `report`
    ("MACHINE BITS MAJOR.MINOR glibc-X.Y") and does nothing else."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "python3"
    script.write_text(f"#!/bin/sh\necho '{report}'\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def host_report() -> str:
    """What install.sh's probe says about the Python running the tests."""
    import platform
    import sys

    libc = (os.confstr("CS_GNU_LIBC_VERSION") or "none").replace(" ", "-")
    return f"{platform.machine()} 64 {sys.version_info[0]}.{sys.version_info[1]} {libc}"


def install(
    bundle: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the bundle's install.sh with `args` (the tests always pass --prefix) as the docs
    say to: from the bundle's folder (or `cwd`), never the checkout, whose own sources
    would be importable from there; in `env` (None: this process's), less the variables
    that point Python at other code."""
    base = os.environ if env is None else env
    clean = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(
        ["sh", "./install.sh" if cwd is None else str(bundle / "install.sh"), *args],
        capture_output=True,
        text=True,
        env=clean,
        timeout=timeout,
        check=False,
        cwd=bundle if cwd is None else cwd,
    )


def venv_stamp(bundle: Path, python: Path) -> str:
    """The stamp install.sh leaves in a venv built from `bundle` with `python`."""
    wanted = re.compile(r"  (wheels/.*|requirements\.txt|constraints\.txt)$")
    manifest = (bundle / "BUNDLE-MANIFEST.sha256").read_text(encoding="utf-8")
    lines = "".join(f"{line}\n" for line in manifest.splitlines() if wanted.search(line))
    return f"wheels={hashlib.sha256(lines.encode()).hexdigest()} python={python}\n"


def listing(folder: Path) -> dict[str, tuple[int, int, int, int, str]]:
    """Every path under `folder`: mode, size, mtime and ctime (ns), link target. Any write,
    replacement or chmod changes the ctime, so equal listings mean nothing changed."""
    out: dict[str, tuple[int, int, int, int, str]] = {}
    for path in [folder, *folder.rglob("*")]:
        st = path.lstat()
        link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
        out[path.relative_to(folder).as_posix()] = (
            st.st_mode,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            link,
        )
    return out


def unit_command(prefix: Path) -> tuple[list[str], dict[str, str]]:
    """The installed unit's ExecStart and environment (Environment=, then EnvironmentFile=),
    as systemd would give them to the daemon."""
    argv: list[str] = []
    env: dict[str, str] = {}
    env_files: list[Path] = []
    for line in (prefix / UNIT_REL).read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "ExecStart":
            argv = shlex.split(value)
        elif key == "Environment":
            for pair in shlex.split(value):
                name, _, val = pair.partition("=")
                env[name] = val
        elif key == "EnvironmentFile":
            env_files.append(Path(value.removeprefix("-")))
    for path in env_files:
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                name, sep, val = line.strip().partition("=")
                if sep and not name.startswith("#"):
                    env[name] = val
    return argv, env


@contextmanager
def serve_installed(prefix: Path, port: int, timeout_s: float = 180) -> Iterator[str]:
    """Start the installed daemon as its unit would (ExecStart and environment) on `port`."""
    argv, unit_env = unit_command(prefix)
    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ORTSERVE_", "NOTIFY_", "WATCHDOG_"))
    }
    env = {**base_env, **unit_env, "ORTSERVE_PORT": str(port)}
    with serve_process(argv, env, port, ready_timeout_s=timeout_s) as server:
        yield server.base


class Stopwatch:
    """Seconds since it was made (for the timings a test reports)."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.start
