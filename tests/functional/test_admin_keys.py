"""Who may see and change what a server holds (#49 item 8b-e): a probe without a key says
its status only, and never a path or a pid; loading and unloading adapters needs an admin
key (ORTSERVE_ADMIN_KEYS) where the server has keys; a refused `lora_path` is not
repeated; an adapter in use answers 409 as a client's error. In process and through the
real edge daemon."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests import models
from tests.functional.harness import AUTH, InProcess, edge_server
from tests.lora_kit import LESSON_PROMPT

ADMIN_KEY = "test-admin-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
NO_KEY = {"authorization": ""}  # the harness's "no such header"
API_KEYS = {"api_keys": ["test-key-1"], "admin_keys": [ADMIN_KEY]}
ELSEWHERE = "/etc/passwd"


@pytest.fixture(scope="module")
def tiny_lora(tiny_hf_dir: Path) -> Path:
    """The tiny Llama at fp32 with the `lesson` adapter baked beside it (as test_lora's)."""
    adapter = models.trained_adapter(tiny_hf_dir, "tiny")
    extra = ("--adapter", f"lesson={adapter}")
    return models.baked(str(tiny_hf_dir), precision="fp32", package=False, extra=extra) / "model"


def _core(model_dir: Path, **settings: Any) -> InProcess:
    server = ServerSettings.model_validate({"model_dir": model_dir, "providers": "cpu", **settings})
    state = ModelState(server)
    state.load()
    return InProcess(Api(state, server))


# -- probes ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/readyz", "/healthz"])
def test_without_a_key_a_probe_says_its_status_only(tmp_path: Path, path: str) -> None:
    client = _core(tmp_path / "nowhere", **API_KEYS)
    alive = {"alive": True} if path == "/healthz" else {}
    assert client.call("GET", path, headers=NO_KEY).json() == {"status": "failed", **alive}
    wrong = client.call("GET", path, headers={"authorization": "Bearer nope"})
    assert wrong.json() == {"status": "failed", **alive}
    for key in (AUTH, ADMIN):  # a key (API or admin) sees why, the path included
        reason = client.call("GET", path, headers=key).json()["reason"]
        assert str(tmp_path / "nowhere") in reason and "does not exist" in reason


def test_without_any_key_configured_a_probe_says_why_but_no_path(tmp_path: Path) -> None:
    client = _core(tmp_path / "nowhere")
    ready = client.call("GET", "/readyz", headers=NO_KEY)
    assert ready.status == 503 and ready.json()["status"] == "failed"
    assert ready.json()["reason"] == "model folder …/nowhere does not exist"
    assert str(tmp_path) not in ready.body.decode()


def test_a_loaded_model_s_probe_by_who_asks(tiny_lora: Path) -> None:
    keyed = _core(tiny_lora, **API_KEYS)
    assert keyed.call("GET", "/readyz", headers=NO_KEY).json() == {"status": "ready"}
    full = keyed.call("GET", "/readyz").json()
    assert full["adapters"]["lesson"]["source"]  # where it was baked from
    assert full["manifest_digest"] and full["execution_provider"] == "cpu"
    # No key configured: what is loaded, not from where.
    open_ = _core(tiny_lora).call("GET", "/readyz", headers=NO_KEY).json()
    assert open_["status"] == "ready" and open_["model"] == full["model"]
    assert open_["manifest_digest"] == full["manifest_digest"]
    assert open_["execution_provider"] == "cpu" and "lesson" in open_["adapters"]
    assert "source" not in open_["adapters"]["lesson"]
    assert str(tiny_lora.parent.parent) not in json.dumps(open_)


def test_through_the_daemon_no_key_no_pid_no_path(tiny_lora: Path) -> None:
    """The daemon runs its engine in a process of its own: a key sees its pid."""
    env = {"ORTSERVE_ADMIN_KEYS": ADMIN_KEY}
    with edge_server(tiny_lora, env) as url, httpx.Client(base_url=url, timeout=600) as http:
        for path in ("/readyz", "/healthz"):
            bare = http.get(path).json()
            assert bare in ({"status": "ready"}, {"status": "ready", "alive": True}), bare
        full = http.get("/readyz", headers=AUTH).json()
        assert isinstance(full["engine"]["pid"], int) and full["adapters"]["lesson"]["source"]
    with (
        edge_server(tiny_lora, {"ORTSERVE_API_KEYS": ""}) as url,
        httpx.Client(base_url=url, timeout=600) as http,
    ):
        open_ = http.get("/healthz").json()
        assert open_["manifest_digest"] == full["manifest_digest"]
        assert open_["engine"]["process"] == "separate" and "pid" not in open_["engine"]
        assert "source" not in open_["adapters"]["lesson"]
        assert str(tiny_lora.parent.parent) not in json.dumps(open_)


# -- adapters: admin only, no path repeated, 409 -----------------------------------------


@pytest.mark.parametrize("route", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"])
def test_an_api_key_may_not_load_or_unload_an_adapter(tmp_path: Path, route: str) -> None:
    client = _core(tmp_path / "nowhere", **API_KEYS)
    refused = client.call("POST", route, {"lora_name": "lesson"}, headers=AUTH)
    assert refused.status == 403
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "permission_denied")
    assert "ORTSERVE_ADMIN_KEYS" in error["message"]
    # An admin key passes the rule (here to find no model loaded).
    assert client.call("POST", route, {"lora_name": "lesson"}, headers=ADMIN).status == 503
    # API keys without any admin key: nobody may.
    api_only = _core(tmp_path / "nowhere", api_keys=["test-key-1"])
    assert api_only.call("POST", route, {"lora_name": "lesson"}).status == 403
    # No key at all (one user, on loopback): anybody may.
    assert _core(tmp_path / "nowhere").call("POST", route, {"lora_name": "lesson"}).status == 503


def _lora_rules(call: Any, source: str) -> None:
    """The admin rule, `lora_path` and the 409, through `call(path, body, headers)`."""
    body = {"lora_name": "lesson"}
    refused = call("/v1/load_lora_adapter", body, AUTH)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["type"] == "permission_error"
    loaded = call("/v1/load_lora_adapter", body, ADMIN)
    assert loaded.status_code == 200 and loaded.json()["loaded_adapters"] == ["lesson"]
    elsewhere = call("/v1/load_lora_adapter", {**body, "lora_path": ELSEWHERE}, ADMIN)
    assert elsewhere.status_code == 400
    error = elsewhere.json()["error"]
    assert error["param"] == "lora_path" and "'lesson'" in error["message"]
    assert ELSEWHERE not in elsewhere.text and source not in elsewhere.text
    same = call("/v1/load_lora_adapter", {**body, "lora_path": source}, ADMIN)
    assert same.status_code == 200
    unloaded = call("/v1/unload_lora_adapter", body, ADMIN)
    assert unloaded.status_code == 200 and unloaded.json()["loaded_adapters"] == []


def test_in_process_the_adapter_routes_rules(tiny_lora: Path) -> None:
    client = _core(tiny_lora, **API_KEYS)
    source = client.call("GET", "/readyz").json()["adapters"]["lesson"]["source"]

    def call(path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
        reply = client.call("POST", path, body, headers=headers)
        return httpx.Response(reply.status, content=reply.body)

    _lora_rules(call, source)


def test_through_the_daemon_the_adapter_routes_rules(tiny_lora: Path) -> None:
    env = {"ORTSERVE_ADMIN_KEYS": ADMIN_KEY}
    with edge_server(tiny_lora, env) as url, httpx.Client(base_url=url, timeout=600) as http:
        source = http.get("/readyz", headers=AUTH).json()["adapters"]["lesson"]["source"]
        _lora_rules(lambda path, body, headers: http.post(path, json=body, headers=headers), source)


@pytest.fixture
def streaming_lesson(tiny_lora: Path) -> Iterator[InProcess]:
    yield _core(tiny_lora, prompt_cache_slots=0, max_new_tokens=4000, **API_KEYS)


def test_unloading_an_adapter_in_use_is_a_409_client_error(streaming_lesson: InProcess) -> None:
    client = streaming_lesson
    model = client.call("GET", "/v1/models").json()["data"][0]["id"]
    body = {
        "model": f"{model}:lesson",
        "prompt": f"Q: {LESSON_PROMPT}\nA:",
        "max_tokens": 4000,
        "stream": True,
    }
    with client.open_stream("/v1/completions", body) as stream:
        next(stream)  # the generation with the adapter is under way
        busy = client.call("POST", "/v1/unload_lora_adapter", {"lora_name": "lesson"}, ADMIN)
    assert busy.status == 409, busy.body
    error = busy.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "conflict")
