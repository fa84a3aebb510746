"""A loopback fake of the Lambda Runtime API (2018-06-01), to drive the real `awslambdaric`.

It hands out queued events on `GET /runtime/invocation/next` and collects what the
runtime client posts back (`/response`, `/error`, `/runtime/init/error`). Every answer
is written with its headers and body in one send: a client that waits for the rest of
a response split over two packets stalls on delayed ACKs.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/2018-06-01/runtime"
FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:ortserve"


@dataclass(frozen=True)
class Outcome:
    """What the runtime client posted for one invocation.

    Attributes:
        kind: `response` or `error`.
        body: The posted body (the handler's JSON result, or the error document).
        headers: The request headers of the post (lower-case names).
    """

    kind: str
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        """The posted body as JSON."""
        return json.loads(self.body)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the caller (a test, a benchmark) reports what matters."""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        head = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Content-Length: {len(body)}",
            "Content-Type: application/json",
        ]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)  # one send

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return data
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        if self.path != f"{PREFIX}/invocation/next":
            self._send(404)
            return
        item = self.server.api.next_event()
        if item is None:  # the fake is stopping
            self._send(500, b'{"errorType":"Runtime.Stopping"}')
            return
        request_id, body = item
        deadline = int((time.time() + 300) * 1000)
        self._send(
            200,
            body,
            {
                "Lambda-Runtime-Aws-Request-Id": request_id,
                "Lambda-Runtime-Deadline-Ms": str(deadline),
                "Lambda-Runtime-Invoked-Function-Arn": FUNCTION_ARN,
                "Lambda-Runtime-Trace-Id": f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]}",
            },
        )

    def do_POST(self) -> None:
        body = self._body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.path == f"{PREFIX}/init/error":
            self.server.api.init_errors.put(Outcome("init_error", body, headers))
            self._send(202, b'{"status":"OK"}')
            return
        parts = self.path.removeprefix(f"{PREFIX}/invocation/").split("/")
        if len(parts) != 2 or parts[1] not in {"response", "error"}:
            self._send(404)
            return
        self.server.api.post(parts[0], Outcome(parts[1], body, headers))
        self._send(202, b'{"status":"OK"}')


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: FakeRuntimeApi) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A runtime client stopped mid-request (its process ended) is not an error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeRuntimeApi:
    """The Runtime API of one execution environment, on 127.0.0.1 (see `running`)."""

    def __init__(self) -> None:
        self._events: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        self._outcomes: dict[str, Outcome] = {}
        self._posted = threading.Condition()
        self.init_errors: queue.Queue[Outcome] = queue.Queue()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        """`host:port`, the value of AWS_LAMBDA_RUNTIME_API."""
        return f"127.0.0.1:{self._server.server_port}"

    def next_event(self) -> tuple[str, bytes] | None:
        """The next queued invocation (blocks, as Lambda's `next` does)."""
        return self._events.get()

    def post(self, request_id: str, outcome: Outcome) -> None:
        """Record the runtime client's answer to one invocation."""
        with self._posted:
            self._outcomes[request_id] = outcome
            self._posted.notify_all()

    def invoke(self, event: Any, timeout_s: float = 120) -> Outcome:
        """Queue `event` (JSON-encoded unless it is bytes) and wait for the answer."""
        request_id = str(uuid.uuid4())
        body = event if isinstance(event, bytes) else json.dumps(event).encode()
        self._events.put((request_id, body))
        with self._posted:
            if not self._posted.wait_for(lambda: request_id in self._outcomes, timeout_s):
                raise TimeoutError(f"no answer to invocation {request_id} in {timeout_s} s")
            return self._outcomes.pop(request_id)

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Release any blocked `next` and stop serving."""
        for _ in range(4):
            self._events.put(None)
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def running() -> Iterator[FakeRuntimeApi]:
    """A started fake, stopped on exit."""
    api = FakeRuntimeApi()
    api.start()
    try:
        yield api
    finally:
        api.stop()
