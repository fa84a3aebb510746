"""What `ortserve serve` says at a terminal (#27 item 10): a short ready line, then one
access line in words per request (a refusal with its reason), and no JSON; with
ORTSERVE_LOG_FORMAT=json the records are JSON on stdout again."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx

from benchmarks.support.servers import ORTSERVE, free_port, serve_process
from tests.functional.terminal import Terminal

_STAMP = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "


def test_at_a_terminal_each_request_is_one_line_in_words(tiny_model_dir: Path) -> None:
    port = free_port()
    env = {**os.environ, "ORTSERVE_PROVIDERS": "auto"}
    env.pop("ORTSERVE_LOG_FORMAT", None)
    term = Terminal(
        [*ORTSERVE, "serve", "--model-dir", str(tiny_model_dir), "--port", str(port)], env
    )
    try:
        seen = term.expect(rb"playground at http://127\.0\.0\.1:\d+/\r?\n")
        base = f"http://127.0.0.1:{port}"
        assert httpx.post(f"{base}/generate", json={"prompt": "Hi", "max_new_tokens": 4}).is_success
        refused = httpx.post(f"{base}/generate", json={"prompt": "Hi", "max_new_tokens": -1})
        assert refused.status_code == 400
        seen += term.expect(rb"POST /generate 400 [^\r\n]*\r?\n")
    finally:
        assert term.stop() == 130
    lines = seen.decode().splitlines()
    ready = next(line for line in lines if " ready on " in line)
    # The model, its EP and threads; which providers are missing is in /readyz (and DEBUG).
    assert re.search(r"model \S+ ready on cpu, \d+ threads \(loaded in ", ready), ready
    message = ready.split(" ortserve: ", 1)[1]  # after the time and level
    assert len(message) < 110 and "not installed" not in ready and "skipped" not in ready, ready
    took = r"[\d.]+ m?s"  # "7 ms", "1.20 s" on a busy machine
    served = next(line for line in lines if "POST /generate 200 " in line)
    # Random weights may end early (stop) or not (length).
    figures = rf"prompt \d+ \+ \d+ new tokens, [\d.]+ tok/s, TTFT {took}, (length|stop)"
    assert re.search(rf"ortserve\.access: POST /generate 200 {took}: {figures}$", served), served
    refusal = "invalid_request: max_new_tokens: Input should be greater than or equal to 1"
    assert re.search(rf"ortserve\.access: POST /generate 400 {took}: {refusal}$", lines[-1])
    assert "{" not in seen.decode(), seen  # no JSON record on the terminal


def test_asked_for_json_records_go_to_stdout_with_their_reason(tiny_model_dir: Path) -> None:
    port = free_port()
    cmd = [
        *ORTSERVE,
        "serve",
        "--model-dir",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--log-format",
        "json",
    ]
    env = {**os.environ, "ORTSERVE_PROVIDERS": "cpu", "ORTSERVE_LOG_FORMAT": "text"}
    with serve_process(cmd, env, port, stderr_apart=True) as server:
        httpx.get(f"{server.base}/nope")
        server.stop()
        out, err = server.stdout(), server.stderr()
    assert "ortserve.access" not in err, err
    records = [line for line in out.splitlines() if '"route":"/nope"' in line]
    assert len(records) == 1 and '"reason":"not_found: no route /nope"' in records[0], out
