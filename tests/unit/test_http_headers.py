"""`core.http.Headers`: case-insensitive, multi-valued, one folding rule on every target."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Request as FlaskRequest
from werkzeug.test import EnvironBuilder

from ortserve.core.http import Headers, Request, fold
from ortserve.edge.asgi import _request as asgi_request
from ortserve.functions.aws.events import parse_event
from ortserve.functions.gcp.translate import core_request as gcf_request

RAW = [
    ("X-Forwarded-For", "203.0.113.10"),
    ("x-forwarded-for", "198.51.100.7"),
    ("Cookie", "a=1"),
    ("cookie", "b=2"),
    ("X-Api-Key", "k"),
]
FOLDED = {"x-forwarded-for": "203.0.113.10, 198.51.100.7", "cookie": "a=1; b=2", "x-api-key": "k"}


def test_lookups_ignore_case_and_fold_repeated_values() -> None:
    headers = Headers(RAW)
    assert headers["X-FORWARDED-FOR"] == headers.get("x-forwarded-for") == FOLDED["x-forwarded-for"]
    assert headers["cookie"] == "a=1; b=2"  # RFC 6265: cookies with "; "
    assert headers.get_all("Cookie") == ["a=1", "b=2"]
    assert headers.get("x-request-id", "") == "" and headers.get_all("nope") == []
    assert "X-API-KEY" in headers and "x-api" not in headers
    assert list(headers) == ["x-forwarded-for", "cookie", "x-api-key"]  # first seen, lower
    assert len(headers) == 3 and headers == FOLDED and dict(headers) == FOLDED
    assert list(headers.pairs()) == [(k.lower(), v) for k, v in RAW]
    with pytest.raises(KeyError):
        headers["absent"]


def test_a_mapping_is_one_value_per_name() -> None:
    assert Headers({"Content-Type": "application/json"}) == {"content-type": "application/json"}
    assert Headers() == {} and Request("GET", "/").headers == {}


def test_one_folding_rule() -> None:
    assert fold("Vary", ["a", "b"]) == "a, b"
    assert fold("COOKIE", ["a=1", "b=2"]) == "a=1; b=2"


# -- parity: each adapter folds a repeated header the same way -------------------------
# Where the platform hands over the values apart (ASGI, REST API events, the cookies of
# HTTP API and Function URL events) the adapter folds them by `fold`. Where the platform
# has joined them already (other headers of 2.0 events; WSGI, for Cloud Functions) the
# adapter can only keep its join.


def _edge() -> Request:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in RAW]
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/readyz",
        "query_string": b"x=1",
        "headers": raw,
    }
    return asgi_request(scope, "GET", b"")


def _lambda_rest() -> Request:
    multi: dict[str, list[str]] = {}
    for name, value in RAW:
        multi.setdefault(name, []).append(value)
    event: dict[str, Any] = {
        "httpMethod": "GET",
        "path": "/readyz",
        "headers": {k: v[-1] for k, v in multi.items()},
        "multiValueHeaders": multi,
    }
    return parse_event(event).request


def _lambda_http() -> Request:
    event = {
        "version": "2.0",
        "rawPath": "/readyz",
        "rawQueryString": "x=1",
        "requestContext": {"http": {"method": "GET"}},
        "headers": {
            "x-forwarded-for": FOLDED["x-forwarded-for"],
            "X-Api-Key": "k",
            "cookie": "a=1",
        },
        "cookies": ["b=2"],
    }
    return parse_event(event).request


def _cloud_functions() -> Request:
    environ = EnvironBuilder(path="/readyz", query_string="x=1", headers=RAW).get_environ()
    environ["HTTP_X_FORWARDED_FOR"] = FOLDED["x-forwarded-for"]  # joined by the server
    environ["HTTP_COOKIE"] = FOLDED["cookie"]
    return gcf_request(FlaskRequest(environ), 1024)


@pytest.mark.parametrize("make", [_edge, _lambda_rest, _lambda_http, _cloud_functions])
def test_every_adapter_gives_the_core_the_same_headers(make: Any) -> None:
    request = make()
    assert (request.method, request.path, request.body) == ("GET", "/readyz", b"")
    assert isinstance(request.headers, Headers)
    assert {k: request.headers[k] for k in FOLDED} == FOLDED
