"""The real edge daemon (`ortserve serve`) as a subprocess on 127.0.0.1, as systemd runs it.

What is specific to the daemon: readiness and sd_notify, exit 1 for a model that cannot
load (or staying up when told to wait for one), the drain on SIGTERM and Ctrl-C, a client
that leaves mid-stream, /metrics and the JSON log lines.
The API's semantics are tested once for every target in test_api.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.support.servers import ORTSERVE, ServerProcess
from ortserve.core.manifest import list_files, manifest_digest, read_manifest, write_manifest
from ortserve.edge.settings import EdgeSettings
from tests import models
from tests.conftest import SPIN_WAIT
from tests.tools import tool

pytestmark = pytest.mark.slow

LONG = 2000  # tokens: the tiny model needs about half a second for them
PROMPT = "Hello"  # the tiny model's greedy continuation of it has no EOS before LONG


class Daemon(ServerProcess):
    """`ortserve serve` (benchmarks.support.servers.ServerProcess) with a datagram socket as
    its NOTIFY_SOCKET, on port 0 (any free port), which the test reads back from the
    daemon's first STATUS line; stdout holds only its JSON log lines (stderr apart)."""

    def __init__(self, model_dir: Path, env: dict[str, str]) -> None:
        self._notify_folder = tempfile.TemporaryDirectory(prefix="ortd")  # unix path limit
        notify_path = str(Path(self._notify_folder.name) / "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(notify_path)
        self.messages: list[tuple[float, str]] = []  # (monotonic time, datagram)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ORTSERVE_", "NOTIFY_", "WATCHDOG_")) or k == SPIN_WAIT
        }
        full_env = {**base, "ORTSERVE_PROVIDERS": "cpu", "NOTIFY_SOCKET": notify_path, **env}
        cmd = [*ORTSERVE, "serve", "--model-dir", str(model_dir), "--port", "0"]
        try:
            super().__init__(cmd, full_env, stderr_apart=True)
        except BaseException:
            self._close_notify()
            raise
        threading.Thread(target=self._read_notify, daemon=True).start()
        status = self.wait_for("STATUS=listening on ")
        match = re.search(r"http://127\.0\.0\.1:(\d+)", status)
        assert match, status
        self.port = int(match.group(1))
        self.url = match.group(0)
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def _read_notify(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:  # closed
                return
            self.messages.append((time.monotonic(), data.decode()))

    def wait_for(self, prefix: str, timeout: float = 60, after: float = 0.0) -> str:
        """The first notify message that starts with `prefix` (and came after `after`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, message in list(self.messages):
                if t > after and message.startswith(prefix):
                    return message
            time.sleep(0.005)
        raise AssertionError(f"no {prefix!r} in {self.messages}; stderr: {self.stderr()}")

    def when(self, prefix: str) -> float:
        """When the first message starting with `prefix` arrived."""
        return next(t for t, m in list(self.messages) if m.startswith(prefix))

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines on stdout written so far (every whole line must be one)."""
        *whole, _partial = self.stdout().split("\n")
        return [json.loads(line) for line in whole]

    def record(self, request_id: str, timeout: float = 5) -> dict[str, Any]:
        """The log line of request `request_id` (written when the request has ended)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.records():
                if record["request_id"] == request_id:
                    return record
            time.sleep(0.01)
        raise AssertionError(f"no log line for {request_id}: {self.stdout()}")

    def metric(self, name: str) -> float:
        text = self.http.get("/metrics").text
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        assert match, f"{name} not in {text}"
        return float(match.group(1))

    def _close_notify(self) -> None:
        self.sock.close()
        self._notify_folder.cleanup()

    def close(self) -> None:
        """Killed if it still runs (a test that wants the drain calls `stop` first)."""
        if hasattr(self, "http"):
            self.http.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:
            super().close()
        finally:
            self._close_notify()


@pytest.fixture
def start(tiny_model_dir: Path) -> Iterator[Any]:
    daemons: list[Daemon] = []

    def start_daemon(model_dir: Path | None = None, **env: str) -> Daemon:
        """Keyword arguments are settings (MAX_QUEUE="0") or systemd's WATCHDOG_USEC."""
        named = {k if k.startswith("WATCHDOG_") else f"ORTSERVE_{k}": v for k, v in env.items()}
        daemon = Daemon(model_dir or tiny_model_dir, named)
        daemons.append(daemon)
        return daemon

    yield start_daemon
    for daemon in daemons:
        daemon.close()


def test_ready_after_the_model_loads_then_stopping_and_exit_0(
    start: Any, tiny_model_dir: Path
) -> None:
    daemon = start(WATCHDOG_USEC="200000")
    ready = daemon.wait_for("READY=1")
    assert "STATUS=serving ortserve/tiny-llama-random-weights on cpu at http://127.0.0.1:" in ready
    assert daemon.when("STATUS=listening on ") < daemon.when("READY=1")
    assert daemon.http.get("/healthz").status_code == 200
    reply = daemon.http.get("/readyz")
    assert reply.status_code == 200
    body = reply.json()
    assert body["status"] == "ready"
    assert body["execution_provider"] == "cpu"
    assert body["model"] == "ortserve/tiny-llama-random-weights"
    assert body["manifest_digest"] == manifest_digest(tiny_model_dir)
    time.sleep(0.5)  # the watchdog is pinged every WATCHDOG_USEC/2 = 0.1 s
    assert daemon.stop() == 0
    daemon.wait_for("STOPPING=1", timeout=2)
    assert daemon.when("READY=1") < daemon.when("STOPPING=1")
    pings = [t for t, m in daemon.messages if m == "WATCHDOG=1" and t > daemon.when("READY=1")]
    assert len(pings) >= 3


@pytest.mark.parametrize("damage", ["missing", "truncated", "tampered", "bad-genai-config"])
def test_a_broken_model_leaves_the_process_up_and_not_ready_when_it_waits_for_one(
    start: Any, tiny_model_dir: Path, tmp_path: Path, damage: str
) -> None:
    """With ORTSERVE_WAIT_FOR_MODEL (the systemd unit sets it), as systemd expects."""
    folder = tmp_path / "model"
    named = {
        "missing": "does not exist",
        "truncated": "model.onnx.data",
        "tampered": "model.onnx.data",
        "bad-genai-config": "genai_config.json",
    }
    env = {"WAIT_FOR_MODEL": "true"}
    if damage != "missing":
        shutil.copytree(tiny_model_dir, folder)
    if damage == "truncated":
        data = max(folder.iterdir(), key=lambda p: p.stat().st_size)
        data.write_bytes(data.read_bytes()[:1000])
    elif damage == "tampered":  # same size, other bytes: only the sha256 check sees it
        data = folder / "model.onnx.data"
        raw = bytearray(data.read_bytes())
        raw[100] ^= 0xFF
        data.write_bytes(bytes(raw))
        env["VERIFY_SHA256"] = "true"
    elif damage == "bad-genai-config":  # consistent with its manifest, but not JSON
        (folder / "genai_config.json").write_text("{not json")
        manifest = read_manifest(folder).model_copy(update={"files": list_files(folder)})
        write_manifest(folder, manifest)
    daemon = start(folder, **env)
    failed = daemon.wait_for("STATUS=model failed to load")
    assert "/readyz answers 503" in failed
    assert daemon.http.get("/healthz").status_code == 200
    reply = daemon.http.get("/readyz")
    assert reply.status_code == 503
    assert reply.json()["status"] == "failed"
    assert named[damage] in reply.json()["reason"]  # the reason names the file
    generate = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 4})
    assert generate.status_code == 503
    assert named[damage] in generate.json()["error"]["message"]
    assert daemon.proc.poll() is None
    assert not any(m.startswith("READY=1") for _, m in daemon.messages)
    assert daemon.stop() == 0


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_model_that_cannot_load_at_start_exits_1_with_the_reason(
    start: Any, tiny_model_dir: Path, tmp_path: Path, damage: str
) -> None:
    """As llama-server does: no process left answering 503 for ever."""
    folder = tmp_path / "typo" / "model"
    if damage == "truncated":
        shutil.copytree(tiny_model_dir, folder)
        data = folder / "model.onnx.data"
        data.write_bytes(data.read_bytes()[:1000])
    daemon = start(folder)
    assert daemon.proc.wait(15) == 1
    reason = "does not exist" if damage == "missing" else "model.onnx.data"
    exiting = daemon.wait_for("STATUS=model failed to load", timeout=1)
    assert reason in exiting and exiting.endswith("; exiting"), exiting
    log = daemon.stderr()
    assert "ERROR ortserve.edge: exiting: " in log and reason in log, log
    hint = "(moved or removed? `ortserve list`" if damage == "missing" else "(--wait-for-model:"
    assert hint in log, log
    assert "Traceback" not in log, log
    assert not any(m.startswith("READY=1") for _, m in daemon.messages)


