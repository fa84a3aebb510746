"""Long prompts (issues 23 and 35) on the real edge daemon: what a slot holds, a
prompt-cache slot's memory as /readyz states it, and a concurrency slot freed when its
client leaves during the prefill. Apart from test_long_prompts.py so that pytest-xdist
(`--dist loadfile`) can run them beside it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests import models
from tests.functional.long_prompt_kit import long_prompt, status_mib
from tests.functional.test_edge_daemon import start  # noqa: F401 (the daemon fixture)


@pytest.mark.slow
def test_a_prompt_cache_slot_holds_what_readyz_states(start: Any) -> None:  # noqa: F811
    """Slots keep KV caches only, of at most `tokens_per_slot` tokens: after a kept
    3,500-token prompt and an unkept 5,000-token one (both `max_tokens` 1, so nothing
    replaced their prefill's logits), the process holds one more slot than before, and
    the memory the longer one used is given back."""
    daemon = start(models.shape_135m(), PROMPT_CACHE_SLOTS="2", MAX_NEW_TOKENS="16")
    daemon.wait_for("READY=1")
    pid = daemon.proc.pid
    cache = daemon.http.get("/readyz").json()["prompt_cache"]
    assert cache["held"] == 1  # the warm-up's
    before = status_mib(pid, "VmRSS")
    for tokens in (3500, 5000):
        body = {"prompt": long_prompt(tokens), "max_tokens": 1, "temperature": 0}
        reply = daemon.http.post("/v1/completions", json=body, timeout=600)
        assert reply.status_code == 200, reply.text
    after = status_mib(pid, "VmRSS")
    cache = daemon.http.get("/readyz").json()["prompt_cache"]
    assert cache["held"] == 2
    assert cache["tokens_per_slot"] == 4096
    assert after - before <= cache["mib_per_slot"] + 64, (before, after, cache)


@pytest.mark.slow
def test_a_client_that_leaves_during_a_prefill_frees_its_slot(start: Any) -> None:  # noqa: F811
    """A client that closes its connection in the middle of a long prefill, streamed or
    buffered, frees its slot at the next part, not when the prefill ends (#35 item 7):
    the slot is free again in well under the time the whole prefill takes, measured in
    the same run."""
    daemon = start(models.shape_135m(), MAX_NEW_TOKENS="8", PROMPT_CACHE_SLOTS="0", MAX_BATCH="1")
    daemon.wait_for("READY=1")

    def active() -> int:
        return int(daemon.http.get("/healthz").json()["active"])

    def leave_after(seconds: float, path: str, body: dict[str, Any]) -> float:
        """Send `body`, close the connection `seconds` after the slot is taken; the
        seconds from the close until the slot is free."""

        def send() -> None:
            try:
                with httpx.Client(base_url=daemon.url, timeout=seconds) as client:
                    if body.get("stream"):
                        with client.stream("POST", path, json=body) as reply:
                            reply.read()
                    else:
                        client.post(path, json=body)
            except httpx.TimeoutException:
                pass  # the client's own timeout closes its connection

        deadline = time.monotonic() + 30
        asker = threading.Thread(target=send)
        asker.start()
        while active() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        asker.join(120)
        closed = time.monotonic()
        while active() > 0 and time.monotonic() < closed + 300:
            time.sleep(0.02)
        return time.monotonic() - closed

    streamed = {"prompt": long_prompt(6000), "max_tokens": 8, "stream": True}
    freed_streamed = leave_after(1.0, "/v1/completions", streamed)
    buffered = {"prompt": long_prompt(6000) + " again", "max_new_tokens": 8}
    freed_buffered = leave_after(1.0, "/generate", buffered)
    started = time.monotonic()
    whole = daemon.http.post(
        "/generate",
        json={"prompt": long_prompt(6000) + " once more", "max_new_tokens": 1},
        timeout=600,
    )
    prefill_s = time.monotonic() - started
    assert whole.status_code == 200, whole.text
    assert freed_streamed < prefill_s / 3, (freed_streamed, prefill_s)
    assert freed_buffered < prefill_s / 3, (freed_buffered, prefill_s)
    log = daemon.stdout()  # the access lines
    assert log.count("client_closed_request") >= 2, log
