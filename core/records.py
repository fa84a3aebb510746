"""What happened to one request: the record adapters log and count (no engine)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request, emitted once it is complete (streams: when they end)."""

    request_id: str
    method: str
    route: str
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0
    duration_s: float = 0.0