def test_serve_without_a_model_exits_1_at_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTSERVE_")}
    env["ORTSERVE_HOME"] = str(tmp_path)  # an empty store: else its only model is served
    proc = subprocess.run(
        [*ORTSERVE, "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 1
    said = "exiting: model folder models/default/model does not exist (no MODEL, --model-dir "
    assert said + "or ORTSERVE_MODEL_DIR given, and no stored model: " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _events(raw: bytes) -> list[Any]:
    return [
        json.loads(block.removeprefix("data: "))
        for block in raw.decode().split("\n\n")
        if block.strip()
    ]


def test_sigterm_drains_an_in_flight_stream_then_exits_0(start: Any) -> None:
    daemon = start(MAX_NEW_TOKENS=str(LONG))
    daemon.wait_for("READY=1")
    body = {"prompt": PROMPT, "max_new_tokens": LONG, "stream": True}
    headers = {"x-request-id": "drained"}
    with daemon.http.stream("POST", "/generate", json=body, headers=headers) as reply:
        chunks = reply.iter_raw()
        first = next(chunks)
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.wait_for("STOPPING=1", timeout=5)
        # Draining: new generations are refused, health answers, the stream goes on.
        refused = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 4})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert daemon.http.get("/readyz").json()["status"] == "draining"
        assert daemon.proc.poll() is None
        rest = b"".join(chunks)
    final = _events(first + rest)[-1]
    assert final["done"] is True and final["tokens_generated"] == LONG
    assert daemon.proc.wait(30) == 0
    assert daemon.record("drained")["completion_tokens"] == LONG


