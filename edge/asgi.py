"""The ASGI face of `core.api.Api`: translate, call it off the event loop, write back.

No framework: an ASGI request becomes a `core.http.Request`; `Api.handle` runs in a
worker thread (it may run a whole generation); its `Response` is written at once, or,
for a stream, chunk by chunk as the generation produces them. A client that goes away
mid-stream closes the stream, which stops the generation and frees its slot; one that goes
away while its answer is computed (a buffered generation, or a wait for a slot) sets the
request's `cancelled`, which stops it too, and is sent nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from threading import Event
from typing import Any, Protocol

from ortserve.core.http import Headers, Request, Response
from ortserve.edge.offload import ChunkPump, run_in_thread

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Methods that never generate: they get threads of their own, so health checks answer
# while every generation thread is busy or waiting for a slot.
_CHEAP_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CHEAP_THREADS = 4
# The probes are answered in the event loop itself: they never wait, and a thread of
# their own would take several more turns of the GIL, which a prefill in parts gives only
# between its parts (a /healthz then waited ~3 parts instead of at most one).
_INLINE = frozenset(
    {("GET", "/healthz"), ("GET", "/readyz"), ("HEAD", "/healthz"), ("HEAD", "/readyz")}
)
_MAX_WORK_THREADS = 256


class Handler(Protocol):
    """What the app serves: `core.api.Api`, or anything that answers `core.http` requests."""

    def handle(self, request: Request) -> Response:
        """Answer `request` (blocking; a stream's chunks may block too)."""
        ...


class EdgeApp:
    """An ASGI application serving `api` (a `core.api.Api`; `/metrics` is one of its routes
    when the daemon gives it a scrape).

    Attributes:
        in_flight: HTTP requests inside the app now (from the first byte read to the
            last byte written).
    """

    def __init__(self, api: Handler, max_body_bytes: int, workers: int) -> None:
        """Serve `api`; bodies over `max_body_bytes` are not read further (the API answers
        413); at most `workers` calls that may generate run at once (others wait here).

        Size `workers` to the engine's slots plus its queue, so that every request the
        engine would admit or queue has a thread and the others are refused by it at once.
        """
        self.api = api
        self.max_body_bytes = max_body_bytes
        self.in_flight = 0
        self._work = asyncio.Semaphore(max(1, min(workers, _MAX_WORK_THREADS)))
        self._cheap = asyncio.Semaphore(_CHEAP_THREADS)
        self._pumps: set[ChunkPump] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point (http and lifespan scopes)."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            self.in_flight += 1
            try:
                await self._http(scope, receive, send)
            finally:
                self.in_flight -= 1

    def cancel_streams(self) -> None:
        """Stop every running stream (shutdown after the drain timeout)."""
        for pump in list(self._pumps):
            pump.cancel()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = str(scope["method"]).upper()
        body = await _read_body(receive, self.max_body_bytes)
        if body is None:
            return  # the client left before sending its request
        request = _request(scope, method, body)
        gate = self._cheap if method in _CHEAP_METHODS else self._work
        # An oversize body (answered 413 at once) is not watched: that would read its rest.
        if (method, request.path) in _INLINE:
            response = self.api.handle(request)
        elif len(body) <= self.max_body_bytes:
            response = await _watched(self._handle(request, gate), receive, request.cancelled)
        else:
            response = await self._handle(request, gate)
        if isinstance(response.body, bytes):
            if not request.cancelled.is_set():  # else no one is left to read it
                await _send_bytes(send, response)
        else:  # pumped even for a client gone: that stops the stream and ends its record
            await self._send_stream(response, receive, send, request.cancelled)

    async def _handle(self, request: Request, gate: asyncio.Semaphore) -> Response:
        async with gate:
            return await run_in_thread(lambda: self.api.handle(request))

    async def _send_stream(
        self, response: Response, receive: Receive, send: Send, cancelled: Event
    ) -> None:
        assert not isinstance(response.body, bytes)
        pump = ChunkPump(response.body, response.close_body)
        self._pumps.add(pump)
        pump.start()  # generation goes on while the headers are sent

        def gone() -> None:
            # The pump sees its cancel between chunks only; the generation sees `cancelled`
            # between a prefill's parts too (its first chunk waits for the whole prefill).
            cancelled.set()
            pump.cancel()

        watcher = asyncio.create_task(_on_disconnect(receive, gone))
        try:
            await send(_start(response))
            async for chunk in pump:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            pump.cancel()  # the client is gone, or the task was cancelled at shutdown
            watcher.cancel()
            self._pumps.discard(pump)


def _request(scope: Scope, method: str, body: bytes) -> Request:
    headers = Headers((n.decode("latin-1"), v.decode("latin-1")) for n, v in scope["headers"])
    return Request(method, scope["path"], headers, body)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body; past `limit` only its first limit+1 bytes (enough for the API to
    refuse it with its own 413), without reading the rest. None: the client left."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return bytes(body[: limit + 1])
        if not message.get("more_body", False):
            return bytes(body)


def _start(response: Response, extra: list[tuple[bytes, bytes]] | None = None) -> Message:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
    return {
        "type": "http.response.start",
        "status": response.status,
        "headers": headers + (extra or []),
    }


async def _send_bytes(send: Send, response: Response) -> None:
    assert isinstance(response.body, bytes)
    length = [(b"content-length", str(len(response.body)).encode())]
    await send(_start(response, length))
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


async def _watched(answer: Awaitable[Response], receive: Receive, cancelled: Event) -> Response:
    """Await `answer`, setting `cancelled` if the client leaves meanwhile."""
    watcher = asyncio.create_task(_on_disconnect(receive, cancelled.set))
    try:
        return await answer
    finally:
        watcher.cancel()
        await asyncio.wait({watcher})  # one reader of `receive` at a time


async def _on_disconnect(receive: Receive, callback: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    callback()


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to set up or tear down here; the daemon owns the model's life."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
