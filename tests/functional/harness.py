"""One request suite, every adapter: each target implements `call` and gets the API tests.

A new target (Lambda, Cloud Functions, ...) adds a `Target` here and a fixture param in
tests/functional/test_api.py; the same requests must give the same bytes everywhere
(ids and timestamps aside, which must have the same shape).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.api import Api
from core.http import Request

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

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply: ...  # fmt: skip


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
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:  # fmt: skip
        hdrs = {"content-type": "application/json", **AUTH, **(headers or {})}
        request = Request(method, path, {}, {k.lower(): v for k, v in hdrs.items()},
                          encode_body(body, raw))  # fmt: skip
        response = self.api.handle(request)
        chunks = [response.body] if isinstance(response.body, bytes) else list(response.body)
        headers_out = {k.lower(): v for k, v in response.headers}
        return Reply(response.status, headers_out, b"".join(chunks), chunks)


_VOLATILE = [
    (re.compile(rb'"id":"(cmpl|chatcmpl)-[0-9a-f]{32}"'), rb'"id":"\1-ID"'),
    (re.compile(rb'"created":\d{10}'), rb'"created":0'),
]


def normalized(body: bytes) -> bytes:
    """The body with ids and timestamps replaced by placeholders of the same shape."""
    for pattern, repl in _VOLATILE:
        body = pattern.sub(repl, body)
    return body
