"""`ortserve reload` / `rollback` on a daemon with keys (#49 item 8b): /readyz says only
its status without a key, so the switch asks it with the first admin key (else API key)
of the daemon's settings file."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ortserve.edge.switch import local_key, readyz


def test_the_key_is_the_first_admin_key_else_the_first_api_key(tmp_path: Path) -> None:
    env = tmp_path / "ortserve.env"
    assert local_key(env) is None  # no file
    env.write_text("ORTSERVE_PORT=8000\n# ORTSERVE_ADMIN_KEYS=commented\n")
    assert local_key(env) is None
    env.write_text("ORTSERVE_API_KEYS= , app-1,app-2\n")
    assert local_key(env) == "app-1"
    env.write_text("ORTSERVE_API_KEYS=app-1\nORTSERVE_ADMIN_KEYS='adm-1,adm-2'\n")
    assert local_key(env) == "adm-1"


class _Probe(BaseHTTPRequestHandler):
    """/readyz as a daemon with the key `k` answers it."""

    def do_GET(self) -> None:
        keyed = self.headers.get("authorization") == "Bearer k"
        payload = {"status": "ready", **({"manifest_digest": "d"} if keyed else {})}
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Probe)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_readyz_is_asked_with_the_key(url: str) -> None:
    assert readyz(url) == {"status": "ready"}
    assert readyz(url, key="k") == {"status": "ready", "manifest_digest": "d"}
