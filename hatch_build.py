"""Hatchling build hook: the folders the design keeps at the top (core/, edge/,
functions/, build/bake/) go into the wheel as `ortserve.core`, `ortserve.edge`,
`ortserve.functions` and `ortserve.bake`.

In a checkout, `ortserve/core` and the others are symlinks that hatchling follows. An sdist
holds no symlinks (hatchling drops them), so a wheel built from it had the front only
(16 files, no engine): there the folders are mapped here instead, and both wheels hold
the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

FOLDERS = {"core": "core", "edge": "edge", "functions": "functions", "bake": "build/bake"}


class MapFolders(BuildHookInterface):  # type: ignore[type-arg]  # hatchling is untyped here
    """Map each design folder into the package where its symlink is missing."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        for name, source in FOLDERS.items():
            if not (root / "ortserve" / name).exists() and (root / source).is_dir():
                build_data["force_include"][str(root / source)] = f"ortserve/{name}"
