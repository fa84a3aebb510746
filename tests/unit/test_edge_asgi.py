"""The edge's ASGI app driven directly: translation, body limit, streaming, disconnects."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Iterator
from typing import Any

import pytest

from ortserve.core.http import Request, Response, json_response, sse_response
from ortserve.edge.asgi import EdgeApp, Message
from ortserve.edge.offload import ChunkPump


class FakeApi:
    """Answers every request with `answer(request)`; remembers the requests."""

    def __init__(self, answer: Callable[[Request], Response]) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self.threads: list[threading.Thread] = []

    def handle(self, request: Request) -> Response:
        self.requests.append(request)
        self.threads.append(threading.current_thread())
        return self.answer(request)


class Client:
    """One ASGI HTTP exchange: feeds the request's messages, records what is sent."""

    def __init__(self, body_parts: list[bytes] | None = None) -> None:
        parts = body_parts if body_parts is not None else [b""]
        self.incoming: asyncio.Queue[Message] = asyncio.Queue()
        for i, part in enumerate(parts):
            more = i < len(parts) - 1
            self.incoming.put_nowait({"type": "http.request", "body": part, "more_body": more})
        self.received = 0
        self.sent: list[Message] = []
        self.sent_event = asyncio.Event()

    async def receive(self) -> Message:
        message = await self.incoming.get()
        if message["type"] == "http.request":
            self.received += 1
        return message

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        self.sent_event.set()

    def disconnect(self) -> None:
        self.incoming.put_nowait({"type": "http.disconnect"})

    async def first_chunk(self) -> None:
        """Wait until the app has sent the first body chunk."""
        while not self.chunks:
            await self.sent_event.wait()
            self.sent_event.clear()

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def chunks(self) -> list[bytes]:
        return [m["body"] for m in self.sent[1:] if m["body"]]

    @property
    def complete(self) -> bool:
        return bool(self.sent) and self.sent[-1].get("more_body") is False


def scope(method: str = "GET", path: str = "/x", query: bytes = b"", headers: Any = ()) -> Any:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": list(headers),
    }


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=10))


def app_for(api: FakeApi, max_body: int = 1024) -> EdgeApp:
    return EdgeApp(api, max_body_bytes=max_body, workers=4)


def test_request_is_translated_and_answered_from_a_worker_thread() -> None:
    api = FakeApi(lambda r: json_response(201, {"ok": True}, [("X-Thing", "1")]))
    headers = [(b"Content-Type", b"application/json"), (b"x-a", b"1"), (b"x-a", b"2")]

    async def go() -> None:
        client = Client([b'{"pro', b'mpt":1}'])
        sc = scope("post", "/v1/completions", b"a=1&b=2&a=3&e=", headers)
        await app_for(api)(sc, client.receive, client.send)
        assert client.status == 201
        assert client.headers[b"x-thing"] == b"1"
        assert client.headers[b"content-length"] == b"11"
        assert client.chunks == [b'{"ok":true}'] and client.complete

    run(go())
    (request,) = api.requests
    assert request.method == "POST"
    assert request.path == "/v1/completions"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-a"] == "1, 2"
    assert request.body == b'{"prompt":1}'
    assert api.threads[0] is not threading.main_thread()


def test_an_oversize_body_is_not_read_to_its_end() -> None:
    api = FakeApi(lambda r: json_response(413, {"n": len(r.body)}))

    async def go() -> None:
        client = Client([b"x" * 600] * 100)
        await app_for(api, max_body=1000)(scope("POST"), client.receive, client.send)
        assert client.received == 2  # 1200 bytes read: enough to know, no more
        assert client.status == 413

    run(go())
    assert len(api.requests[0].body) == 1001


def test_health_checks_answer_while_every_generation_thread_is_busy() -> None:
    release = threading.Event()

    def answer(request: Request) -> Response:
        if request.method == "POST":
            release.wait(5)
        return json_response(200, {})

    api = FakeApi(answer)
    app = EdgeApp(api, max_body_bytes=1024, workers=1)

    async def go() -> None:
        busy = Client()
        slow = asyncio.create_task(app(scope("POST"), busy.receive, busy.send))
        await asyncio.sleep(0.05)
        health = Client()
        start = time.monotonic()
        await app(scope("GET", "/healthz"), health.receive, health.send)
        assert health.status == 200 and time.monotonic() - start < 1
        assert not slow.done() and app.in_flight == 1
        release.set()
        await slow
        assert busy.status == 200 and app.in_flight == 0

    run(go())


