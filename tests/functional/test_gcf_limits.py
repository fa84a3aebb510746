"""The Cloud Functions target's body limit, through the real functions-framework server:
a body over ORTSERVE_MAX_BODY_BYTES is answered 413 without being read to its end."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.functional.harness import API_KEY, gcf_server

pytestmark = pytest.mark.slow

LIMIT = 64 * 1024  # the harness's ORTSERVE_MAX_BODY_BYTES


@pytest.fixture(scope="module")
def base(tiny_gcf_bundle: Path) -> Iterator[str]:
    with gcf_server(tiny_gcf_bundle) as url:
        yield url


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _head(extra: str) -> bytes:
    return (
        f"POST /generate HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {API_KEY}\r\n"
        f"content-type: application/json\r\n{extra}\r\n"
    ).encode()


def _answer(sock: socket.socket) -> tuple[int, Any]:
    """The server's response; a socket timeout (10 s) means it never answered."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read())


def test_a_declared_oversize_body_is_refused_before_it_is_read(base: str) -> None:
    with _connect(base) as sock:
        # 300 MB announced, 1 KB sent: the answer may not wait for the rest.
        sock.sendall(_head("content-length: 300000000\r\n") + b"x" * 1024)
        status, body = _answer(sock)
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"
    assert body["error"]["type"] == "invalid_request_error"


def test_a_chunked_oversize_body_is_read_only_to_the_limit(base: str) -> None:
    chunk = b"x" * 16384
    with _connect(base) as sock:
        sock.sendall(_head("transfer-encoding: chunked\r\n"))
        for _ in range(LIMIT // len(chunk) + 2):  # past the limit, and never a last chunk
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, body = _answer(sock)
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"


def test_a_chunked_body_under_the_limit_is_served(base: str) -> None:
    data = json.dumps({"prompt": "Hello", "max_new_tokens": 4}).encode()
    with _connect(base) as sock:
        sock.sendall(_head("transfer-encoding: chunked\r\n"))
        sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        status, body = _answer(sock)
    assert status == 200, body
    assert body["tokens_generated"] == 4
