"""Bake-time settings, read once from the environment: where fetched sources are cached."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.settings import default_cache_home


class BakeSettings(BaseSettings):
    """Settings of the bake.

    Attributes:
        cache_dir: Where sources fetched from PyPI and converted GGUF checkpoints are
            kept between bakes (`ORTSERVE_CACHE_DIR`; default `$XDG_CACHE_HOME/ortserve`).
    """

    model_config = SettingsConfigDict(env_prefix="ORTSERVE_", extra="ignore")

    cache_dir: Path = Field(default_factory=default_cache_home)
