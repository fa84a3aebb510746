"""The edge targets' offline bundle: everything a board needs to install and start ortserve.

`ortserve bake --target edge-aarch64` (or `edge-x86_64`) writes, around `model/`:

    install.sh               the installer (POSIX sh; `sh install.sh --help`)
    README.md                what the bundle is, how to install it, where the guide is
                             (edge/README-board.md; the guide: docs/edge.md)
    ortserve.service         the systemd unit, its MemoryMax= from the model (core.sizing)
    sizing.json              the memory formula's terms for this model, and MemoryMax
    ortserve.env             the unit's settings file (installed once, never overwritten)
    wheels/                  every runtime wheel for the target's arch and Python 3.11 to 3.14,
                             plus the ortserve wheel and pip
    requirements.txt         what install.sh installs from wheels/ (ortserve[edge], pip)
    constraints.txt          every distribution pinned to the version tested here
    BUNDLE-INFO              arch, Pythons, minimum glibc, ortserve version (key=value)
    BUNDLE-MANIFEST.sha256   every other file's sha256, in `sha256sum -c` format

The folder is the bundle: the wheels are already compressed, so a tarball would only
double the disk it takes (`tar -czf` it, or `scp -r`/`rsync` it, to move it).

Wheels are downloaded once per (arch, pins) into a cache beside the project
(`.cache/wheelhouse/`), so later bakes work offline; a bake that has neither network
nor cache fails with one line that says so. The board never downloads anything.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from ortserve.bake.errors import BakeError, run_step, say
from ortserve.bake.packaging_common import (
    FRONT_DISTRIBUTIONS,
    MODEL_SUBDIR,
    RUNTIME_DISTRIBUTIONS,
    pinned,
    write_lines,
)
from ortserve.bake.targets import Target
from ortserve.core.manifest import sha256_file
from ortserve.core.sizing import Memory, engine_ceiling, model_memory, shipped_caps, write_record

# The edge extra's distributions (pyproject's `edge` extra); the runtime ones come from
# bake.packaging_common. pip goes in too: install.sh runs pip from its wheel, so the board
# needs neither python3-venv nor python3-pip.
EDGE_DISTRIBUTIONS = ("uvicorn", "prometheus-client", "pip")
# Raspberry Pi OS bookworm / Debian 12 ship 3.11, Ubuntu 24.04 3.12, Raspberry Pi OS trixie /
# Debian 13 3.13; 3.14 for Ubuntu 26.04 and hand-built Pythons. Every runtime dependency
# has cp313 and cp314 wheels for aarch64 and x86_64 (onnxruntime 1.32, onnxruntime-genai
# 0.18, numpy 2.4, pydantic-core 2.50, markupsafe 3.0; tokenizers and protobuf are abi3),
# checked with `pip download --only-binary=:all: --python-version 3.1x`. onnxruntime-genai
# 0.18 has no cp310 wheels, so older Pythons (JetPack's 3.10) are refused by install.sh.
PYTHON_VERSIONS = ("3.11", "3.12", "3.13", "3.14")
# onnxruntime and onnxruntime-genai are manylinux_2_28: glibc 2.28 is the floor.
MIN_GLIBC = (2, 28)

WHEELS_SUBDIR = "wheels"
MANIFEST_NAME = "BUNDLE-MANIFEST.sha256"
INFO_NAME = "BUNDLE-INFO"
# Bundle file name -> file in the source tree's edge/ folder.
_EDGE_FILES = {
    "install.sh": "install.sh",
    "README.md": "README-board.md",
    "ortserve.service": "ortserve.service",
    "ortserve.env": "ortserve.env",
}
_PIP_TIMEOUT_S = 1800
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_Filler = Callable[[Path], None]
_NO_NETWORK = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable"
)
_NOT_FOUND = re.compile(
    r"(?:No matching distribution found for|Could not find a version that satisfies the "
    r"requirement|Cannot install) (\S+)"
)


def platform_tags(arch: str) -> list[str]:
    """The wheel platform tags a glibc-2.28 Linux on `arch` accepts, newest first.

    pip does not expand `manylinux_2_28_<arch>` to the older manylinux tags it implies
    (numpy, pydantic-core and protobuf publish `manylinux2014`/`manylinux_2_17` wheels),
    so every tag is listed.
    """
    oldest = 17 if arch == "aarch64" else 5  # manylinux for aarch64 began at glibc 2.17
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(MIN_GLIBC[1], oldest - 1, -1)]
    return [*tags, f"manylinux2014_{arch}"]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _constraints(roots: tuple[str, ...]) -> list[str]:
    """`name==version` for `roots` and everything they need, as installed (and tested) here.

    Markers are not evaluated: a pin for a distribution the target does not need is
    harmless in a constraints file, and pip evaluates the markers for the target.
    """
    pins: dict[str, str] = {}
    todo = [_normalize(name) for name in roots]
    while todo:
        name = todo.pop()
        if name in pins:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        pins[name] = dist.version
        for line in dist.requires or []:
            match = _REQUIREMENT_NAME.match(line)
            if match and "extra ==" not in line.replace("extra==", "extra =="):
                todo.append(_normalize(match.group(1)))
    return [f"{name}=={pins[name]}" for name in sorted(pins)]


def wheel_requirements() -> tuple[list[str], list[str]]:
    """The wheelhouse's requirements (runtime and edge distributions, pinned) and constraints.

    Raises:
        BakeError: A distribution to pin is not installed here.
    """
    roots = (*RUNTIME_DISTRIBUTIONS, *FRONT_DISTRIBUTIONS, *EDGE_DISTRIBUTIONS)  # the whole wheel
    try:
        requirements = pinned(roots)
    except KeyError as exc:  # pinned() knows only installed and a few tested versions
        raise BakeError(
            f"the edge bundle pins the versions installed here, but {exc.args[0]} is not "
            "installed: pip install 'ortserve[edge]'"
        ) from None
    return requirements, _constraints(roots)


def _pip(args: list[str], what: str, hint: str) -> None:
    """Run pip; `what` says what fails if it fails ("cannot ..."): the heartbeat while it
    runs names the pip command instead (a failure's words read like an error)."""
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    try:
        proc = run_step(cmd, f"pip {args[0]}", timeout=_PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BakeError(f"{what}: pip took longer than {_PIP_TIMEOUT_S} s; {hint}") from None
    if proc.returncode == 0:
        return
    raise BakeError(f"{what}: {_pip_reason(proc.stderr)}; {hint}")


def _pip_reason(stderr: str) -> str:
    """pip's failure in a few words: its own last line can mislead (with a constraints file,
    a wheel that cannot be found is reported as a "conflict")."""
    if "No module named pip" in stderr:
        return f"pip is not installed for {sys.executable}"
    if _NO_NETWORK.search(stderr):
        return "no network (pip cannot reach the package index)"
    if match := _NOT_FOUND.search(stderr):
        return f"pip found no {match.group(1)} (no network, or no such wheel on the index)"
    errors = [line for line in stderr.splitlines() if line.startswith("ERROR:")]
    last = errors[-1] if errors else (stderr.strip().splitlines() or ["no output"])[-1]
    return last.removeprefix("ERROR: ").strip()


def _cache_key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _cached_dir(folder: Path, fill: _Filler) -> Path:
    """`folder`, filled by `fill(tmp)` once; a concurrent or interrupted fill leaves no
    half-filled folder behind (the fill happens in a temporary folder, then a rename)."""
    if (folder / ".complete").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        fill(tmp)
        (tmp / ".complete").touch()
        if folder.exists() and not (folder / ".complete").is_file():
            shutil.rmtree(folder)  # an interrupted earlier fill
        try:
            tmp.rename(folder)
        except OSError:  # another bake filled it meanwhile: use theirs
            if not (folder / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def project_root() -> Path:
    """The ortserve source tree (pyproject.toml), found from where `ortserve` is imported.

    Raises:
        BakeError: ortserve is not installed from a source tree (the wheel is built from it).
    """
    root = Path(__file__).resolve().parents[2]  # build/bake/package_edge.py
    pyproject = root / "pyproject.toml"
    try:
        name = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        name = None
    if name != "ortserve":
        raise BakeError(
            f"the edge bundle builds the ortserve wheel from its source tree, but {root} is "
            "not one: install ortserve from a checkout (pip install -e .)"
        )
    return root


def default_cache() -> Path:
    """Where downloaded wheels are kept between bakes: the source tree's `.cache/wheelhouse`."""
    return project_root() / ".cache" / "wheelhouse"


def wheelhouse(arch: str, cache: Path) -> Path:
    """The runtime wheels for `arch` and every Python in PYTHON_VERSIONS, downloaded once.

    Raises:
        BakeError: pip cannot download them (no network and nothing cached, a missing wheel).
    """
    requirements, constraints = wheel_requirements()
    tags = platform_tags(arch)
    folder = cache / f"{arch}-{_cache_key(arch, PYTHON_VERSIONS, tags, requirements, constraints)}"
    if (folder / ".complete").is_file():
        say(f"wheels for {arch}: cached in {folder}")
        return folder

    def fill(tmp: Path) -> None:
        lists = tmp / ".lists"
        lists.mkdir()
        write_lines(lists / "requirements.txt", requirements)
        write_lines(lists / "constraints.txt", constraints)
        for python in PYTHON_VERSIONS:
            say(f"downloading the wheels for {arch}, Python {python} (once; cached in {cache})")
            _pip(
                [
                    "download",
                    "--only-binary=:all:",
                    "--implementation",
                    "cp",
                    "--python-version",
                    python,
                    *(f"--platform={tag}" for tag in tags),
                    "--progress-bar",
                    "off",
                    "--dest",
                    str(tmp),
                    "-r",
                    str(lists / "requirements.txt"),
                    "-c",
                    str(lists / "constraints.txt"),
                ],
                f"cannot download the {arch} wheels for Python {python}",
                "bake once with access to PyPI (or a mirror in PIP_INDEX_URL) to fill the "
                f"cache in {cache}",
            )
        shutil.rmtree(lists)

    return _cached_dir(folder, fill)


def build_ortserve_wheel(dest: Path, cache: Path) -> Path:
    """Build the ortserve wheel from the source tree into `dest`, offline after the first time.

    The build backend (pyproject's build-system.requires) is downloaded once into the
    cache; pip then builds in an isolated environment from that folder with --no-index.

    Raises:
        BakeError: No source tree, or the backend is neither cached nor downloadable.
    """
    root = project_root()
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    backend = list(pyproject["build-system"]["requires"])
    tools_key = _cache_key(backend, sys.version_info[:2])
    hint = f"bake once with access to PyPI (or a mirror in PIP_INDEX_URL) to fill {cache}"

    def fill(tmp: Path) -> None:
        say(f"downloading the build backend ({', '.join(backend)}) once into {cache}")
        what = "cannot download the build backend for the ortserve wheel"
        _pip(
            [
                "download",
                "--only-binary=:all:",
                "--progress-bar",
                "off",
                "--dest",
                str(tmp),
                *backend,
            ],
            what,
            hint,
        )

    tools = _cached_dir(cache / f"build-backend-{tools_key}", fill)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ortserve-wheel-") as out:
        _pip(
            [
                "wheel",
                "--no-deps",
                "--no-index",
                "--find-links",
                str(tools),
                "--wheel-dir",
                out,
                str(root),
            ],
            "cannot build the ortserve wheel",
            hint,
        )
        (built,) = Path(out).glob("ortserve-*.whl")
        return Path(shutil.copy2(built, dest / built.name))


def write_bundle_manifest(bundle: Path) -> Path:
    """Write BUNDLE-MANIFEST.sha256: every other file of `bundle`, as `sha256sum -c` reads it."""
    lines = []
    for path in sorted(bundle.rglob("*")):
        rel = path.relative_to(bundle).as_posix()
        if path.is_file() and rel != MANIFEST_NAME:
            lines.append(f"{sha256_file(path)}  {rel}\n")
    manifest = bundle / MANIFEST_NAME
    manifest.write_text("".join(lines), encoding="utf-8")
    return manifest


def unit_memory_max(terms: Memory) -> str:
    """The unit's MemoryMax for the formula's `terms` (whole MiB, rounded up to 64)."""
    return f"{math.ceil(terms.total_mib / 64) * 64}M"


def with_memory_max(unit: str, limit: str) -> str:
    """The unit file `unit` with its MemoryMax= line set to `limit`.

    Raises:
        BakeError: The unit has no single MemoryMax= line.
    """
    lines = unit.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith("MemoryMax=")]
    if len(at) != 1:
        raise BakeError("edge/ortserve.service changed shape: update bake.package_edge")
    lines[at[0]] = (
        f"# Set by the bake from the model (sizing.json: the terms of the sum).\n"
        f"MemoryMax={limit}\n"
    )
    return "".join(lines)


def with_caps(settings: str, terms: Memory) -> str:
    """The settings file `settings` with the limits that keep each sequence in the room
    the unit's MemoryMax counts (`core.sizing.shipped_caps`), set, not commented."""
    caps = shipped_caps(terms)
    ceiling = engine_ceiling(terms)
    text = settings.rstrip() + "\n"
    if caps:
        lines = "".join(f"{name}={value}\n" for name, value in caps.items())
        text += (
            f"\n# Written by the bake (sizing.json): the unit's MemoryMax counts "
            f"{terms.sequences} sequences\n# of {terms.tokens_per_sequence} tokens; these "
            "keep each one in that room. The model's context is\n# longer: raise them only "
            f"with MemoryMax.\n{lines}"
        )
    if ceiling:
        lines = "".join(f"{name}={value}\n" for name, value in ceiling.items())
        text += (
            "\n# Written by the bake (sizing.json): the engine process's ceiling, the unit's "
            "whole memory\n# (MiB): a runaway allocation fails there, and only it restarts.\n"
            f"{lines}"
        )
    return text if (caps or ceiling) else settings


def package_edge(target: Target, bundle: Path, cache: Path | None = None) -> None:
    """Add the offline install bundle for an edge target around `bundle/model`.

    Args:
        target: An edge target (its `arch` picks the wheels).
        bundle: The bake's output folder; the baked model is already in `bundle/model`.
        cache: Where downloaded wheels are kept (default: the source tree's
            `.cache/wheelhouse`).

    Raises:
        BakeError: The wheels or the ortserve wheel cannot be had (one line, with the fix).
    """
    cache = cache or default_cache()
    downloaded = wheelhouse(target.arch, cache)  # first: a failure leaves `bundle` as it was
    wheels = bundle / WHEELS_SUBDIR
    wheels.mkdir()
    for path in sorted(downloaded.glob("*.whl")):
        shutil.copy2(path, wheels / path.name)  # copies: a bundle edited in place stays apart
    own = build_ortserve_wheel(wheels, cache)
    ortserve_version = own.name.split("-")[1]
    requirements, constraints = wheel_requirements()
    pip_pin = next(line for line in requirements if line.startswith("pip=="))
    (bundle / "requirements.txt").write_text(
        f"ortserve[edge]=={ortserve_version}\n{pip_pin}\n", encoding="utf-8"
    )
    write_lines(bundle / "constraints.txt", [f"ortserve=={ortserve_version}", *constraints])
    edge = project_root() / "edge"
    for name, source in _EDGE_FILES.items():
        shutil.copy2(edge / source, bundle / name)
    unit = bundle / "ortserve.service"
    terms = model_memory(bundle / MODEL_SUBDIR, reloads=True, engine_process=True)
    limit = unit_memory_max(terms)
    unit.write_text(with_memory_max(unit.read_text(encoding="utf-8"), limit), encoding="utf-8")
    settings = bundle / "ortserve.env"
    settings.write_text(with_caps(settings.read_text(encoding="utf-8"), terms), encoding="utf-8")
    write_record(bundle / "sizing.json", terms, memory_max=limit)
    # Executable for `./install.sh`; it is a public script (and `sh install.sh` works too).
    os.chmod(bundle / "install.sh", 0o755)  # noqa: S103
    (bundle / INFO_NAME).write_text(
        f"# ortserve edge bundle, read by install.sh\n"
        f"target={target.name}\n"
        f"arch={target.arch}\n"
        f"python={' '.join(PYTHON_VERSIONS)}\n"
        f"glibc={MIN_GLIBC[0]}.{MIN_GLIBC[1]}\n"
        f"ortserve={ortserve_version}\n"
        f"model={MODEL_SUBDIR}\n",
        encoding="utf-8",
    )
    write_bundle_manifest(bundle)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    say(f"edge bundle for {target.arch}: {size / 1e6:.0f} MB; install with sh install.sh")
