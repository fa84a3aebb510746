"""What the model's state says of itself (`ModelState.describe`): the data /healthz and
/readyz publish (`core.protocol.replies.Health` adds the status). Apart from the reply
shapes so that the state imports no protocol; like them, only the standard library and
typing_extensions (the cold paths import it)."""

from __future__ import annotations

from typing import Any

# pydantic (the OpenAPI document's schemas) needs typing_extensions' TypedDict before 3.12.
from typing_extensions import TypedDict


class ModelDescription(TypedDict, total=False):
    """What is loaded, where and how fast (or, with nothing loaded, why not)."""

    reason: str | None
    model: str | None
    kind: str
    manifest_digest: str
    execution_provider: str
    skipped_providers: dict[str, str]
    threads: int
    load_seconds: float
    warmup_seconds: float | None
    quality: dict[str, Any] | None
    architecture_warning: str | None
    prompt_cache: dict[str, Any] | None
    speculative_decoding: str
    adapters: dict[str, dict[str, Any]]
    reload: dict[str, Any]
    engine: dict[str, Any]
    embedding: dict[str, Any]
