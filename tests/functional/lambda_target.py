"""The buffered Lambda handler as a parity-harness target.

`LambdaTarget` implements tests/functional/harness.py's `Target` by building the event
that an HTTP API (payload 2.0), a Function URL (2.0) or a REST API (1.0) would send
(benchmarks/support/lambda_events.py), calling the handler in process, and decoding its
result the way API Gateway would.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from benchmarks.support.lambda_events import v1_event, v2_event
from ortserve.functions.aws.runtime import LambdaApp
from ortserve.functions.aws.settings import LambdaSettings
from tests.functional.harness import API_KEY, Reply, encode_body, request_headers

Shape = Literal["http-api", "function-url", "rest"]
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass
class FakeContext:
    """The fields of Lambda's context object the handler may read."""

    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_name: str = "ortserve"
    memory_limit_in_mb: str = "3008"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:ortserve"

    def get_remaining_time_in_millis(self) -> int:
        """As if the invoke had just started under a 60 s timeout."""
        return 60_000


def decode_result(result: dict[str, Any]) -> Reply:
    """What an HTTP client sees for a handler result (either payload version)."""
    headers = {k.lower(): v for k, v in (result.get("headers") or {}).items()}
    for name, values in (result.get("multiValueHeaders") or {}).items():
        headers[name.lower()] = ", ".join(values)
    if result.get("cookies"):
        headers["set-cookie"] = ", ".join(result["cookies"])
    raw = result.get("body") or ""
    body = base64.b64decode(raw) if result.get("isBase64Encoded") else raw.encode()
    return Reply(int(result["statusCode"]), headers, body, [body])


class LambdaTarget:
    """The buffered handler, called in process with API Gateway / Function URL events."""

    def __init__(self, handler: Handler, shape: Shape = "http-api", base64_body: bool = False):
        self.handler = handler
        self.shape = shape
        self.base64_body = base64_body
        self.name = f"lambda-{shape}"

    def event(self, method: str, path: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
        """The event this target's trigger would send for one request."""
        if self.shape == "rest":
            return v1_event(method, path, headers, body, base64_body=self.base64_body)
        return v2_event(
            method,
            path,
            headers,
            body,
            function_url=self.shape == "function-url",
            base64_body=self.base64_body,
        )

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        """One request through the handler; an empty header value means "no such header"."""
        event = self.event(method, path, request_headers(headers), encode_body(body, raw))
        result = self.handler(json.loads(json.dumps(event)), FakeContext())
        # What the runtime would send must be JSON: serialize it as the runtime does.
        return decode_result(json.loads(json.dumps(result)))

    def open_stream(self, path: str, body: Any) -> AbstractContextManager[Iterator[bytes]]:
        """Not possible: a buffered handler answers only once the whole body exists."""
        raise NotImplementedError(
            "the buffered Lambda handler returns the whole SSE body in one response; "
            "incremental streaming is the Function URL RESPONSE_STREAM image (Dockerfile.stream)"
        )


def lambda_app(model_dir: Path, **overrides: Any) -> LambdaApp:
    """A LambdaApp with the harness's server settings (keys, limits), cold-started."""
    values: dict[str, Any] = {
        "model_dir": model_dir,
        "providers": "cpu",
        "api_keys": [API_KEY, "other-key"],
        "max_body_bytes": 64 * 1024,
        "max_new_tokens": 2000,
        **overrides,
    }
    app = LambdaApp(LambdaSettings(**values))
    app.cold_start()
    return app


def make_lambda_bundle(model_dir: Path, dest: Path, target: str = "lambda-x86_64") -> Path:
    """A Lambda bake output (the images' Docker context) around a copy of `model_dir`.

    `package_lambda` runs here directly, so this works whether or not the bake calls it.
    """
    import shutil

    from ortserve.bake.package_lambda import package_lambda
    from ortserve.bake.targets import get_target

    shutil.copytree(model_dir, dest / "model")
    package_lambda(get_target(target), dest)
    return dest
