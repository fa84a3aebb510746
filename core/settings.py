"""Runtime settings, read once per process from ORTSERVE_* environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PROVIDER_ORDER = ("cuda", "coreml", "qnn", "openvino", "dml", "webgpu", "cpu")


class EngineSettings(BaseSettings):
    """Settings of the engine; one object per process, passed down explicitly.

    Attributes:
        model_dir: The baked model folder (with manifest.json).
        providers: `auto` or a comma-separated preference list such as `cuda,cpu`.
        threads: intra-op threads; None means the baked value, capped by usable cores.
        max_concurrency: Generations that run at once.
        max_queue: Requests that may wait for a slot; one more gets `Busy` at once.
        queue_timeout_s: How long a request may wait for a slot before `Busy`.
        max_new_tokens: Upper bound on new tokens per request.
        verify_sha256: Hash every model file at load (slower; sizes are always checked).
    """

    model_config = SettingsConfigDict(env_prefix="ORTSERVE_", extra="ignore")

    model_dir: Path = Path("models/default")
    providers: str = "auto"
    threads: int | None = Field(default=None, ge=1, le=256)
    max_concurrency: int = Field(default=1, ge=1, le=64)
    max_queue: int = Field(default=16, ge=0, le=10000)
    queue_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    max_new_tokens: int = Field(default=512, ge=1, le=131072)
    verify_sha256: bool = False

    def provider_order(self) -> list[str]:
        """The execution providers to try, best first."""
        if self.providers.strip().lower() == "auto":
            return list(DEFAULT_PROVIDER_ORDER)
        names = [p.strip().lower() for p in self.providers.split(",") if p.strip()]
        unknown = [n for n in names if n not in DEFAULT_PROVIDER_ORDER]
        if unknown or not names:
            raise ValueError(
                f"ORTSERVE_PROVIDERS={self.providers!r}: use 'auto' or a comma list of "
                f"{', '.join(DEFAULT_PROVIDER_ORDER)}"
            )
        return names
