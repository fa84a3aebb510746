"""GET /: the chat playground page and its scripts, in process, on the edge daemon, and in a
real browser (desktop and phone)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ortserve.core import playground
from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.harness import InProcess, Reply, edge_server
from tests.tools import tool

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
    # Self-contained: no URL to anywhere else; the only files it loads are the vendored
    # scripts, from this origin, by relative URLs (so a path prefix in front works).
    assert "http://" not in page
    assert "https://" not in page
    assert re.findall(r"""(?:src|href)=["'](?!data:)([^"']*)""", page) == [
        route.lstrip("/") for route in playground.ASSETS
    ]
    # The policy allows exactly the page's own inline script and style, the vendored
    # scripts (this origin's), and calls home.
    policy = dict(
        p.strip().split(" ", 1) for p in reply.headers["content-security-policy"].split(";")
    )
    assert policy["default-src"] == "'none'"
    assert policy["connect-src"] == "'self'"
    for tag in ("script", "style"):
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
        assert len(blocks) == 1
        digest = base64.b64encode(hashlib.sha256(blocks[0].encode()).digest()).decode()
        own = "'self' " if tag == "script" else ""
        assert policy[f"{tag}-src"] == f"{own}'sha256-{digest}'"
    # Model text reaches the page as text, or as Markdown through DOMPurify's fragment.
    assert "innerHTML" not in page
    assert "RETURN_DOM_FRAGMENT: true" in page


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


def test_the_vendored_scripts_are_served_as_shipped(core: InProcess) -> None:
    """marked and DOMPurify come from the package itself (no CDN), without a key, as
    JavaScript that a browser may not sniff as anything else, revalidated by ETag."""
    vendor = Path(playground.__file__).parent / "vendor"
    for route, name in playground.ASSETS.items():
        reply = core.call("GET", route, headers=NO_KEY)
        assert reply.status == 200
        assert reply.body == (vendor / name).read_bytes()
        assert reply.headers["content-type"] == "text/javascript; charset=utf-8"
        assert reply.headers["x-content-type-options"] == "nosniff"
        etag = reply.headers["etag"]
        again = core.call("GET", route, headers={**NO_KEY, "if-none-match": f"W/{etag}"})
        assert (again.status, again.body, again.headers["etag"]) == (304, b"", etag)
        stale = core.call("GET", route, headers={**NO_KEY, "if-none-match": '"other"'})
        assert stale.status == 200 and stale.body == reply.body
        head = core.call("HEAD", route, headers=NO_KEY)
        assert (head.status, head.body) == (200, b"")
        assert core.call("POST", route, headers=NO_KEY).status == 405
    # Their licence headers travel with them.
    assert b"marked v18.2.1" in core.call("GET", "/vendor/marked.umd.js", headers=NO_KEY).body
    assert b"@license DOMPurify 3.4.18" in core.call("GET", "/vendor/purify.min.js").body
    assert core.call("GET", "/vendor/other.js", headers=NO_KEY).status == 401


def test_playground_on_the_edge_daemon(tiny_model_dir: Path, core: InProcess) -> None:
    """The same bytes from the real daemon, without a key while keys are set."""
    with edge_server(tiny_model_dir) as base:
        got = httpx.get(f"{base}/", timeout=30)
        head = httpx.head(f"{base}/", timeout=30)
        models = httpx.get(f"{base}/v1/models", timeout=30)
        script = httpx.get(f"{base}/vendor/purify.min.js", timeout=30)
        cached = httpx.get(
            f"{base}/vendor/purify.min.js",
            timeout=30,
            headers={"if-none-match": script.headers["etag"]},
        )
    reply = Reply(got.status_code, dict(got.headers), got.content)
    _check_page(reply)
    assert reply.body == core.call("GET", "/", headers=NO_KEY).body
    assert head.status_code == 200
    assert head.headers["content-type"] == "text/html; charset=utf-8"
    assert head.content == b""
    assert models.status_code == 401
    assert script.status_code == 200
    assert script.content == core.call("GET", "/vendor/purify.min.js").body
    assert (cached.status_code, cached.content) == (304, b"")


