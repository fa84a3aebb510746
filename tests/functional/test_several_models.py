"""Several models behind one daemon (core.registry): `ortserve serve MODEL MORE...`, each
route picking its model by `model`, loads on first use, Ollama's keep_alive, the memory
budget from the sizing formula, one model's engine fault costing only its requests, and
the listings (/v1/models, /api/tags, /api/ps with when each unloads, /readyz)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.support.servers import ORTSERVE, free_port, serve_process
from ortserve.core.settings import EngineSettings
from ortserve.core.sizing import RUNTIME_MIB, model_memory
from tests.functional.harness import AUTH, SERVER_ENV
from tests.models import all_minilm

pytestmark = pytest.mark.slow

TINY = "ortserve/tiny-llama-random-weights"
CHAT = [{"role": "user", "content": "Hi"}]


@contextmanager
def served(model_dir: Path, more: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """`ortserve serve MODEL MORE...` on loopback, as a user starts it."""
    port = free_port()
    cmd = [*ORTSERVE, "serve", str(model_dir), *more, "--host", "127.0.0.1", "--port", str(port)]
    with serve_process(cmd, {**os.environ, **SERVER_ENV, **(env or {})}, port) as server:
        yield server.base


def _chat(base: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": CHAT, "max_tokens": 4, **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=120)


def _loaded(base: str) -> dict[str, str]:
    """/api/ps: each loaded model's name and when it unloads."""
    models = httpx.get(f"{base}/api/ps", headers=AUTH, timeout=30).json()["models"]
    return {m["name"]: m["expires_at"] for m in models}


def _until(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _need_mib(model_dir: Path) -> int:
    """A model's memory beside the runtime, as the server counts it (core.registry)."""
    defaults = EngineSettings.model_fields
    sequences = int(defaults["max_concurrency"].default) * int(defaults["max_batch"].default)
    terms = model_memory(model_dir, sequences, engine_process=True)
    return terms.total_mib - RUNTIME_MIB - terms.kept_mib


@pytest.fixture(scope="module")
def three(tiny_model_dir: Path) -> Iterator[str]:
    """The tiny model, the same folder as `other`, and MiniLM: three models, two
    generative (each its own engine process) and an embedding one."""
    # The harness's key is an admin key here: keep_alive changes what the server holds.
    admin = {
        "ORTSERVE_API_KEYS": "other-key",
        "ORTSERVE_ADMIN_KEYS": SERVER_ENV["ORTSERVE_API_KEYS"].split(",")[0],
    }
    with served(tiny_model_dir, [f"other={tiny_model_dir}", str(all_minilm())], admin) as base:
        yield base


def test_each_route_picks_its_model_and_an_unknown_one_is_named(three: str) -> None:
    assert set(_loaded(three)) == {TINY}  # the others load on their first request
    listed = httpx.get(f"{three}/v1/models", headers=AUTH, timeout=30).json()["data"]
    assert [m["id"] for m in listed] == [TINY, "other", "all-minilm:l6-v2"]
    for model in (TINY, "other"):
        reply = _chat(three, model)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == model
    ollama = {"model": "other", "prompt": "Hi", "stream": False, "options": {"num_predict": 3}}
    assert httpx.post(f"{three}/api/generate", json=ollama, headers=AUTH, timeout=60).json()["done"]
    embedded = httpx.post(
        f"{three}/v1/embeddings", json={"input": "a cat"}, headers=AUTH, timeout=60
    )
    assert embedded.json()["model"] == "all-minilm:l6-v2"
    assert set(_loaded(three)) == {TINY, "other", "all-minilm:l6-v2"}
    missing = _chat(three, "nope")
    assert missing.status_code == 404
    assert "'ortserve/tiny-llama-random-weights', 'other', 'all-minilm:l6-v2'" in missing.text
    tags = httpx.get(f"{three}/api/tags", headers=AUTH, timeout=30).json()["models"]
    assert [t["name"] for t in tags] == [TINY, "other", "all-minilm:l6-v2"]
    ready = httpx.get(f"{three}/readyz", headers=AUTH, timeout=30).json()
    assert 0 < ready["memory_held_mib"] < ready["memory_budget_mib"]
    pids = [m["engine"]["pid"] for m in ready["models"][:2]]
    assert len(set(pids)) == 2  # each generative model its own engine process
    # `ortserve ps`: each loaded model and when it unloads (ORTSERVE_MODEL_KEEP_ALIVE, 5m).
    port = three.rsplit(":", 1)[1]
    shown = subprocess.run(
        [*ORTSERVE, "ps", "--host", "127.0.0.1", "--port", port],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, **SERVER_ENV},
    ).stdout
    for name in (TINY, "other", "all-minilm:l6-v2"):
        assert re.search(rf"^{re.escape(name)}\s.*\s[45] minutes from now$", shown, re.M), shown


