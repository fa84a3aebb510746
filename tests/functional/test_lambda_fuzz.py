"""Hostile events to the Lambda handler (hypothesis): never an exception, always an
answer in the event's shape, a 400 in the OpenAI error shape for what is not an HTTP event."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortserve.functions.aws.events import EventError, parse_event
from ortserve.functions.aws.runtime import LambdaApp
from tests.functional.harness import API_KEY
from tests.functional.lambda_target import lambda_app

text = st.text(max_size=30)
headers = st.dictionaries(st.text(min_size=1, max_size=20), text, max_size=6)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
paths = st.sampled_from(
    ["/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/readyz", "/x", ""]
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str | None, bool]:
    raw = draw(st.one_of(st.none(), text, json_values.map(json.dumps), st.binary(max_size=40)))
    if isinstance(raw, bytes):
        return base64.b64encode(raw).decode(), True
    if raw is not None and draw(st.booleans()):
        return base64.b64encode(raw.encode()).decode(), True
    return raw, draw(st.booleans()) if raw is None else False


@st.composite
def v2_events(draw: st.DrawFn) -> dict[str, Any]:
    body, b64 = draw(bodies())
    event: dict[str, Any] = {
        "version": "2.0",
        "rawPath": draw(paths),
        "rawQueryString": draw(text),
        "headers": {"authorization": f"Bearer {API_KEY}", **draw(headers)},
        "requestContext": {"http": {"method": draw(st.sampled_from(["GET", "POST", "PUT"]))}},
        "isBase64Encoded": b64,
    }
    if body is not None:
        event["body"] = body
    if draw(st.booleans()):
        event["cookies"] = draw(st.lists(text, max_size=3))
    for key in draw(st.lists(st.sampled_from(list(event)), max_size=2)):
        event[key] = draw(json_values)  # a field of the wrong type, or missing
    return event


@st.composite
def v1_events(draw: st.DrawFn) -> dict[str, Any]:
    body, b64 = draw(bodies())
    return {
        "httpMethod": draw(st.sampled_from(["GET", "POST", "DELETE"])),
        "path": draw(paths),
        "headers": draw(st.one_of(st.none(), headers)),
        "multiValueHeaders": draw(
            st.one_of(st.none(), st.dictionaries(text, st.lists(text, max_size=3), max_size=3))
        ),
        "queryStringParameters": draw(st.one_of(st.none(), st.dictionaries(text, text))),
        "body": body,
        "isBase64Encoded": b64,
        "requestContext": {},
    }


@pytest.fixture(scope="module")
def app(tiny_model_dir: Path) -> LambdaApp:
    return lambda_app(tiny_model_dir, max_new_tokens=4)


def _check(result: dict[str, Any]) -> None:
    assert isinstance(result["statusCode"], int)
    assert result["statusCode"] < 500, result
    body = result.get("body") or ""
    raw = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode()
    if result["statusCode"] >= 400:
        error = json.loads(raw)["error"]
        assert {"message", "type", "code"} <= set(error)
        assert "Traceback" not in error["message"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=st.one_of(v2_events(), v1_events(), json_values))
def test_any_event_gets_an_answer_never_an_exception(app: LambdaApp, event: Any) -> None:
    # EventError is the one exception the parser may raise; the handler answers it with 400.
    with contextlib.suppress(EventError):
        parse_event(event)
    _check(app.handle(event))
