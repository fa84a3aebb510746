"""Settings of the Cloud Functions target: the model defaults to the bundle's `model/`."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from ortserve.core.settings import MAX_TOKENS_BOUND, ServerSettings

# The bundle (or source tree) holding `ortserve/`: not resolved, so that the link
# ortserve/functions -> functions/ of a source checkout counts as the bundle does.
BUNDLE_ROOT = Path(__file__).absolute().parents[3]


def shipped(name: str, root: Path = BUNDLE_ROOT) -> int:
    """A limit the bake wrote into the bundle's `sizing.json` (its `settings`: the caps
    that keep a request in the room the memory it states counts), by its environment
    variable's name; 0 (none) without the file or the setting."""
    try:
        record = json.loads((root / "sizing.json").read_text(encoding="utf-8"))
        return int(record["settings"].get(name, 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0


class GcfSettings(ServerSettings):
    """ServerSettings whose model folder defaults to `model/` beside `main.py`, and whose
    prompt and new-token limits default to the bundle's `sizing.json` (its environment
    overrides them, as every setting)."""

    model_dir: Path = BUNDLE_ROOT / "model"
    max_new_tokens: int = Field(
        default_factory=lambda: shipped("ORTSERVE_MAX_NEW_TOKENS"), ge=0, le=MAX_TOKENS_BOUND
    )
    max_prompt_tokens: int = Field(
        default_factory=lambda: shipped("ORTSERVE_MAX_PROMPT_TOKENS"), ge=0
    )
