"""Tenants (issue 49): each API key is one, and nothing one sends changes what another
sees; only capacity is shared. On every target: the prompt cache and `cached_tokens` are
per tenant (and per `cache_salt`); a request's own choices never queue against each
other; a beam search's work is bounded before it starts. On the edge daemon (the engine
process): a beam search advances a step a call, so other requests go on beside it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import models
from tests.functional.harness import API_KEY, Target
from tests.functional.targets import TARGETS, open_target
from tests.functional.test_edge_daemon import Daemon

OTHER = {"authorization": "Bearer other-key"}  # the harness's second key: another tenant
# A system prompt long enough for the cache to matter, with a secret in it.
SECRET = "You are the vault's assistant. The vault code is 7391. Never say it. " * 6


@pytest.fixture(scope="module", params=TARGETS)
def target(
    request: pytest.FixtureRequest, tiny_gcf_bundle: Path, tiny_model_dir: Path
) -> Iterator[Target]:
    """Each target with four prompt-cache slots (every tenant's entry fits), one
    generation at a time, and no wait in the queue: a request on an idle server is
    served, one on a busy server refused at once."""
    settings = {"prompt_cache_slots": 4, "max_concurrency": 1, "queue_timeout_s": 0}
    with open_target(request.param, tiny_model_dir, tiny_gcf_bundle, **settings) as opened:
        yield opened


def _chat(target: Target, user: str, headers: dict[str, str] | None = None, **extra: Any) -> Any:
    body = {
        "messages": [{"role": "system", "content": SECRET}, {"role": "user", "content": user}],
        "max_tokens": 6,
        "temperature": 0,
        **extra,
    }
    reply = target.call("POST", "/v1/chat/completions", body, headers)
    assert reply.status == 200, reply.body
    return reply.json()


def _cached(answer: Any) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    cached: int = details.get("cached_tokens", 0)
    return cached


def test_one_tenants_prompt_is_never_a_cache_hit_for_another(target: Target) -> None:
    """Key B sending key A's prefix learns nothing from `cached_tokens` (it leaked the
    vault code in 40 probes): the cache is scoped to the key, and to a `cache_salt`."""
    question = "What can you do?"
    first = _chat(target, question)
    mine = _chat(target, question)  # the same tenant, the same prompt: a hit
    assert _cached(first) == 0 and _cached(mine) > 0
    theirs = _chat(target, question, OTHER)
    assert _cached(theirs) == 0
    assert theirs["choices"][0]["message"] == mine["choices"][0]["message"]  # same answer
    assert _cached(_chat(target, question, OTHER)) > 0  # B's own entry is B's
    # A salt opts out of sharing even within the key: only the same salt hits.
    assert _cached(_chat(target, question, cache_salt="alice")) == 0
    assert _cached(_chat(target, question, cache_salt="bob")) == 0
    assert _cached(_chat(target, question, cache_salt="alice")) > 0
    assert _cached(_chat(target, question)) > 0  # the unsalted entry is still A's


def test_a_cache_salt_is_checked(target: Target) -> None:
    body = {"prompt": "Hi", "max_tokens": 2, "cache_salt": ""}
    reply = target.call("POST", "/v1/completions", body)
    assert reply.status == 400 and reply.json()["error"]["param"] == "cache_salt", reply.body


def test_n_choices_on_an_idle_server_never_queue_behind_each_other(target: Target) -> None:
    """`n: 8` with one slot: its choices 5-8 waited in the queue behind 1-4 for that slot,
    and the request was a 503 at the queue timeout (30 s by default; none here), the
    work of 1-4 thrown away. One admission for the request: its choices never queue."""
    body = {
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "n": 8,
        "max_tokens": 120,
        "temperature": 0.8,
        "ignore_eos": True,
    }
    reply = target.call("POST", "/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert [c["index"] for c in answer["choices"]] == list(range(8))
    assert answer["usage"]["completion_tokens"] == 8 * 120
    # Seeded choices (which run alone, not batched) too; each as the request alone.
    seeded = {**body, "seed": 5, "max_tokens": 8}
    whole = target.call("POST", "/v1/chat/completions", seeded).json()
    alone = target.call("POST", "/v1/chat/completions", {**seeded, "n": 1, "seed": 12}).json()
    assert whole["choices"][7]["message"] == alone["choices"][0]["message"]
    health = target.call("GET", "/healthz").json()
    assert health.get("active", 0) == 0  # the one slot is free again


def test_the_work_of_a_beam_search_is_bounded_before_it_starts(target: Target) -> None:
    """8 beams x 4,000 tokens froze the engine for everyone: beams x (prompt + new
    tokens) may hold no more positions than one sequence of the context (2,048 here)."""
    body = {"prompt": "Tell me a story number 7", "num_beams": 8, "max_new_tokens": 1000}
    refused = target.call("POST", "/generate", {**body, "ignore_eos": True})
    assert refused.status == 400, refused.body
    error = refused.json()["error"]
    assert error["param"] == "num_beams" and "2048" in error["message"], error
    fits = target.call("POST", "/generate", {**body, "num_beams": 2, "max_new_tokens": 8})
    assert fits.status == 200, fits.body


@pytest.mark.slow
def test_a_beam_search_lets_other_requests_through_and_ends_at_its_timeout() -> None:
    """On the edge daemon (the engine process runs one call at a time): a beam search ran
    as one call, every other request waited for it, its client could not stop it, and a
    long one got the engine killed as hung. It now advances a step a call."""
    daemon = Daemon(
        models.shape_135m(),
        # Two slots: the short request's wait is the engine's, not the queue's.
        {"ORTSERVE_API_KEYS": API_KEY, "ORTSERVE_MAX_CONCURRENCY": "2"},
    )
    auth = {"authorization": f"Bearer {API_KEY}"}
    done: list[str] = []
    replies: dict[str, httpx.Response] = {}
    try:
        daemon.wait_for("READY=1")
        # 4 beams x (prompt + 200) on the 135M shape: seconds of beam steps (20-50 ms each).
        beam = {"prompt": "Tell me a story number 7", "num_beams": 4, "max_new_tokens": 200}

        def search() -> None:
            with httpx.Client(base_url=daemon.url, timeout=600, headers=auth) as client:
                replies["beam"] = client.post("/generate", json={**beam, "ignore_eos": True})
            done.append("beam")

        searching = threading.Thread(target=search)
        searching.start()
        daemon.http.headers.update(auth)
        while daemon.http.get("/healthz").json().get("active", 0) < 1:
            assert searching.is_alive()
            time.sleep(0.01)
        short = daemon.http.post(
            "/generate", json={"prompt": "Hello", "max_new_tokens": 4}, timeout=600
        )
        done.append("short")
        searching.join(600)
        assert short.status_code == 200, short.text
        assert done == ["short", "beam"]  # served beside the search, not after it
        assert replies["beam"].status_code == 200, replies["beam"].text
        assert replies["beam"].json()["tokens_generated"] == 200
        # A search past its time is a 504 at its next step; the engine is not killed.
        daemon.close()
        daemon = Daemon(
            models.shape_135m(),
            {"ORTSERVE_API_KEYS": API_KEY, "ORTSERVE_REQUEST_TIMEOUT_S": "1"},
        )
        daemon.wait_for("READY=1")
        daemon.http.headers.update(auth)
        late = daemon.http.post("/generate", json={**beam, "ignore_eos": True}, timeout=600)
        assert late.status_code == 504, late.text
        engine = daemon.http.get("/healthz").json()["engine"]
        assert engine["restarts"] == {} and engine["state"] == "ready", engine
    finally:
        daemon.close()
