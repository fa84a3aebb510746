"""What happened to one request: the record adapters log and count (no engine)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request, emitted once it is complete (streams: when they end).

    `ending`: how a generation's answer ended (`stop`, `length`, `tool_calls`,
    `content_filter`, `cancelled` (its client left), `error` (a 500 or 504, or a stream
    cut by an error event); empty for other requests and for refusals before any token).
    `filtered`: the content filter's rule that refused the request or ended its output;
    `redactions`: spans of personal data the filter replaced. `reason`: why it failed, for
    a 4xx or 5xx answer and a stream ended by an error event (the error's code and the
    message its answer carries, never more than the client was told). `draft_tokens`,
    `accepted_tokens`: speculative decoding's drafts verified, and accepted.
    """

    request_id: str
    method: str
    route: str
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    tokens_per_s: float = 0.0
    duration_s: float = 0.0
    ending: str = ""
    filtered: str = ""
    redactions: int = 0
    reason: str = ""
    draft_tokens: int = 0
    accepted_tokens: int = 0