def _node_modules() -> None:
    """playwright-core in tests/browser/node_modules (npm ci once; kept afterwards)."""
    if (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        return
    npm = tool("npm")
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        check=False,
        cwd=BROWSER_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"npm ci failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"


def run_browser(
    base: str,
    key: str,
    shots: Path,
    message: str | None = None,
    max_tokens: int = 48,
    first_only: bool = False,
) -> dict[str, Any]:
    """Run tests/browser/playground.mjs against the page at `base` (screenshots into the
    folder `shots`) and return what the page showed; fails with the script's output if it
    failed. `first_only`: the first question alone, at the page's own defaults."""
    node = tool("node")
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium")
    _node_modules()
    shots.mkdir(parents=True, exist_ok=True)
    cmd = [
        node,
        str(BROWSER_DIR / "playground.mjs"),
        f"{base}/",
        key,
        str(shots),
        *([message] if message else []),
    ]
    env = {**os.environ, "MAX_TOKENS": str(max_tokens), "CHROMIUM": CHROMIUM}
    if first_only:
        env["FIRST_ONLY"] = "1"
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"playground.mjs failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _answers(base: str, key: str) -> dict[str, float]:
    """The daemon's generations of /v1/chat/completions so far, by how they ended."""
    scrape = httpx.get(f"{base}/metrics", headers={"authorization": f"Bearer {key}"}, timeout=30)
    found = re.findall(
        r'ortserve_answers_total\{ending="(\w+)",route="/v1/chat/completions"\} ([\d.]+)',
        scrape.text,
    )
    return {ending: float(count) for ending, count in found}


@pytest.mark.slow
def test_playground_in_a_real_browser(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Chromium, as a user: the key it asks for (then hidden), a streamed reply with the
    model, its EP and tokens/s; New chat while a reply streams; Markdown, sanitised; copy,
    regenerate, edit; chats kept across a reload; a phone's first screen."""
    key = "playground-key"
    message = "Hello! Who are you?"
    with edge_server(tiny_model_dir, {"ORTSERVE_API_KEYS": key}) as base:
        result = run_browser(base, key, tmp_path, message)
        deadline = time.monotonic() + 30
        while _answers(base, key).get("cancelled", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        answers = _answers(base, key)
    assert result["problems"] == []
    assert result["keyFormHidden"], "the API key form stays once the key is accepted"
    assert result["model"] == "ortserve/tiny-llama-random-weights"
    assert result["ep"] == "cpu"
    assert result["text"].strip()
    assert result["deltas"] > 1, result  # the text arrived in pieces: it streamed
    assert re.search(r"\d+ completion tokens · [\d.]+ tokens/s", result["stats"]), result
    assert "finish: length" in result["stats"]

    # New chat during a stream: an empty chat at once, Send free, and the next request
    # holds the new chat's one message; the server saw the long reply cancelled.
    assert result["afterNewChat"] == {"messages": 0, "sendDisabled": False, "stopShown": False}
    assert result["hiBody"]["messages"] == [{"role": "user", "content": "Hi"}]
    assert result["hiLog"][0] == "Hi" and len(result["hiLog"]) == 2
    assert answers.get("cancelled") == 1, answers
    # The stopped chat kept its question and what came of the answer.
    stopped = result["stopped"]
    assert [stopped["log"][0], stopped["log"][2]] == [message, "Tell me a very long story"]
    assert len(stopped["log"]) == 4 and stopped["log"][3], stopped
    assert len(stopped["stats"]) == 2 and stopped["stats"][1] == "stopped", stopped

    # Markdown rendered; the HTML in the reply shown as text, never run.
    md = result["markdown"]
    assert md["strong"] == ["bold"]
    assert md["code"] == ["print(1)\n"]
    assert "<script>window.pwned = 1</script>" in md["text"]
    assert '<img src=x onerror="window.pwned = 2">' in md["text"]
    assert not {"script", "img", "b"} & set(md["elements"]), md
    # A javascript: link leads nowhere; a web link opens apart, without the page as opener.
    assert md["handlers"] == [], md
    assert md["links"] == [
        [None, None, None],
        ["https://example.com", "_blank", "noopener noreferrer"],
    ], md
    assert md["pwned"] is None and md["pwnedLater"] is None and md["scripts"] == 0
    assert result["copied"].startswith("Here is **bold** text and code:\n\n```python")

    # Regenerate asks the same question again, without the old answer; edit restarts there.
    assert result["regenerateBody"]["messages"][-1] == {
        "role": "user",
        "content": "Some markdown please",
    }
    assert [m["role"] for m in result["regenerateBody"]["messages"]] == [
        "user",
        "assistant",
        "user",
    ]
    assert result["regenerateLog"] == ["Hi", "Some markdown please"]
    assert result["editBody"]["messages"] == [{"role": "user", "content": "Hello again"}]
    assert result["editLog"][0] == "Hello again" and len(result["editLog"]) == 2

    # Kept in the browser: the same chats and messages after a reload; a deleted one is gone.
    reload = result["reload"]
    assert reload["chats"] == reload["chatsBefore"]
    assert sorted(reload["chats"]) == sorted([message, "Hi"]), reload
    assert reload["same"] and reload["stats"] == 1
    assert result["afterDelete"] == ["Hi"]  # the edited chat keeps its first title

    assert "cannot reach the server at http://127.0.0.1:" in result["unreachable"]
    assert "is ortserve running" in result["unreachable"]

    # The phone's first screen is the chat: its input and the last message in view, the
    # settings and the chat list folded, no scrolling of the page itself.
    phone = result["phone"]
    assert (phone["width"], phone["height"]) == (390, 844)
    assert phone["prompt"]["top"] >= 0 and phone["prompt"]["bottom"] <= phone["height"], phone
    assert phone["send"]["right"] <= phone["width"], phone
    assert phone["lastVisible"] and not phone["pageScrolls"], phone
    assert not phone["settingsOpen"] and not phone["chatsOpen"] and phone["keyFormHidden"]
    for name in ("desktop.png", "phone.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
