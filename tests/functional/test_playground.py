"""GET /: the chat playground page, in process, on the edge daemon, and in a real browser."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.api import Api
from core.settings import ServerSettings
from core.state import ModelState
from tests.functional.harness import InProcess, Reply, edge_server

BROWSER_DIR = Path(__file__).resolve().parents[1] / "browser"
CHROMIUM = "/usr/bin/chromium"
NO_KEY = {"authorization": ""}


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> InProcess:
    """The core with API keys set and no model (still "loading"): the page needs neither."""
    model_dir = tmp_path_factory.mktemp("no-model")
    settings = ServerSettings(model_dir=model_dir, providers="cpu", api_keys=["k1"])
    return InProcess(Api(ModelState(settings), settings))


def _check_page(reply: Reply) -> None:
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    assert reply.headers["x-content-type-options"] == "nosniff"
    page = reply.body.decode()
    assert page.startswith("<!doctype html>")
    assert "<title>ortserve playground</title>" in page
    # Self-contained: no external asset, no URL to anywhere else.
    assert "http://" not in page
    assert "https://" not in page
    assert not re.search(r"""(src|href)=["'](?!data:)""", page)
    # The policy allows exactly the page's own inline script and style, and calls home.
    policy = dict(
        p.strip().split(" ", 1) for p in reply.headers["content-security-policy"].split(";")
    )
    assert policy["default-src"] == "'none'"
    assert policy["connect-src"] == "'self'"
    for tag in ("script", "style"):
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
        assert len(blocks) == 1
        digest = base64.b64encode(hashlib.sha256(blocks[0].encode()).digest()).decode()
        assert policy[f"{tag}-src"] == f"'sha256-{digest}'"
    assert "innerHTML" not in page  # model text is set with textContent only


def test_playground_in_process_needs_no_key_nor_model(core: InProcess) -> None:
    _check_page(core.call("GET", "/", headers=NO_KEY))
    head = core.call("HEAD", "/", headers=NO_KEY)
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-type"] == "text/html; charset=utf-8"
    assert core.call("GET", "/v1/models", headers=NO_KEY).status == 401  # keys are on
    assert core.call("POST", "/", headers=NO_KEY).status == 405
    # Another path is no public route: without a key it is a 401 (routes are not
    # discoverable), with one a 404.
    assert core.call("GET", "/index.html", headers=NO_KEY).status == 401
    assert core.call("GET", "/index.html", headers={"authorization": "Bearer k1"}).status == 404


def test_playground_on_the_edge_daemon(tiny_model_dir: Path, core: InProcess) -> None:
    """The same bytes from the real daemon, without a key while keys are set."""
    with edge_server(tiny_model_dir) as base:
        got = httpx.get(f"{base}/", timeout=30)
        head = httpx.head(f"{base}/", timeout=30)
        models = httpx.get(f"{base}/v1/models", timeout=30)
    reply = Reply(got.status_code, dict(got.headers), got.content)
    _check_page(reply)
    assert reply.body == core.call("GET", "/", headers=NO_KEY).body
    assert head.status_code == 200
    assert head.headers["content-type"] == "text/html; charset=utf-8"
    assert head.content == b""
    assert models.status_code == 401


def _node_modules() -> None:
    """playwright-core in tests/browser/node_modules (npm ci once; kept afterwards)."""
    if (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed: the browser test needs Node.js 18+ with npm")
    proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], check=False, cwd=BROWSER_DIR,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"npm ci failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"


def run_browser(base: str, key: str, screenshot: Path, message: str | None = None,
                max_tokens: int = 48) -> dict[str, Any]:  # fmt: skip
    """Run tests/browser/playground.mjs against the page at `base` (a chat with `message`)
    and return what the page showed; fails with the script's output if it failed."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "node is not installed: the browser test needs Node.js 18+ (apt install nodejs)"
        )
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium")
    _node_modules()
    cmd = [node, str(BROWSER_DIR / "playground.mjs"), f"{base}/", key, str(screenshot),
           *([message] if message else [])]  # fmt: skip
    env = {**os.environ, "MAX_TOKENS": str(max_tokens), "CHROMIUM": CHROMIUM}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"playground.mjs failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_playground_chats_in_a_real_browser(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Chromium opens the page, enters the key it asks for, sends a message and sees the
    reply stream in, with the model, its EP and the tokens/s from the usage."""
    key = "playground-key"
    shot = tmp_path / "playground.png"
    with edge_server(tiny_model_dir, {"ORTSERVE_API_KEYS": key}) as base:
        result = run_browser(base, key, shot)
    assert result["model"] == "ortserve/tiny-llama-random-weights"
    assert result["ep"] == "cpu"
    assert result["text"].strip()
    assert result["deltas"] > 1, result  # the text arrived in pieces: it streamed
    assert re.search(r"\d+ completion tokens · [\d.]+ tokens/s", result["stats"]), result
    assert shot.read_bytes().startswith(b"\x89PNG")
