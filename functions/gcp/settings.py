"""Settings of the Cloud Functions target: the model defaults to the bundle's `model/`."""

from __future__ import annotations

from pathlib import Path

from core.settings import ServerSettings

BUNDLE_ROOT = Path(__file__).resolve().parents[2]


class GcfSettings(ServerSettings):
    """ServerSettings whose model folder defaults to `model/` beside `main.py`."""

    model_dir: Path = BUNDLE_ROOT / "model"
