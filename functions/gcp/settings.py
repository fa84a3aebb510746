"""Settings of the Cloud Functions target: the model defaults to the bundle's `model/`."""

from __future__ import annotations

from pathlib import Path

from ortserve.core.settings import ServerSettings

# The bundle (or source tree) holding `ortserve/`: not resolved, so that the link
# ortserve/functions -> functions/ of a source checkout counts as the bundle does.
BUNDLE_ROOT = Path(__file__).absolute().parents[3]


class GcfSettings(ServerSettings):
    """ServerSettings whose model folder defaults to `model/` beside `main.py`."""

    model_dir: Path = BUNDLE_ROOT / "model"
