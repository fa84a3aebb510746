"""A cold Cloud Function: requests that arrive while its model loads are answered once it
is in, not refused (gunicorn listens before the load ends)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from benchmarks.support.servers import free_port
from tests.functional.harness import AUTH, SERVER_ENV


def _listening(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.005)
    return False


def test_a_cold_start_race_answers_200(tiny_gcf_bundle: Path) -> None:
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "functions-framework"),
        "--source",
        "main.py",
        "--target",
        "ortserve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {**os.environ, **SERVER_ENV, "PYTHONPATH": str(tiny_gcf_bundle)}
    proc = subprocess.Popen(
        cmd,
        cwd=tiny_gcf_bundle,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _listening(port, time.monotonic() + 60), "functions-framework did not listen"
        base = f"http://127.0.0.1:{port}"
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
    finally:
        proc.terminate()
        proc.wait(30)
