"""The chat playground's routes and files: the page (core/playground.html), its content
security policy, and the vendored Markdown and sanitising libraries it loads (core/vendor/)."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ortserve.core.http import Request, Response

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context

_HERE = Path(__file__).parent
#: Route → file in core/vendor/ (the npm packages' own builds; see docs/api.md, "The
#: vendored libraries").
ASSETS = {
    "/vendor/marked.umd.js": "marked.umd.js",
    "/vendor/purify.min.js": "purify.min.js",
}
#: The playground's routes: the page and its scripts (public: they hold no data).
ROUTES = frozenset({"/", *ASSETS})


def page(api: Api, request: Request, ctx: Context) -> Response:
    """GET /: the playground's page."""
    body, policy = _page()
    return Response(
        200,
        [
            ("content-type", "text/html; charset=utf-8"),
            ("content-security-policy", policy),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
            ("cache-control", "no-cache"),
        ],
        body,
    )


def asset(api: Api, request: Request, ctx: Context) -> Response:
    """GET /vendor/…: a vendored script, or 304 when the browser's copy is this one."""
    body, etag = _asset(request.path)
    headers = [
        ("content-type", "text/javascript; charset=utf-8"),
        ("etag", etag),
        ("x-content-type-options", "nosniff"),
        ("cache-control", "no-cache"),  # revalidated: the ETag makes that a 304
    ]
    if not_modified(request.headers.get("if-none-match", ""), etag):
        return Response(304, headers, b"")  # the browser's copy is this one
    return Response(200, headers, body)


@functools.cache
def _page() -> tuple[bytes, str]:
    """The page (read once) and its content security policy: its own inline script and
    style by hash, the vendored scripts from this origin, and calls to this origin only.

    Returns:
        The page's bytes and the `Content-Security-Policy` value to send with them.
    """
    text = (_HERE / "playground.html").read_text(encoding="utf-8")

    def digest(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
        hashes = (base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in blocks)
        return " ".join(f"'sha256-{h}'" for h in hashes) or "'none'"

    # 'self' for scripts admits the vendored files; nothing else this origin serves is a
    # script (JSON and SSE, sent with nosniff).
    policy = (
        f"default-src 'none'; script-src 'self' {digest('script')}; "
        f"style-src {digest('style')}; connect-src 'self'; img-src data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    )
    return text.encode(), policy


@functools.cache
def _asset(route: str) -> tuple[bytes, str]:
    """A vendored script (read once) and its strong ETag.

    Args:
        route: One of `ASSETS`' routes.

    Returns:
        The file's bytes and its ETag (a quoted digest of them).
    """
    body = (_HERE / "vendor" / ASSETS[route]).read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def not_modified(if_none_match: str, etag: str) -> bool:
    """Whether a request's `If-None-Match` (RFC 9110 §13.1.2: weak comparison) holds `etag`."""
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags
