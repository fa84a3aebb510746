"""Offer requests to one batch on purpose: the tests of the service's batching use this."""

from __future__ import annotations

import threading
import time

from ortserve.core.generation import GenerationRequest, SamplingOptions
from ortserve.core.service import Service


def concurrently(service: Service, requests: list[GenerationRequest]) -> tuple[list[str], int, int]:
    """Run `requests` from threads while a lone blocker runs, so that the batchable ones
    all wait for the next batch and are offered to it together; then free the service.

    The service needs two slots (the blocker beside a batch).

    Returns:
        The requests' texts, and the batches and sequences the batcher ran for them.
    """
    batcher = service._batcher
    assert batcher is not None
    blocker = service.stream(GenerationRequest(prompt="hold", options=SamplingOptions(500)))
    next(blocker)  # a lone request: it runs by itself and the next batch waits for it
    before = (batcher.batches_run, batcher.sequences_run)
    batchable = sum(service._batchable(r) for r in requests)
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = service.generate(requests[i]).text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(batcher._pending) < batchable and time.monotonic() < deadline:
        time.sleep(0.001)
    blocker.close()
    for thread in threads:
        thread.join(120)
    assert service.admission.active == 0
    texts = [results[i] for i in range(len(requests))]
    return texts, batcher.batches_run - before[0], batcher.sequences_run - before[1]
