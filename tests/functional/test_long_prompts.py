"""Long prompts (issue 23) on the real edge daemon: a prompt of thousands of tokens goes
into the model in parts (ORTSERVE_PREFILL_CHUNK_TOKENS), so the process keeps answering
during its prefill, stops it at the drain's deadline, and holds one part's logits rather
than the whole prompt's. The slots (test_long_prompt_slots.py) and the declared memory
(test_long_prompt_memory.py) are in files of their own, which xdist runs side by side.

These assert what a user sees (answers during the prefill, an exit within the drain,
memory within the stated bounds), never a speed: the speed figures come from
`python -m benchmarks.long_prompt`.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ortserve.core.generation import GenerationRequest, SamplingOptions
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings
from tests import models
from tests.functional.long_prompt_kit import (
    KV_BYTES_PER_TOKEN,
    MIB,
    long_prompt,
    reset_peak,
    status_mib,
)
from tests.functional.test_edge_daemon import start  # noqa: F401 (the daemon fixture)


def test_a_prompt_in_parts_decodes_as_a_prompt_at_once(tiny_model_dir: Path) -> None:
    """Greedy output and logits do not depend on the chunk (one sequence, bit for bit)."""
    request = GenerationRequest(
        prompt=" ".join(["Hello world"] * 150), options=SamplingOptions(max_new_tokens=24)
    )
    texts = []
    for chunk in (16, 100, 16384):
        settings = EngineSettings(
            model_dir=tiny_model_dir,
            providers="cpu",
            prefill_chunk_tokens=chunk,
            prompt_cache_slots=0,
        )
        done = Service.load(settings).generate(request)
        assert done.prompt_tokens > 200
        texts.append(done.text)
    assert texts[0] == texts[1] == texts[2]
    assert texts[0]


@pytest.mark.slow
def test_health_and_a_short_request_answer_during_a_long_prefill(start: Any) -> None:  # noqa: F811
    """A long prompt does not freeze the process: /healthz answers all along, and a short
    request that comes during the prefill is answered before it ends. 1,500 tokens of the
    135M shape take seconds to prefill on a 2-core VM (4,000 took 81 s in the suite): far
    longer than the 10 probes and the 0.5 s before the short request need."""
    daemon = start(models.shape_135m(), MAX_NEW_TOKENS="16", PROMPT_CACHE_SLOTS="0")
    daemon.wait_for("READY=1")
    ended: dict[str, float] = {}

    def ask(name: str, prompt: str, tokens: int) -> None:
        with httpx.Client(base_url=daemon.url, timeout=600) as client:
            reply = client.post("/generate", json={"prompt": prompt, "max_new_tokens": tokens})
            assert reply.status_code == 200, reply.text
        ended[name] = time.monotonic()

    started = time.monotonic()
    long = threading.Thread(target=ask, args=("long", long_prompt(1500), 1))
    long.start()
    latencies = []
    short = None
    with httpx.Client(base_url=daemon.url, timeout=600) as client:
        while long.is_alive():
            sent = time.monotonic()
            assert client.get("/healthz").status_code == 200
            latencies.append((sent, time.monotonic() - sent))
            if short is None and sent - started > 0.5:
                short = threading.Thread(target=ask, args=("short", "Hello", 2))
                short.start()
            time.sleep(0.05)
    assert short is not None
    short.join(60)
    took = ended["long"] - started
    during = [latency for sent, latency in latencies if sent < ended["long"] - 0.2]
    # Answered all along: many times, and never held for a large part of the prefill
    # (at once, the first /healthz waited for all of it).
    assert len(during) >= 10, (took, latencies)
    assert max(during) < took / 3, (took, max(during))
    assert ended["short"] < ended["long"], (ended, started)


@pytest.mark.slow
def test_sigterm_during_long_prefills_exits_within_the_drain(start: Any) -> None:  # noqa: F811
    """With a 1 s drain, two requests in the middle of 7,000-token prefills end with
    `shutting_down` and the process exits within the drain, the stop grace (2 s) and a
    part: not when the prefills end (they would take tens of seconds here)."""
    daemon = start(
        models.shape_135m(),
        MAX_NEW_TOKENS="64",
        MAX_CONCURRENCY="2",
        MAX_BATCH="1",
        PROMPT_CACHE_SLOTS="0",
        DRAIN_TIMEOUT_S="1",
    )
    daemon.wait_for("READY=1")
    replies: dict[str, httpx.Response] = {}

    def ask(name: str, path: str, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=daemon.url, timeout=120) as client:
            replies[name] = client.post(path, json=body)

    buffered_body = {"prompt": long_prompt(7000), "max_new_tokens": 64}
    stream_body = {
        "prompt": long_prompt(7000) + " more",
        "max_tokens": 64,
        "stream": True,
        "min_tokens": 64,
    }
    askers = [
        threading.Thread(target=ask, args=("buffered", "/generate", buffered_body)),
        threading.Thread(target=ask, args=("stream", "/v1/completions", stream_body)),
    ]
    for asker in askers:
        asker.start()
    deadline = time.monotonic() + 30
    while daemon.http.get("/healthz").json()["active"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # both are prefilling now
    sent = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(60) == 0
    exited = time.monotonic() - sent
    for asker in askers:
        asker.join(30)
    assert exited < 1 + 2 + 3, exited
    buffered = replies["buffered"]
    assert buffered.status_code == 503, buffered.text
    assert buffered.json()["error"]["code"] == "shutting_down"
    assert "shutting_down" in replies["stream"].text, replies["stream"].text
    log = daemon.stderr()
    assert "Traceback" not in log, log


@pytest.mark.slow
def test_a_long_prompt_holds_its_kv_cache_and_one_part(start: Any) -> None:  # noqa: F811
    """Peak RSS of one 4,000-token request: at most idle + its KV cache + 150 MiB (at
    once, its logits alone were 4,000 x 49,152 x 4 B = 750 MiB)."""
    daemon = start(models.shape_135m(), PROMPT_CACHE_SLOTS="0")
    daemon.wait_for("READY=1")
    pid = daemon.proc.pid
    idle = status_mib(pid, "VmRSS")
    reset_peak(pid)
    reply = daemon.http.post(
        "/generate", json={"prompt": long_prompt(4000), "max_new_tokens": 4}, timeout=600
    )
    assert reply.status_code == 200, reply.text
    prompt = reply.json()["prompt_tokens"]
    assert prompt > 3900
    kv_mib = (prompt + 4) * KV_BYTES_PER_TOKEN / MIB
    peak = status_mib(pid, "VmHWM")
    assert peak - idle <= kv_mib + 150, (idle, peak, kv_mib)


def test_prompts_past_a_few_parts_batch_only_within_the_batch_pass(tiny_model_dir: Path) -> None:
    """og 0.18 appends a batch's prompts once: two prompts of more than 32 tokens fit 4
    parts of 256 together; at parts of 16 they batch within ORTSERVE_BATCH_PREFILL_TOKENS
    (equal lengths: no padding) and run alone with it at 0 (with the same text each way)."""
    from tests.functional.batching import concurrently

    requests = [
        GenerationRequest(
            prompt=f"{who} " + " ".join(["Hello world"] * 12),
            options=SamplingOptions(max_new_tokens=8),
        )
        for who in ("Ann", "Bob")
    ]
    runs = []
    for chunk, batch_pass in ((256, 0), (16, 2048), (16, 0)):
        settings = EngineSettings(
            model_dir=tiny_model_dir,
            providers="cpu",
            max_batch=4,
            max_concurrency=2,
            prefill_chunk_tokens=chunk,
            batch_prefill_tokens=batch_pass,
            engine_process=True,  # where batch passes beyond 4 parts apply
            prompt_cache_slots=0,
            batch_window_ms=200,
        )
        runs.append(concurrently(Service.load(settings), requests))
    assert [(batches, sequences) for _, batches, sequences in runs] == [(1, 2), (1, 2), (2, 2)]
    assert runs[0][0] == runs[1][0] == runs[2][0]


def test_a_beam_search_beyond_one_part_is_refused(tiny_model_dir: Path) -> None:
    """A beam search prefills beams x prompt at once (og 0.18 crashes on a second append):
    beyond one pass (4 parts) it is a 400 naming num_beams, within it it runs."""
    from ortserve.core.errors import InvalidRequestError

    settings = EngineSettings(model_dir=tiny_model_dir, providers="cpu", prefill_chunk_tokens=16)
    service = Service.load(settings)
    prompt = " ".join(["Hello world"] * 12)
    assert len(service.engine.encode(prompt)) * 4 > 4 * 16
    with pytest.raises(InvalidRequestError, match="beam search prefills") as refused:
        service.generate(GenerationRequest(prompt=prompt, options=SamplingOptions(8, num_beams=4)))
    assert refused.value.param == "num_beams"
    done = service.generate(
        GenerationRequest(prompt="Hello world", options=SamplingOptions(8, num_beams=4))
    )
    assert done.completion_tokens > 0
