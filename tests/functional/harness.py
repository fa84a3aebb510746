"""One request suite, every adapter: each target implements `call` and gets the API tests.

A new target (Lambda, Cloud Functions, ...) adds a `Target` here and a fixture param in
tests/functional/test_api.py; the same requests must give the same bytes everywhere
(ids and timestamps aside, which must have the same shape).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks.support.servers import daemon, functions_framework
from ortserve.core.api import Api
from ortserve.core.http import Headers, Request

API_KEY = "test-key-1"
AUTH = {"authorization": f"Bearer {API_KEY}"}


@dataclass
class Reply:
    """What a client saw: status, headers (lower-case names), body and its chunks."""

    status: int
    headers: dict[str, str]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The SSE `data:` payloads, parsed ([DONE] kept as the string)."""
        out: list[Any] = []
        for block in self.body.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
        return out


class Target(Protocol):
    """A deployment target under test."""

    name: str

    def open_stream(self, path: str, body: Any) -> AbstractContextManager[Iterator[bytes]]:
        """POST `body` and iterate the response body's chunks as they arrive."""
        ...

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply: ...


def request_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """JSON content type and the test API key, then `headers`; an empty value stands for
    "no such header"."""
    merged = {"content-type": "application/json", **AUTH, **(headers or {})}
    return {k: v for k, v in merged.items() if v}


def encode_body(body: Any, raw: bytes | None) -> bytes:
    """The request body: raw bytes as given, else JSON."""
    if raw is not None:
        return raw
    return b"" if body is None else json.dumps(body).encode()


class InProcess:
    """The core Api called directly: the reference every adapter must match."""

    name = "core"

    def __init__(self, api: Api) -> None:
        self.api = api

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        hdrs = request_headers(headers)
        request = Request(method, path, Headers(hdrs), encode_body(body, raw))
        response = self.api.handle(request)
        chunks = [response.body] if isinstance(response.body, bytes) else list(response.body)
        headers_out = {k.lower(): v for k, v in response.headers}
        return Reply(response.status, headers_out, b"".join(chunks), chunks)

    @contextmanager
    def open_stream(self, path: str, body: Any) -> Iterator[Iterator[bytes]]:
        """The streamed body as the core produces it."""
        request = Request("POST", path, Headers(AUTH), encode_body(body, None))
        response = self.api.handle(request)
        assert not isinstance(response.body, bytes)
        try:
            yield response.body
        finally:
            response.close_body()


_VOLATILE = [
    (re.compile(rb'"id":"(cmpl|chatcmpl)-[0-9a-f]{32}"'), rb'"id":"\1-ID"'),
    (re.compile(rb'"created":\d{10}'), rb'"created":0'),
    (re.compile(rb'"id":"msg_[0-9a-f]{32}"'), rb'"id":"msg_ID"'),
    # Each bake has its own manifest digest (the target is part of it).
    (re.compile(rb'"system_fingerprint":"fp_[0-9a-f]{12}"'), rb'"system_fingerprint":"fp_X"'),
]


def normalized(body: bytes) -> bytes:
    """The body with ids and timestamps replaced by placeholders of the same shape."""
    for pattern, repl in _VOLATILE:
        body = pattern.sub(repl, body)
    return body


class Http:
    """A target reached over HTTP on loopback (a real server process)."""

    def __init__(self, name: str, base_url: str) -> None:
        self.name = name
        self.base_url = base_url

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        import httpx

        hdrs = request_headers(headers)
        content = encode_body(body, raw)
        with (
            httpx.Client(base_url=self.base_url, timeout=120) as client,
            client.stream(method, path, content=content, headers=hdrs) as response,
        ):
            chunks = list(response.iter_raw())
            headers_out = {k.lower(): v for k, v in response.headers.items()}
        return Reply(response.status_code, headers_out, b"".join(chunks), chunks)

    @contextmanager
    def open_stream(self, path: str, body: Any) -> Iterator[Iterator[bytes]]:
        """The streamed body as the client receives it, chunk by chunk."""
        import httpx

        with (
            httpx.Client(base_url=self.base_url, timeout=120) as client,
            client.stream("POST", path, content=encode_body(body, None), headers=AUTH) as response,
        ):
            assert response.status_code == 200
            yield response.iter_raw()


SERVER_ENV = {
    "ORTSERVE_API_KEYS": f"{API_KEY},other-key",
    "ORTSERVE_MAX_BODY_BYTES": str(64 * 1024),
    "ORTSERVE_MAX_NEW_TOKENS": "2000",
    "ORTSERVE_PROVIDERS": "cpu",
}


@contextmanager
def gcf_server(bundle: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The real functions-framework server on the baked gcf bundle, as gcloud would run it
    (`env`: extra settings)."""
    with functions_framework(bundle, {**os.environ, **SERVER_ENV, **(env or {})}) as server:
        server.wait_ready()
        yield server.base


@contextmanager
def edge_server(model_dir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The real edge daemon (`ortserve serve`) on loopback (`env`: extra settings)."""
    with daemon(model_dir, {**os.environ, **SERVER_ENV, **(env or {})}) as (base, _):
        yield base
