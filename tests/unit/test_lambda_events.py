"""API Gateway / Function URL events to core requests and results back (no model)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from ortserve.core.http import Response, sse_response
from ortserve.functions.aws.buffer import buffered_result
from ortserve.functions.aws.events import EventError, encoded_size, http_result, parse_event

EVENTS = Path(__file__).resolve().parents[1] / "events"


def _event(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    return data


def test_http_api_event() -> None:
    parsed = parse_event(_event("http-api-generate.json"))
    assert parsed.version == "2.0"
    request = parsed.request
    assert (request.method, request.path) == ("POST", "/generate")
    assert request.headers["authorization"] == "Bearer test-key-1"
    assert json.loads(request.body)["prompt"] == "Hello there"


def test_base64_body_cookies_and_named_stage() -> None:
    parsed = parse_event(_event("http-api-base64-cookies-stage.json"))
    request = parsed.request
    assert request.path == "/v1/completions"  # the stage prefix of rawPath removed
    assert request.headers["cookie"] == "session=abc123; theme=dark"
    assert json.loads(request.body)["prompt"] == "Héllo"


def test_function_url_event() -> None:
    parsed = parse_event(_event("function-url-chat-stream.json"))
    assert parsed.version == "2.0"
    assert parsed.request.path == "/v1/chat/completions"
    assert parsed.request.headers["x-api-key"] == "test-key-1"


def test_rest_event_with_multi_value_headers() -> None:
    parsed = parse_event(_event("rest-completions-multivalue.json"))
    assert parsed.version == "1.0"
    request = parsed.request
    assert (request.method, request.path) == ("POST", "/v1/completions")
    assert request.headers["x-api-key"] == "test-key-1"  # names lower-cased
    assert request.headers["accept"] == "application/json, text/plain"
    assert request.headers["x-forwarded-for"] == "203.0.113.10, 198.51.100.7"


def test_rest_event_path_from_the_proxy_parameter() -> None:
    event = _event("rest-readyz.json")
    event["path"] = "/api/readyz"  # a custom domain's base path mapping
    assert parse_event(event).request.path == "/readyz"
    assert parse_event(event).request.body == b""


@pytest.mark.parametrize(
    ("event", "version", "words"),
    [
        ("not a dict", "2.0", "not a JSON object"),
        ({"Records": []}, "2.0", "not an API Gateway"),
        ({"version": "2.0", "rawPath": "/x"}, "2.0", "method"),
        (
            {
                "version": "2.0",
                "rawPath": "/x",
                "requestContext": {"http": {"method": "GET"}},
                "headers": {"a": 1},
            },
            "2.0",
            "headers",
        ),
        (
            {
                "version": "2.0",
                "rawPath": "/x",
                "requestContext": {"http": {"method": "POST"}},
                "body": "***",
                "isBase64Encoded": True,
            },
            "2.0",
            "base64",
        ),
        (
            {
                "version": "2.0",
                "rawPath": "/x",
                "requestContext": {"http": {"method": "GET"}},
                "cookies": "a=1",
            },
            "2.0",
            "cookies",
        ),
        ({"httpMethod": "GET"}, "1.0", "path"),
        ({"httpMethod": "GET", "path": "/x", "multiValueHeaders": {"a": "b"}}, "1.0", "lists"),
    ],
)
def test_malformed_events(event: object, version: str, words: str) -> None:
    with pytest.raises(EventError) as info:
        parse_event(event)
    assert info.value.version == version
    assert words in info.value.message


def test_v2_result_shape_and_cookies() -> None:
    headers = [
        ("content-type", "application/json"),
        ("set-cookie", "a=1"),
        ("set-cookie", "b=2"),
        ("vary", "x"),
        ("vary", "y"),
    ]
    result = http_result("2.0", 200, headers, b'{"ok":true}')
    assert result == {
        "statusCode": 200,
        "headers": {"content-type": "application/json", "vary": "x, y"},
        "cookies": ["a=1", "b=2"],
        "body": '{"ok":true}',
        "isBase64Encoded": False,
    }


def test_v1_result_shape_keeps_every_value() -> None:
    result = http_result("1.0", 201, [("vary", "x"), ("vary", "y")], b"")
    assert result["headers"] == {"vary": "y"}
    assert result["multiValueHeaders"] == {"vary": ["x", "y"]}
    assert "cookies" not in result


def test_binary_body_is_base64() -> None:
    result = http_result("2.0", 200, [], b"\xff\x00\xfe")
    assert result["isBase64Encoded"] is True
    assert base64.b64decode(result["body"]) == b"\xff\x00\xfe"


def _stream(chunks: list[bytes], closed: list[bool]) -> Response:
    def body() -> Any:
        try:
            yield from chunks
        finally:
            closed.append(True)

    return sse_response(body())


def test_a_stream_is_collected_whole() -> None:
    closed: list[bool] = []
    chunks = [b'data: {"text":"a"}\n\n', b"data: [DONE]\n\n"]
    result = buffered_result(_stream(chunks, closed), "2.0", 6_000_000)
    assert result["body"] == "".join(c.decode() for c in chunks)
    assert result["headers"]["content-type"].startswith("text/event-stream")
    assert closed == [True]


def test_a_stream_past_the_limit_is_cut_with_an_error_event() -> None:
    closed: list[bool] = []
    chunk = b'data: {"text":"' + b"\xc3\xa9" * 50 + b'"}\n\n'  # escapes make it grow in JSON
    limit = 4096
    result = buffered_result(_stream([chunk] * 1000, closed), "2.0", limit)
    assert encoded_size(result) <= limit
    assert closed == [True]  # the generation behind it is stopped
    events = result["body"].split("\n\n")[:-1]
    assert events[0].encode() + b"\n\n" == chunk
    last = json.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == "response_too_large"
    assert "streaming Function URL" in last["error"]["message"]


def test_a_whole_body_past_the_limit_is_a_413() -> None:
    response = Response(
        200,
        [("content-type", "application/json"), ("x-request-id", "r1")],
        json.dumps({"text": "x" * 10_000}).encode(),
    )
    result = buffered_result(response, "1.0", 4096)
    assert result["statusCode"] == 413
    assert result["headers"]["x-request-id"] == "r1"
    assert json.loads(result["body"])["error"]["code"] == "response_too_large"


def test_on_ollamas_routes_a_cut_stream_and_a_413_speak_ollamas_shape() -> None:
    """The request's route decides the error's shape (core.routes.ollama_shaped), as on
    every target: Ollama's `{"error": "..."}`, and an NDJSON line to end a cut stream."""
    closed: list[bool] = []
    line = b'{"response":"' + b"x" * 100 + b'","done":false}\n'
    result = buffered_result(_stream([line] * 100, closed), "2.0", 4096, shape="ollama")
    assert encoded_size(result) <= 4096 and closed == [True]
    last = json.loads(result["body"].splitlines()[-1])
    assert set(last) == {"error"} and "streaming Function URL" in last["error"]
    whole = Response(200, [("content-type", "application/json")], b'{"x":"' + b"y" * 9000 + b'"}')
    too_large = buffered_result(whole, "2.0", 4096, shape="ollama")
    assert too_large["statusCode"] == 413
    assert isinstance(json.loads(too_large["body"])["error"], str)
