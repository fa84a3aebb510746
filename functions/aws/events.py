"""API Gateway and Function URL events to `core.http.Request`, and results back.

Two payload shapes reach the handler: API Gateway REST APIs send payload format 1.0
(`httpMethod`, `path`, `multiValueHeaders`, ...); HTTP APIs and Function URLs send 2.0
(`requestContext.http.method`, `rawPath`, `cookies`, ...). The result must use the
shape of the event it answers. The query string is not read: no route of the core has
query parameters.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ortserve.core.http import Headers, Request, fold

Version = Literal["1.0", "2.0"]


class EventError(Exception):
    """The event is not an HTTP event this handler understands.

    Attributes:
        version: The payload version to answer in (2.0 when unknown).
    """

    def __init__(self, message: str, version: Version = "2.0") -> None:
        super().__init__(message)
        self.message = message
        self.version: Version = version


@dataclass(frozen=True)
class HttpEvent:
    """An HTTP event translated for the core, with the shape its result must take.

    Attributes:
        version: The payload format, which the result must use too.
        request: The request for the core.
        function_url: It came through a Function URL (whose limit is the function's
            timeout), not API Gateway (which cuts an integration at 30 s).
    """

    version: Version
    request: Request
    function_url: bool = False


def _str_map(value: object, what: str, version: Version) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise EventError(f"the event's {what} must map strings to strings", version)
    return dict(value)


def _multi_map(value: object, what: str, version: Version) -> dict[str, list[str]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(i, str) for i in v)
        for k, v in value.items()
    ):
        raise EventError(f"the event's {what} must map strings to lists of strings", version)
    return {k: list(v) for k, v in value.items()}


def _body(event: Mapping[str, Any], version: Version) -> bytes:
    body = event.get("body")
    if body is None:
        return b""
    if not isinstance(body, str):
        raise EventError("the event's body must be a string", version)
    if event.get("isBase64Encoded") is True:
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("the event's body is not valid base64", version) from None
    # A lone surrogate (JSON allows "\ud800") stays invalid UTF-8 for the core to refuse.
    return body.encode("utf-8", "surrogatepass")


def _check_text(value: str, what: str, version: Version) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EventError(f"the event's {what} is not valid Unicode", version) from None


def _v1(event: Mapping[str, Any]) -> Request:
    method, path = event.get("httpMethod"), event.get("path")
    if not isinstance(method, str) or not isinstance(path, str) or not path.startswith("/"):
        raise EventError("a REST API (1.0) event needs httpMethod and path", "1.0")
    _check_text(path, "path", "1.0")
    params = event.get("pathParameters")
    proxy = params.get("proxy") if isinstance(params, Mapping) else None
    if event.get("resource") == "/{proxy+}" and isinstance(proxy, str):
        # `path` carries a custom domain's base path; the greedy parameter does not.
        path = f"/{proxy}"
    multi = _multi_map(event.get("multiValueHeaders"), "multiValueHeaders", "1.0")
    single = _str_map(event.get("headers"), "headers", "1.0")
    # API Gateway sends both maps; the multi-value one has every value of a repeated header.
    pairs = [(k, v) for k, values in multi.items() for v in values] or list(single.items())
    return Request(method.upper(), path, Headers(pairs), _body(event, "1.0"))


def _v2(event: Mapping[str, Any]) -> Request:
    context = event.get("requestContext")
    http = context.get("http") if isinstance(context, Mapping) else None
    method = http.get("method") if isinstance(http, Mapping) else None
    path = event.get("rawPath")
    if not isinstance(method, str) or not isinstance(path, str) or not path.startswith("/"):
        raise EventError("an HTTP API or Function URL (2.0) event needs a method and rawPath")
    _check_text(path, "rawPath", "2.0")
    assert isinstance(context, Mapping)  # http came from it
    stage = context.get("stage")
    # An HTTP API stage other than $default prefixes rawPath with its name.
    if isinstance(stage, str) and stage != "$default" and f"{path}/".startswith(f"/{stage}/"):
        path = path[len(stage) + 1 :] or "/"
    # 2.0 events join a repeated header's values with commas already.
    pairs = list(_str_map(event.get("headers"), "headers", "2.0").items())
    cookies = event.get("cookies")
    if cookies is not None:
        if not isinstance(cookies, list) or not all(isinstance(c, str) for c in cookies):
            raise EventError("the event's cookies must be a list of strings")
        # 2.0 events move the Cookie header into `cookies`: put it back for the core.
        pairs += [("cookie", cookie) for cookie in cookies]
    return Request(method.upper(), path, Headers(pairs), _body(event, "2.0"))


def _is_function_url(event: Mapping[str, Any]) -> bool:
    """A Function URL's event names its `<url-id>.lambda-url.<region>.on.aws` domain."""
    context = event.get("requestContext")
    domain = context.get("domainName") if isinstance(context, Mapping) else None
    return isinstance(domain, str) and ".lambda-url." in domain


def parse_event(event: object) -> HttpEvent:
    """Translate an API Gateway (1.0 or 2.0) or Function URL event.

    Raises:
        EventError: The event is malformed or not an HTTP event.
    """
    if not isinstance(event, Mapping):
        raise EventError("the event is not a JSON object")
    version = event.get("version")
    if version == "2.0":
        return HttpEvent("2.0", _v2(event), _is_function_url(event))
    if version == "1.0" or (version is None and "httpMethod" in event):
        return HttpEvent("1.0", _v1(event))
    raise EventError(
        "not an API Gateway or Function URL event: invoke this function through its "
        "HTTP API or Function URL"
    )


def http_result(
    version: Version, status: int, headers: list[tuple[str, str]], body: bytes
) -> dict[str, Any]:
    """The handler's return value for one response, in the shape of `version`.

    A UTF-8 body (JSON, SSE) is sent as text; anything else as base64.
    """
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, encoded = base64.b64encode(body).decode("ascii"), True
    grouped: dict[str, list[str]] = {}
    cookies: list[str] = []
    for name, value in headers:
        if version == "2.0" and name.lower() == "set-cookie":
            cookies.append(value)  # 2.0 results carry cookies apart from the headers
        else:
            grouped.setdefault(name, []).append(value)
    result: dict[str, Any] = {"statusCode": status}
    if version == "2.0":
        result["headers"] = {k: fold(k, v) for k, v in grouped.items()}
        if cookies:
            result["cookies"] = cookies
    else:
        result["headers"] = {k: v[-1] for k, v in grouped.items()}
        result["multiValueHeaders"] = grouped
    result["body"] = text
    result["isBase64Encoded"] = encoded
    return result


def encoded_size(result: Mapping[str, Any]) -> int:
    """Bytes of `result` as the runtime sends it, at most (ASCII-escaped JSON is the larger)."""
    return len(json.dumps(result))
