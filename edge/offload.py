"""Blocking work off the event loop, in daemon threads.

Daemon threads, not an executor: a generation that outlives the drain timeout must not
hold up the process's exit (executor and anyio worker threads are joined at exit).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


async def run_in_thread(fn: Callable[[], T], name: str = "ortserve-worker") -> T:
    """Run blocking `fn` in a new daemon thread and await its result (or its exception)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def set_result(result: T) -> None:
        if not future.cancelled():
            future.set_result(result)

    def set_exception(error: BaseException) -> None:
        if not future.cancelled():
            future.set_exception(error)

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting task, not lost in the thread
            _call_soon(loop, set_exception, exc)
        else:
            _call_soon(loop, set_result, result)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> bool:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the process is on its way out
        return False
    return True


_END = object()


class ChunkPump:
    """Iterates a blocking chunk iterator in a daemon thread; the loop awaits its chunks.

    The thread never waits for the client: it generates the next chunk while the loop
    sends the previous one. `cancel` makes it stop after the chunk it is computing and
    close the iterator (for a generation: stop and free its slot) in its own thread, the
    only one allowed to touch a running generator.
    """

    def __init__(self, chunks: Iterator[bytes], close: Callable[[], None]) -> None:
        """Pump `chunks`; call `close` in the pump thread once it stops, however it stops."""
        self._chunks = chunks
        self._close = close
        self._cancelled = threading.Event()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()

    def start(self) -> None:
        """Start the pump thread."""
        threading.Thread(target=self._run, name="ortserve-stream", daemon=True).start()

    def cancel(self) -> None:
        """Stop pumping (thread-safe, idempotent); the iterator is closed promptly."""
        self._cancelled.set()

    def _put(self, item: object) -> bool:
        return _call_soon(self._loop, self._queue.put_nowait, item)

    def _run(self) -> None:
        try:
            # The first chunk is pulled even when cancelled already: closing a generator
            # that never started skips its `finally` (the API's record, its in-flight
            # count and the generation's slot).
            while True:
                chunk = next(self._chunks, None)
                if chunk is None or not self._put(chunk) or self._cancelled.is_set():
                    break
        except BaseException as exc:  # re-raised in the loop by `__aiter__`
            self._put(exc)
        finally:
            try:
                self._close()
            finally:
                self._put(_END)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The chunks as they come; chunks that queued up meanwhile are joined into one."""
        while True:
            items = [await self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            data = b"".join(item for item in items if isinstance(item, bytes))
            if data:
                yield data
            for item in items:  # the end marker (after any error) comes last
                if isinstance(item, BaseException):
                    raise item
                if item is _END:
                    return