def test_each_stream_chunk_is_sent_before_the_next_is_made() -> None:
    sent_first = threading.Event()
    closed = threading.Event()

    def chunks() -> Iterator[bytes]:
        try:
            yield b"data: 1\n\n"
            assert sent_first.wait(5), "the first chunk was held back"
            yield b"data: 2\n\n"
        finally:
            closed.set()

    api = FakeApi(lambda r: sse_response(chunks()))

    async def go() -> None:
        client = Client()
        task = asyncio.create_task(app_for(api)(scope("POST"), client.receive, client.send))
        await client.first_chunk()
        assert client.chunks == [b"data: 1\n\n"]
        assert client.headers[b"content-type"].startswith(b"text/event-stream")
        assert b"content-length" not in client.headers
        sent_first.set()
        await task
        assert client.chunks == [b"data: 1\n\n", b"data: 2\n\n"] and client.complete

    run(go())
    assert closed.is_set()


def test_a_client_that_leaves_mid_stream_closes_the_stream() -> None:
    closed = threading.Event()
    produced = 0

    def endless() -> Iterator[bytes]:
        nonlocal produced
        try:
            while True:
                produced += 1
                time.sleep(0.001)
                yield b"data: x\n\n"
        finally:
            closed.set()

    api = FakeApi(lambda r: sse_response(endless()))

    async def go() -> None:
        client = Client()
        task = asyncio.create_task(app_for(api)(scope("POST"), client.receive, client.send))
        await client.first_chunk()
        client.disconnect()
        await task

    run(go())
    assert closed.wait(1)
    count = produced
    time.sleep(0.05)
    assert produced == count  # nothing runs after the close


def test_an_error_inside_a_stream_ends_the_response_with_the_error() -> None:
    def broken() -> Iterator[bytes]:
        yield b"data: 1\n\n"
        raise RuntimeError("bug")

    api = FakeApi(lambda r: sse_response(broken()))

    async def go() -> None:
        client = Client()
        # Raised to the server, which drops the connection: the client sees no clean end.
        with pytest.raises(RuntimeError, match="bug"):
            await app_for(api)(scope("POST"), client.receive, client.send)
        assert b"".join(client.chunks) == b"data: 1\n\n" and not client.complete

    run(go())


def test_lifespan_is_acknowledged() -> None:
    async def go() -> None:
        client = Client([])
        client.incoming.put_nowait({"type": "lifespan.startup"})
        client.incoming.put_nowait({"type": "lifespan.shutdown"})
        await app_for(FakeApi(lambda r: Response(200)))(
            {"type": "lifespan"}, client.receive, client.send
        )
        assert [m["type"] for m in client.sent] == [
            "lifespan.startup.complete",
            "lifespan.shutdown.complete",
        ]

    run(go())


def test_a_client_that_leaves_while_its_answer_is_computed_cancels_it() -> None:
    """A buffered generation (or a wait for a slot) sees `cancelled` and stops; the
    answer it then gives (the API's 499) is not sent to a client that is gone."""
    seen: list[bool] = []

    def answer(request: Request) -> Response:
        seen.append(request.cancelled.wait(5))
        return json_response(499, {})

    api = FakeApi(answer)

    async def go() -> None:
        client = Client()
        task = asyncio.create_task(app_for(api)(scope("POST"), client.receive, client.send))
        while not api.requests:
            await asyncio.sleep(0.001)
        client.disconnect()
        await task
        assert client.sent == []

    run(go())
    assert seen == [True]


def test_a_request_answered_normally_is_not_cancelled() -> None:
    api = FakeApi(lambda r: json_response(200, {}))

    async def go() -> None:
        client = Client()
        await app_for(api)(scope("POST"), client.receive, client.send)
        assert client.status == 200 and client.complete

    run(go())
    assert not api.requests[0].cancelled.is_set()


def test_a_stream_cancelled_before_its_first_chunk_still_runs_its_end() -> None:
    """A generator closed before it started would skip its `finally` (the API's record,
    its in-flight count): the pump pulls its first chunk even when cancelled at once."""
    ended = threading.Event()

    def chunks() -> Generator[bytes, None, None]:
        try:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            ended.set()

    async def go() -> None:
        body = chunks()
        pump = ChunkPump(body, body.close)
        pump.cancel()  # the client left before the pump thread began
        pump.start()
        assert [chunk async for chunk in pump] in ([], [b"data: 1\n\n"])

    run(go())
    assert ended.is_set()