def test_a_client_that_leaves_mid_stream_frees_its_slot_at_once(start: Any) -> None:
    # One slot and no queue: a slot still held would make the next request a 503. On the
    # 135M shape: the tiny model's 2,000 tokens took 0.14 s in a fresh clone, about the
    # time a disconnect takes to be seen, so "mid-stream" was not certain. 600 tokens of
    # the shape took 79 s in the suite on the AMD VM (both workers busy): 150 take a few
    # seconds, far more than a disconnect takes to be seen.
    shape = models.shape_135m()
    n = 150
    daemon = start(shape, MAX_NEW_TOKENS=str(n), MAX_CONCURRENCY="1", MAX_QUEUE="0")
    daemon.wait_for("READY=1")
    body = {"prompt": PROMPT, "max_new_tokens": n, "ignore_eos": True}
    full = daemon.http.post("/generate", json=body, headers={"x-request-id": "full"})
    assert full.json()["tokens_generated"] == n
    full_s = daemon.record("full")["duration_s"]
    with (
        httpx.Client(base_url=daemon.url) as leaving,
        leaving.stream(
            "POST", "/generate", json={**body, "stream": True}, headers={"x-request-id": "gone"}
        ) as reply,
    ):
        next(reply.iter_raw())
    # Leaving the block closes the connection mid-stream.
    gone = daemon.record("gone", timeout=full_s * 2)
    assert gone["duration_s"] < full_s / 2  # stopped, not run to its end
    assert daemon.metric("ortserve_active_generations") == 0
    assert daemon.metric("ortserve_batches_total") == daemon.metric(
        "ortserve_batched_requests_total"
    )  # one at a time: each alone
    follow = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    assert follow.status_code == 200, follow.text
    assert daemon.stop() == 0


