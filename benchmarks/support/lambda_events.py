"""The events API Gateway sends a Lambda function: an HTTP API or a Function URL (payload
2.0) and a REST API's `/{proxy+}` resource (payload 1.0), built from one HTTP request."""

from __future__ import annotations

import base64
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlsplit

_TIME = {"time": "12/Mar/2026:19:03:58 +0000", "timeEpoch": 1773342238000}


def _body_fields(body: bytes, base64_body: bool) -> dict[str, Any]:
    if not body:
        return {"isBase64Encoded": False}
    try:
        text = None if base64_body else body.decode()
    except UnicodeDecodeError:  # API Gateway sends a body that is not UTF-8 as base64
        text = None
    if text is None:
        return {"body": base64.b64encode(body).decode(), "isBase64Encoded": True}
    return {"body": text, "isBase64Encoded": False}


def v2_event(
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes = b"",
    *,
    function_url: bool = False,
    base64_body: bool = False,
    stage: str = "$default",
) -> dict[str, Any]:
    """A payload-2.0 event as an HTTP API (catch-all route) or a Function URL sends it.

    Both lower-case header names and move any Cookie header into `cookies`.
    """
    url = urlsplit(target)
    lower = {k.lower(): v for k, v in headers.items()}
    cookie = lower.pop("cookie", None)
    raw_path = url.path if stage == "$default" else f"/{stage}{url.path}"
    query = dict(parse_qsl(url.query, keep_blank_values=True))
    domain = (
        "abcdefghijklmnopqrstuvwxyz012345.lambda-url.us-east-1.on.aws"
        if function_url
        else "a1b2c3d4e5.execute-api.us-east-1.amazonaws.com"
    )
    route = "$default" if function_url else "ANY /{proxy+}"
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route,
        "rawPath": raw_path,
        "rawQueryString": url.query,
        "headers": {**lower, "host": domain, "x-forwarded-proto": "https"},
        "requestContext": {
            "accountId": "anonymous" if function_url else "123456789012",
            "apiId": domain.partition(".")[0],
            "domainName": domain,
            "domainPrefix": domain.partition(".")[0],
            "http": {
                "method": method,
                "path": raw_path,
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.10",
                "userAgent": lower.get("user-agent", "test"),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": route,
            "stage": stage,
            **_TIME,
        },
        **_body_fields(body, base64_body),
    }
    if cookie:
        event["cookies"] = [c.strip() for c in cookie.split(";")]
    if query:
        event["queryStringParameters"] = query
    if not function_url and url.path != "/":
        event["pathParameters"] = {"proxy": url.path.lstrip("/")}
    return event


def v1_event(
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes = b"",
    *,
    base64_body: bool = False,
    stage: str = "prod",
) -> dict[str, Any]:
    """A payload-1.0 event as a REST API's `/{proxy+}` resource sends it (names as sent)."""
    url = urlsplit(target)
    pairs = parse_qsl(url.query, keep_blank_values=True)
    multi_query: dict[str, list[str]] = {}
    for key, value in pairs:
        multi_query.setdefault(key, []).append(value)
    all_headers = {**headers, "Host": "a1b2c3d4e5.execute-api.us-east-1.amazonaws.com"}
    return {
        "resource": "/{proxy+}",
        "path": url.path,
        "httpMethod": method,
        "headers": all_headers,
        "multiValueHeaders": {k: [v] for k, v in all_headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": {"proxy": url.path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "path": f"/{stage}{url.path}",
            "stage": stage,
            "accountId": "123456789012",
            "apiId": "a1b2c3d4e5",
            "requestId": str(uuid.uuid4()),
            "protocol": "HTTP/1.1",
            "identity": {"sourceIp": "203.0.113.10"},
            "requestTime": _TIME["time"],
            "requestTimeEpoch": _TIME["timeEpoch"],
        },
        **_body_fields(body, base64_body),
    }
