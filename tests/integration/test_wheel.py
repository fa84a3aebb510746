"""The wheel installs one import name, `ortserve` (#28 item 1), and a wheel built from the
sdist is the same wheel (hatch_build.py).

The source folders stay where docs/architecture.md puts them (core/, functions/, edge/, build/bake/)
and `ortserve/` maps them in: a wheel built from this tree, installed into an empty
venv, must leave `ortserve` and its dist-info in site-packages and nothing else (no
top-level `core` or `functions` to collide with other packages).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PIP = (sys.executable, "-m", "pip")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: hatchling comes with the dev extra, so no index is needed.
    subprocess.run(
        [*_PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("ortserve-*.whl")
    return built


def test_the_wheel_holds_one_package_with_every_part(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = wheel.name.split("-py3")[0] + ".dist-info"  # ortserve-VERSION.dist-info
    assert tops == {"ortserve", dist_info}
    assert f"{dist_info}/licenses/LICENSE" in names  # MIT, and the vendored scripts' own
    assert f"{dist_info}/licenses/core/vendor/LICENSE.marked.md" in names
    for part in (
        "ortserve/__init__.py",
        "ortserve/py.typed",
        "ortserve/cli.py",
        "ortserve/core/engine.py",
        "ortserve/core/playground.html",
        "ortserve/core/vendor/marked.umd.js",
        "ortserve/functions/aws/handler.py",
        "ortserve/functions/aws/Dockerfile",
        "ortserve/functions/gcp/main.py",
        "ortserve/edge/daemon.py",
        "ortserve/bake/pipeline.py",
    ):
        assert part in names, part
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    )
    assert b"ortserve = ortserve.cli:main" in entry_points


def test_an_installed_wheel_leaves_ortserve_alone_in_site_packages(
    wheel: Path, tmp_path: Path
) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [*_PIP, "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    installed = sorted(p.name for p in Path(purelib).iterdir() if p.name != "__pycache__")
    assert len(installed) == 2, installed
    assert installed[0] == "ortserve"
    assert installed[1].startswith("ortserve-") and installed[1].endswith(".dist-info")
    # The package imports without its dependencies: the Python API loads on first use.
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import ortserve, ortserve.core, ortserve.bake; print(ortserve.__all__)",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert "TextGenerator" in probe.stdout
    assert sysconfig.get_paths()["purelib"] != purelib  # a venv of its own, not ours


def test_a_wheel_built_from_the_sdist_is_the_wheel_built_from_the_tree(
    wheel: Path, tmp_path: Path
) -> None:
    """As `python -m build` and `uv build` make it: sdist first, then the wheel from the
    unpacked sdist, which holds no symlinks (it had the front only: 16 files, no engine)."""
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=ROOT,
        check=True,
        timeout=300,
        capture_output=True,
    )
    (sdist,) = tmp_path.glob("ortserve-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (src,) = (tmp_path / "src").iterdir()
    assert not any(p.is_symlink() for p in src.rglob("*"))
    out = tmp_path / "wheel"
    subprocess.run(
        [*_PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        timeout=300,
    )
    (from_sdist,) = out.glob("ortserve-*.whl")
    tree, built = zipfile.ZipFile(wheel), zipfile.ZipFile(from_sdist)
    assert sorted(built.namelist()) == sorted(tree.namelist())
    assert [n for n in tree.namelist() if tree.read(n) != built.read(n)] == []


def test_an_editable_wheel_maps_the_one_name(tmp_path: Path) -> None:
    """`pip install -e .` (what `make test` does): the editable wheel maps `ortserve` to
    ortserve/ through editables' import hook and puts no folder on sys.path (the repository
    root there made `core`, `edge`, `tests`... packages of their own)."""
    from hatchling.builders.wheel import WheelBuilder

    (built,) = WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["editable"])
    archive = zipfile.ZipFile(built)
    pth = [n for n in archive.namelist() if n.endswith(".pth")]
    assert pth == ["_editable_impl_ortserve.pth"], archive.namelist()
    hook = archive.read("_editable_impl_ortserve.py").decode()
    assert re.findall(r"map_module\('([^']+)'", hook) == ["ortserve"], hook
    assert f"'{ROOT / 'ortserve' / '__init__.py'}'" in hook


def test_the_editable_install_loads_each_module_once(tmp_path: Path) -> None:
    """This checkout's installed editable, from a folder elsewhere: only `ortserve` imports,
    from this tree, and no module of it loads a second time under another name."""
    names = ("core", "edge", "functions", "bake", "build", "tests", "benchmarks")
    script = (
        "import importlib.util, json, sys\n"
        "import ortserve.core.errors, ortserve.edge.daemon, ortserve.functions.gcp.main\n"
        "import ortserve.bake.pipeline\n"
        f"print(json.dumps({{'spec': [n for n in {names!r} if importlib.util.find_spec(n)],\n"
        "  'file': ortserve.__file__, 'modules': sorted(sys.modules)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    seen = json.loads(run.stdout)
    assert seen["spec"] == []
    assert Path(seen["file"]) == ROOT / "ortserve" / "__init__.py"
    twice = [m for m in seen["modules"] if m.split(".")[0] in names]
    assert twice == []