def test_fifty_clients_leaving_mid_stream_leave_the_server_healthy(start: Any) -> None:
    daemon = start(MAX_NEW_TOKENS=str(LONG))
    daemon.wait_for("READY=1")
    body = {"prompt": PROMPT, "max_new_tokens": LONG, "stream": True}
    for _ in range(50):
        with (
            httpx.Client(base_url=daemon.url) as leaving,
            leaving.stream("POST", "/generate", json=body) as reply,
        ):
            assert reply.status_code == 200
            next(reply.iter_raw())
    deadline = time.monotonic() + 10
    while daemon.metric("ortserve_active_generations") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.metric("ortserve_active_generations") == 0
    assert daemon.metric("ortserve_batches_total") == daemon.metric(
        "ortserve_batched_requests_total"
    )  # one at a time: each alone
    assert daemon.http.get("/readyz").status_code == 200
    follow = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    assert follow.status_code == 200, follow.text
    assert follow.json()["tokens_generated"] == 8
    # Every one was served and logged (how fast each stops is the single-client test's job).
    # A stream's log line is written when its response ends, which for a client that left
    # can come after its generation has stopped counting: wait for all 51.
    deadline = time.monotonic() + 10
    while True:
        served = [r for r in daemon.records() if r["route"] == "/generate"]
        if len(served) >= 51 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(served) == 51
    assert all(r["status"] == 200 for r in served)
    assert daemon.stop() == 0


def test_metrics_and_one_json_log_line_per_request(start: Any) -> None:
    daemon = start()
    daemon.wait_for("READY=1")
    body = {"prompt": PROMPT, "max_new_tokens": 16}
    generated = daemon.http.post("/generate", json=body, headers={"x-request-id": "m-1"}).json()
    assert daemon.http.get("/no/such/route", headers={"x-request-id": "m-2"}).status_code == 404
    scrape = daemon.http.get("/metrics")
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    n = generated["tokens_generated"]
    assert daemon.metric('ortserve_requests_total{route="/generate",status="200"}') == 1
    assert daemon.metric('ortserve_requests_total{route="other",status="404"}') == 1
    assert daemon.metric("ortserve_generated_tokens_total") == n
    assert daemon.metric("ortserve_prompt_tokens_total") == generated["prompt_tokens"]
    assert daemon.metric('ortserve_time_to_first_token_seconds_count{route="/generate"}') == 1
    assert daemon.metric('ortserve_request_duration_seconds_count{route="/generate"}') == 1
    assert daemon.metric("ortserve_queue_depth") == 0
    assert daemon.metric("ortserve_active_generations") == 0
    assert (
        daemon.metric("ortserve_batches_total")
        == daemon.metric("ortserve_batched_requests_total")
        == 1
    )
    assert daemon.metric("ortserve_model_ready") == 1
    assert daemon.metric("ortserve_model_load_seconds") > 0

    record = daemon.record("m-1")
    assert record["event"] == "request"
    assert (record["method"], record["route"], record["status"]) == ("POST", "/generate", 200)
    assert record["prompt_tokens"] == generated["prompt_tokens"]
    assert record["completion_tokens"] == n
    assert 0 < record["ttft_s"] <= record["duration_s"]
    assert record["tokens_per_s"] > 0
    assert daemon.record("m-2")["status"] == 404
    # Every stdout line is one request's JSON; /metrics scrapes are not requests of the API.
    assert [r["request_id"] for r in daemon.records()] == ["m-1", "m-2"]
    assert daemon.stop() == 0


def test_no_api_key_appears_in_the_logs(start: Any) -> None:
    secret = "s3cret-key-that-must-not-leak"
    daemon = start(API_KEYS=secret)
    daemon.wait_for("READY=1")
    attempts = [
        {"authorization": f"Bearer {secret}"},  # right
        {"authorization": f"Bearer {secret}x"},  # wrong, close to the right one
        {"x-api-key": secret[:-1]},
        {"api-key": secret},  # the key in a header the API does not read: 401
    ]
    statuses = [
        daemon.http.post(
            "/generate",
            json={"prompt": PROMPT, "max_new_tokens": 2},
            headers={**h, "x-request-id": f"k-{i}"},
        ).status_code
        for i, h in enumerate(attempts)
    ]
    assert statuses == [200, 401, 401, 401]
    for i in range(len(attempts)):
        daemon.record(f"k-{i}")
    assert daemon.stop() == 0
    logs = daemon.stdout() + daemon.stderr()
    assert "s3cret" not in logs


