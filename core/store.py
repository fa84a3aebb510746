"""The local model store: models `ortserve run` baked, by name (as Ollama keeps its models).

A stored model is `STORE/NAME/model` (a baked model folder with its manifest) beside
`STORE/NAME/store.json`, which records what it was baked from. NAME is readable (the
source and the target) and ends with a short hash of everything that shapes the bake
(source, revision, target, precision, bake options), so another choice is another entry.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InvalidRequestError
from core.manifest import Manifest, read_manifest

RECORD = "store.json"
MODEL_SUBDIR = "model"


@dataclass(frozen=True)
class StoredModel:
    """One model in the store.

    Attributes:
        name: Its name in the store.
        folder: The baked model folder (what `serve --model-dir` takes).
        spec: What it was baked from (source, revision, target, precision, options).
        manifest: The bake's manifest, or None when it cannot be read.
    """

    name: str
    folder: Path
    spec: dict[str, Any]
    manifest: Manifest | None

    @property
    def size_bytes(self) -> int:
        """Bytes of the model's files."""
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())


def entry_name(spec: dict[str, Any]) -> str:
    """The store name for a bake `spec`: the source's last part, the target, a hash."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    source = str(spec["source"]).rstrip("/")
    for prefix in ("builtin:", "pypi:", "s3://"):
        source = source.removeprefix(prefix)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", source.split("/")[-1].removesuffix(".gguf"))
    return f"{slug.strip('-.') or 'model'}-{spec['target']}-{digest}"


def find(store: Path, name: str) -> StoredModel | None:
    """The stored model called `name` (or the only one whose name starts with it)."""
    exact = store / name
    if (exact / RECORD).is_file():
        return _read(exact)
    matches = [m for m in list_models(store) if m.name.startswith(name)]
    if len(matches) > 1:
        names = ", ".join(m.name for m in matches)
        raise InvalidRequestError(f"{name!r} names {len(matches)} stored models: {names}")
    return matches[0] if matches else None


def list_models(store: Path) -> list[StoredModel]:
    """Every model in the store, by name."""
    if not store.is_dir():
        return []
    return [_read(p) for p in sorted(store.iterdir()) if (p / RECORD).is_file()]


def _read(entry: Path) -> StoredModel:
    spec = json.loads((entry / RECORD).read_text(encoding="utf-8"))
    folder = entry / MODEL_SUBDIR
    try:
        manifest: Manifest | None = read_manifest(folder)
    except Exception:  # a damaged entry is still listed (and can be removed)
        manifest = None
    return StoredModel(entry.name, folder, spec, manifest)


def record(entry: Path, spec: dict[str, Any]) -> None:
    """Mark a freshly baked `entry` as a stored model baked from `spec`."""
    (entry / RECORD).write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")


def remove(store: Path, name: str) -> StoredModel:
    """Delete a stored model.

    Raises:
        InvalidRequestError: No such model (or the name is ambiguous).
    """
    model = find(store, name)
    if model is None:
        raise InvalidRequestError(f"no stored model {name!r}: see `ortserve list`")
    shutil.rmtree(model.folder.parent)
    return model


def resolve(store: Path, name_or_dir: Path) -> Path:
    """A model folder for `serve --model-dir`: the folder itself when it exists, else the
    stored model of that name (else the path, for the usual "does not exist" error)."""
    if name_or_dir.exists() or len(name_or_dir.parts) != 1:
        return name_or_dir
    model = find(store, str(name_or_dir))
    return model.folder if model is not None else name_or_dir
