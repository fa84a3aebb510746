"""The Responses API's kept conversations (previous_response_id): a bounded LRU."""

from __future__ import annotations

from ortserve.core.protocol.responses import KEPT_RESPONSES, _Kept


def test_the_least_recently_used_response_goes_first() -> None:
    kept = _Kept(KEPT_RESPONSES)
    for i in range(KEPT_RESPONSES):
        kept.put(f"resp_{i}", [{"role": "user", "content": str(i)}])
    assert kept.get("resp_0") == [{"role": "user", "content": "0"}]  # now the most recent
    kept.put("resp_new", [])
    assert kept.get("resp_1") is None  # the least recently used went
    assert kept.get("resp_0") is not None and kept.get("resp_new") == []