def test_with_keys_every_route_but_health_needs_one(start: Any) -> None:
    """/metrics and /openapi.json too (METRICS_PUBLIC opens /metrics for a scraper); a
    wrong method on /metrics is 405."""
    daemon = start(API_KEYS="k1")
    daemon.wait_for("READY=1")
    key = {"authorization": "Bearer k1"}
    for path in ("/metrics", "/openapi.json", "/v1/models"):
        assert daemon.http.get(path).status_code == 401, path
        assert daemon.http.get(path, headers=key).status_code == 200, path
    for path in ("/healthz", "/readyz"):
        assert daemon.http.get(path).status_code == 200, path
    wrong = daemon.http.post("/metrics", headers=key)
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET, HEAD, OPTIONS")
    assert daemon.stop() == 0
    public = start(API_KEYS="k1", METRICS_PUBLIC="1")
    public.wait_for("READY=1")
    assert public.http.get("/metrics").status_code == 200
    assert public.http.get("/openapi.json").status_code == 401
    assert public.stop() == 0


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _post(body: dict[str, Any], request_id: str) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST /generate HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\nx-request-id: {request_id}\r\n\r\n"
    )
    return head.encode() + data


def _closed_within(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the server closed `sock` (reading whatever it sent first), or None."""
    start = time.monotonic()
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_a_buffered_request_whose_client_leaves_stops_at_once_and_is_logged_499(
    start: Any,
) -> None:
    # One slot and no queue: a slot still held would make the next request a 503.
    daemon = start(MAX_NEW_TOKENS=str(LONG), MAX_CONCURRENCY="1", MAX_QUEUE="0")
    daemon.wait_for("READY=1")
    body = {"prompt": PROMPT, "max_new_tokens": LONG}
    full = daemon.http.post("/generate", json=body, headers={"x-request-id": "full"})
    assert full.json()["tokens_generated"] == LONG
    full_s = daemon.record("full")["duration_s"]
    with _connect(daemon.url) as leaving:
        leaving.sendall(_post(body, "gone"))
        time.sleep(min(0.05, full_s / 10))  # generating, far from done
    gone = daemon.record("gone", timeout=full_s * 2 + 5)
    assert gone["status"] == 499  # like a stream's client, it is gone: not a 200
    assert gone["duration_s"] < full_s / 2  # stopped, not run to its end
    assert daemon.metric("ortserve_active_generations") == 0
    follow = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    assert follow.status_code == 200, follow.text
    assert daemon.stop() == 0


def test_a_queued_request_whose_client_leaves_leaves_the_queue_at_once(start: Any) -> None:
    # The 135M shape: the request ahead must outlast the queued one's arrival and
    # departure (400 tokens take seconds there; the tiny model's 2,000 take ~0.3 s).
    shape = models.shape_135m()
    daemon = start(
        shape,
        MAX_NEW_TOKENS=str(LONG),
        MAX_CONCURRENCY="1",
        MAX_QUEUE="1",
        MAX_BATCH="1",
        QUEUE_TIMEOUT_S="60",
    )
    daemon.wait_for("READY=1")
    ahead_tokens = 400
    body = {"prompt": PROMPT, "max_new_tokens": ahead_tokens}
    replies: list[httpx.Response] = []

    def run_ahead() -> None:
        with httpx.Client(base_url=daemon.url, timeout=60) as client:
            replies.append(client.post("/generate", json=body, headers={"x-request-id": "ahead"}))

    ahead = threading.Thread(target=run_ahead)
    ahead.start()
    deadline = time.monotonic() + 10
    while not daemon.metric("ortserve_active_generations") and time.monotonic() < deadline:
        time.sleep(0.002)
    with _connect(daemon.url) as leaving:
        leaving.sendall(_post(body, "queued"))
        while not daemon.metric("ortserve_queue_depth") and time.monotonic() < deadline:
            time.sleep(0.002)
    queued = daemon.record("queued", timeout=10)
    ahead.join(60)
    assert queued["status"] == 499 and queued["completion_tokens"] == 0  # never generated
    assert replies[0].status_code == 200  # the request ahead ran on undisturbed
    assert 0 < replies[0].json()["tokens_generated"] <= ahead_tokens
    # It left the queue when its client left, not when the request ahead of it ended.
    assert queued["duration_s"] < daemon.record("ahead")["duration_s"]
    assert daemon.metric("ortserve_queue_depth") == 0
    assert daemon.stop() == 0


def test_idle_slow_and_surplus_connections_are_closed(start: Any) -> None:
    daemon = start(READ_TIMEOUT_S="2", KEEP_ALIVE_S="1", MAX_CONNECTIONS="4")
    daemon.wait_for("READY=1")
    idle = [_connect(daemon.url) for _ in range(4)]
    # Past the cap a newcomer closes the connection waiting longest, at once, not itself.
    newcomer = _connect(daemon.url)
    waited = _closed_within(idle[0], 1)
    assert waited is not None and waited < 0.5
    idle[0].close()
    idle = [*idle[1:], newcomer]
    # A connection that never sends a request is closed at the read timeout.
    for sock in idle:
        waited = _closed_within(sock, 6)
        assert waited is not None and waited < 4, waited
        sock.close()

    # Slowloris: a header line every 0.2 s never completes the head.
    slow = _connect(daemon.url)
    slow.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\n")
    stop = threading.Event()

    def trickle() -> None:
        for i in range(100):
            if stop.wait(0.2):
                return
            try:
                slow.sendall(f"x-slow-{i}: 1\r\n".encode())
            except OSError:  # closed by the server
                return

    sender = threading.Thread(target=trickle)
    sender.start()
    waited = _closed_within(slow, 10)
    stop.set()
    sender.join()
    slow.close()
    assert waited is not None and waited < 4, waited

    # A kept-alive connection idle after its response is closed at KEEP_ALIVE_S.
    with _connect(daemon.url) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
        reply = kept.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200"), reply
        waited = _closed_within(kept, 6)
        assert waited is not None and 0.5 < waited < 1.8, waited
    assert daemon.http.get("/healthz").status_code == 200
    assert daemon.stop() == 0


def _connect_from(url: str, source: str) -> socket.socket:
    """A connection from `source`, another loopback address (Linux routes 127/8 to lo)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def _closed_by_server(socks: list[socket.socket], count: int, timeout: float = 10) -> set[int]:
    """The indexes of `socks` the server has closed, once `count` are (or at the timeout)."""
    closed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        for i, sock in enumerate(socks):
            if i in closed:
                continue
            sock.setblocking(False)
            try:
                if sock.recv(1) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed.add(i)
        if len(closed) >= count or time.monotonic() > deadline:
            return closed
        time.sleep(0.02)


def test_idle_connections_from_one_peer_or_many_leave_probes_and_requests_served(
    start: Any,
) -> None:
    """#26 item 7: idle connections (no byte sent) held every connection the daemon allows,
    and it refused all others, probes too. Now one peer gets MAX_CONNECTIONS_PER_PEER (a
    newcomer from it closes its longest-waiting connection), and at MAX_CONNECTIONS a
    newcomer closes the busiest peer's longest-waiting connection."""
    cap = EdgeSettings.model_fields["max_connections"].default
    per_peer = EdgeSettings.model_fields["max_connections_per_peer"].default
    assert cap % per_peer == 0 and cap // per_peer >= 2
    # The defaults; a read timeout that cannot close the idle connections during the test.
    daemon = start(API_KEYS="k", READ_TIMEOUT_S="120")
    daemon.wait_for("READY=1")
    # One peer: past its cap each newcomer closes that peer's longest-waiting connection.
    extra = 36
    first = [_connect_from(daemon.url, "127.0.0.1") for _ in range(per_peer + extra)]
    assert _closed_by_server(first, extra) == set(range(extra))
    # So a probe from that same peer (a monitor beside the flood) is answered too.
    same = httpx.HTTPTransport(
        local_address="127.0.0.1", limits=httpx.Limits(max_keepalive_connections=0)
    )
    with httpx.Client(base_url=daemon.url, transport=same, timeout=10) as monitor:
        assert monitor.get("/healthz").status_code == 200
    assert _closed_by_server(first, extra + 1) == set(range(extra + 1))
    held = [*first[extra + 1 :], _connect_from(daemon.url, "127.0.0.1")]
    # More peers fill the global cap, each up to its own.
    peers = [held] + [
        [_connect_from(daemon.url, f"127.0.0.{2 + p}") for _ in range(per_peer)]
        for p in range(cap // per_peer - 1)
    ]
    idle = [sock for held in peers for sock in held]
    assert len(idle) == cap
    # At the cap each newcomer closes the longest-waiting connection of a peer holding the
    # most: two from each of the four peers, their two oldest; every newcomer stays open.
    newcomers = [_connect_from(daemon.url, "127.0.0.100") for _ in range(2 * len(peers))]
    closed = _closed_by_server(idle + newcomers, len(newcomers))
    assert closed == {p * per_peer + i for p in range(len(peers)) for i in (0, 1)}
    # At the cap still, probes and a request with a key from another peer are answered,
    # each on a connection of its own (as a load balancer's probes).
    fresh = httpx.HTTPTransport(
        local_address="127.0.0.101", limits=httpx.Limits(max_keepalive_connections=0)
    )
    with httpx.Client(base_url=daemon.url, transport=fresh, timeout=10) as other:
        probes = [other.get(path).status_code for path in ["/healthz", "/readyz"] * 10]
        assert probes == [200] * 20
        body = {"prompt": PROMPT, "max_new_tokens": 4}
        reply = other.post("/generate", json=body, headers={"x-api-key": "k"})
        assert reply.status_code == 200, reply.text
    assert f"127.0.0.1 has {per_peer} connections open: closing its longest" in daemon.stderr()
    for sock in idle + newcomers + first[: extra + 1]:
        sock.close()
    assert daemon.stop() == 0


def test_at_the_cap_a_newcomer_is_closed_unread_if_every_connection_has_a_request(
    start: Any,
) -> None:
    # The 135M shape: its 2,000 tokens take seconds, so the stream is surely still running.
    shape = models.shape_135m()
    daemon = start(shape, MAX_NEW_TOKENS=str(LONG), MAX_CONNECTIONS="1")
    daemon.wait_for("READY=1")
    with _connect(daemon.url) as busy:
        busy.sendall(_post({"prompt": PROMPT, "max_new_tokens": LONG, "stream": True}, "busy"))
        assert busy.recv(65536).startswith(b"HTTP/1.1 200")
        with _connect(daemon.url) as newcomer:
            assert _closed_within(newcomer, 5) is not None  # the read timeout is 10 s
        assert busy.recv(65536)  # the stream goes on
    assert daemon.stop() == 0


def test_the_drain_timeout_ends_streams_and_buffered_requests_with_shutting_down(
    start: Any,
) -> None:
    """Past the drain timeout, a stream ends with a final `shutting_down` SSE error event
    (no [DONE]) and a buffered request gets the OpenAI-shaped 503 with Retry-After; the
    exit status is 0 and no traceback reaches the log."""
    # The 135M shape, not the tiny model: its 2,000 tokens take seconds, so both requests
    # are surely still generating when SIGTERM comes (the tiny model's took ~0.3 s in CI).
    shape = models.shape_135m()
    daemon = start(
        shape, MAX_NEW_TOKENS=str(LONG), MAX_CONCURRENCY="2", MAX_BATCH="1", DRAIN_TIMEOUT_S="0"
    )
    daemon.wait_for("READY=1")
    buffered: dict[str, Any] = {}

    def ask() -> None:
        body = {"prompt": PROMPT, "max_new_tokens": LONG}
        with httpx.Client(base_url=daemon.url, timeout=30) as client:
            buffered["reply"] = client.post("/generate", json=body)

    asking = threading.Thread(target=ask)
    asking.start()
    deadline = time.monotonic() + 10
    while daemon.http.get("/healthz").json()["active"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    chat = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": LONG,
        "temperature": 0,
        "stream": True,
    }
    with daemon.http.stream("POST", "/v1/chat/completions", json=chat) as reply:
        chunks = reply.iter_raw()
        first = next(chunks)
        daemon.proc.send_signal(signal.SIGTERM)
        rest = b"".join(chunks)
    asking.join(30)
    blocks = [b for b in (first + rest).decode().split("\n\n") if b.strip()]
    assert blocks[-1] != "data: [DONE]"
    final = json.loads(blocks[-1].removeprefix("data: "))
    assert final["error"]["code"] == "shutting_down"
    answer = buffered["reply"]
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "shutting_down"
    assert answer.headers["retry-after"] == "5"
    assert daemon.proc.wait(30) == 0
    log = daemon.stderr()
    assert "Traceback" not in log and "CancelledError" not in log, log


def test_ctrl_c_says_it_drains_and_a_second_one_ends_the_stream_with_the_error_event(
    start: Any,
) -> None:
    """The first Ctrl-C drains and says so; the second stops at once, yet the stream still
    ends with its `shutting_down` event (not cut off); exit 130, as after any Ctrl-C."""
    # The 135M shape: 1,500 tokens take ~10 s, so the stream is surely still running.
    shape = models.shape_135m()
    n = 1500
    daemon = start(shape, MAX_NEW_TOKENS=str(n))
    daemon.wait_for("READY=1")
    body = {"prompt": PROMPT, "max_new_tokens": n, "ignore_eos": True, "stream": True}
    with daemon.http.stream("POST", "/generate", json=body) as reply:
        chunks = reply.iter_raw()
        first = next(chunks)
        daemon.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while "again to stop now" not in daemon.stderr() and time.monotonic() < deadline:
            time.sleep(0.01)
        log = daemon.stderr()
        assert "draining 1 in-flight request(s), up to 30 s… Ctrl-C again to stop now" in log
        assert daemon.proc.poll() is None  # draining: the stream goes on
        daemon.proc.send_signal(signal.SIGINT)
        rest = b"".join(chunks)
    final = _events(first + rest)[-1]
    assert final["error"]["code"] == "shutting_down", final
    assert daemon.proc.wait(10) == 130
    log = daemon.stderr()
    assert "Traceback" not in log and "CancelledError" not in log, log


def test_the_metrics_exposition_passes_promtool_check_metrics(start: Any) -> None:
    """Prometheus's own linter (Debian's prometheus package; `make system-deps`) finds
    nothing in a scrape taken after a generation: counters end in _total, units are
    base units, every family has HELP."""
    promtool = tool("promtool")
    daemon = start()
    daemon.wait_for("READY=1")
    reply = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 16})
    assert reply.status_code == 200, reply.text
    scrape = daemon.http.get("/metrics")
    assert scrape.status_code == 200
    assert "_created" not in scrape.text
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape.content,
        capture_output=True,
        timeout=30,
        check=False,
    )
    lint = (checked.stdout + checked.stderr).decode(errors="replace")
    assert checked.returncode == 0 and not lint.strip(), f"promtool: {lint}\n{scrape.text}"
    assert daemon.stop() == 0