def test_keep_alive_unloads_as_ollama_does(three: str) -> None:
    """A request's keep_alive: 0 unloads the model once its requests end; a duration,
    that long after; a load request with keep_alive 0 unloads it at once."""
    _chat(three, "other")
    assert "other" in _loaded(three)
    body = {"model": "other", "prompt": "Hi", "stream": False, "keep_alive": 0}
    # An API key's keep_alive changes nothing: unloading is for admin keys (or no keys).
    tenant = {"authorization": "Bearer other-key"}
    assert httpx.post(f"{three}/api/generate", json=body, headers=tenant, timeout=60).json()["done"]
    assert "other" in _loaded(three)
    body["options"] = {"num_predict": 2}
    assert httpx.post(f"{three}/api/generate", json=body, headers=AUTH, timeout=60).json()["done"]
    assert "other" not in _loaded(three)
    # Back on its next request; then kept for two seconds only.
    body = {"model": "other", "prompt": "Hi", "stream": False, "keep_alive": "2s"}
    body["options"] = {"num_predict": 2}
    assert httpx.post(f"{three}/api/generate", json=body, headers=AUTH, timeout=60).json()["done"]
    expires = _loaded(three)["other"]
    assert not expires.startswith("2318")  # not "for good": two seconds away
    _until(lambda: "other" not in _loaded(three), "keep_alive 2s did not unload it", 15)
    # Ollama's unload request: no prompt, keep_alive 0.
    _chat(three, "other")
    unload = {"model": "other", "keep_alive": 0}
    answer = httpx.post(f"{three}/api/generate", json=unload, headers=AUTH, timeout=60).json()
    assert answer["done_reason"] == "unload"
    _until(lambda: "other" not in _loaded(three), "the unload request did not unload it", 15)
    assert _chat(three, TINY).status_code == 200  # the others stay


def test_one_models_engine_fault_costs_only_its_requests(three: str) -> None:
    _chat(three, "other")
    ready = httpx.get(f"{three}/readyz", headers=AUTH, timeout=30).json()
    other = next(m for m in ready["models"] if m["model"] == "other")
    os.kill(other["engine"]["pid"], signal.SIGKILL)
    assert _chat(three, TINY).status_code == 200  # the server's model never noticed
    _until(lambda: _chat(three, "other").status_code == 200, "other did not come back", 60)


def test_the_memory_budget_unloads_the_idle_and_refuses_what_cannot_fit(
    tiny_model_dir: Path,
) -> None:
    """A budget for one tiny model at a time: asking for another unloads the idle one;
    while a stream holds one, another gets a 503 that says why."""
    need = _need_mib(tiny_model_dir)
    budget = RUNTIME_MIB + need + need // 2
    env = {"ORTSERVE_MEMORY_BUDGET_MB": str(budget), "ORTSERVE_MAX_NEW_TOKENS": "400"}
    # `third` is never asked for: a model not loaded takes nothing of the budget.
    more = [f"other={tiny_model_dir}", f"third={tiny_model_dir}"]
    with served(tiny_model_dir, more, env) as base:
        assert _chat(base, "other").status_code == 200
        assert set(_loaded(base)) == {"other"}  # the idle server's model made room
        assert _chat(base, TINY).status_code == 200
        assert set(_loaded(base)) == {TINY}
        held = threading.Event()

        def hold() -> None:
            body = {"model": TINY, "messages": CHAT, "max_tokens": 400, "stream": True}
            body["min_tokens"] = 400
            with httpx.stream(
                "POST", f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=120
            ) as stream:
                for _ in stream.iter_lines():
                    held.set()

        streaming = threading.Thread(target=hold)
        streaming.start()
        assert held.wait(60)
        refused = _chat(base, "other")
        streaming.join()
        assert refused.status_code == 503, refused.text
        assert "not enough memory to load 'other'" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"]
        assert _chat(base, "other").status_code == 200  # once the stream ended


def test_a_generative_model_as_more_is_served_too_and_names_are_kept(tiny_model_dir: Path) -> None:
    """`ortserve serve MODEL FOLDER` without a name: the folder's model is listed under
    its manifest's name; ORTSERVE_MODELS gives the same."""
    cmd = [*ORTSERVE, "serve", "--help"]
    helped = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    assert "MORE" in helped.stdout and "ORTSERVE_MODELS" in helped.stdout
    with served(tiny_model_dir, [str(all_minilm())]) as base:
        listed = httpx.get(f"{base}/v1/models", headers=AUTH, timeout=30).json()["data"]
        assert [m["id"] for m in listed] == [TINY, "all-minilm:l6-v2"]


def test_a_reload_switches_each_loaded_model_blue_green(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGHUP (`ortserve reload`): a loaded model whose folder (a `current` symlink) now
    holds another model switches to it, blue/green; the server's model, unchanged, stays."""
    from ortserve.core.manifest import manifest_digest, read_manifest, write_manifest
    from ortserve.edge.switch import set_link

    models = tmp_path / "models"
    for color in ("blue", "green"):
        copy = models / color
        shutil.copytree(tiny_model_dir, copy, copy_function=os.link)
        manifest = read_manifest(copy).model_copy(update={"revision": color})
        (copy / "manifest.json").unlink()  # not through the link into the cache
        write_manifest(copy, manifest)
    set_link(tmp_path / "current", "models/blue")
    port = free_port()
    cmd = [*ORTSERVE, "serve", str(tiny_model_dir), f"other={tmp_path / 'current'}"]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    with serve_process(cmd, {**os.environ, **SERVER_ENV}, port) as server:
        base = server.base
        assert _chat(base, "other").status_code == 200

        def digests() -> list[str]:
            ready = httpx.get(f"{base}/readyz", headers=AUTH, timeout=30).json()
            return [m.get("manifest_digest", "") for m in ready["models"]]

        before = digests()
        assert before[1] == manifest_digest(models / "blue")
        set_link(tmp_path / "current", "models/green")
        server.proc.send_signal(signal.SIGHUP)
        green = manifest_digest(models / "green")
        _until(lambda: digests()[1] == green, "other did not switch to green", 60)
        assert digests()[0] == before[0]  # the server's model stayed
        assert _chat(base, "other").status_code == 200
