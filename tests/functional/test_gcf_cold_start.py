"""A cold Cloud Function: requests that arrive while its model loads are answered once it
is in, not refused (gunicorn listens before the load ends)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx

from benchmarks.support.servers import functions_framework
from tests.functional.harness import AUTH, SERVER_ENV


def test_a_cold_start_race_answers_200(tiny_gcf_bundle: Path) -> None:
    env = {**os.environ, **SERVER_ENV}
    with functions_framework(tiny_gcf_bundle, env) as server:
        server.wait_listening(60)
        base = server.base
        body = {"prompt": "Hello", "max_new_tokens": 4}
        statuses: list[int] = []

        def call() -> None:
            with httpx.Client(timeout=60) as client:
                reply = client.post(f"{base}/generate", json=body, headers=AUTH)
                statuses.append(reply.status_code)

        # The worker starts loading when it is forked; the five generations reach it during
        # the load and wait for the model (with ORTSERVE_QUEUE_TIMEOUT_S=0, i.e. no wait,
        # all five are 503s here: the race is real).
        threads = [threading.Thread(target=call) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert statuses == [200] * 5, statuses