def test_metrics_name_the_model_time_each_output_token_and_answer_head(
    start: Any, tiny_model_dir: Path
) -> None:
    daemon = start()
    daemon.wait_for("READY=1")
    body = {"prompt": PROMPT, "max_new_tokens": 16}
    generated = daemon.http.post("/generate", json=body, headers={"x-request-id": "t-1"}).json()
    assert generated["tokens_generated"] >= 2
    text = daemon.http.get("/metrics").text
    assert "# TYPE ortserve_batches_total counter" in text
    assert "# TYPE ortserve_batched_requests_total counter" in text
    info = re.findall(r"^ortserve_model_info\{(.*)\} (\S+)$", text, re.MULTILINE)
    assert len(info) == 1, text
    labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', info[0][0]))
    quality = read_manifest(tiny_model_dir).quality
    assert quality is not None and quality.ppl_ratio is not None
    assert labels == {
        "model": "ortserve/tiny-llama-random-weights",
        "digest": manifest_digest(tiny_model_dir),
        "provider": "cpu",
        "quality": quality.status,
        "quality_ppl_ratio": f"{quality.ppl_ratio:g}",
        "quality_top1_agreement": f"{quality.top1_agreement:g}",
        "quality_kl_divergence": f"{quality.kl_divergence:g}",
    }
    assert float(info[0][1]) == 1
    tpot = 'ortserve_time_per_output_token_seconds_{}{{route="/generate"}}'
    assert daemon.metric(tpot.format("count")) == 1
    record = daemon.record("t-1")
    per_token = (record["duration_s"] - record["ttft_s"]) / (record["completion_tokens"] - 1)
    assert 0 < daemon.metric(tpot.format("sum")) <= per_token * 1.01  # record: rounded
    head = daemon.http.head("/metrics")
    assert head.status_code == 200
    assert head.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert head.content == b""
    assert daemon.stop() == 0
