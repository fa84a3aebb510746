"""The HTTP API, framework-free: routing, auth, limits, validation, OpenAI formats, SSE.

Every adapter (edge daemon, Lambda, Cloud Functions) calls `Api.handle` and writes the
`Response` back, so the same request gives the same bytes on every target.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from core.errors import (
    AuthenticationError,
    ClientClosedError,
    DrainingError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelNotFoundError,
    NotFoundError,
    OrtServeError,
    PayloadTooLargeError,
    RequestTimeoutError,
)
from core.generation import Completion, GenerationRequest, GenerationStream, Guidance
from core.generation import SamplingOptions as Sampling
from core.http import (
    SSE_DONE,
    Request,
    Response,
    error_payload,
    error_response,
    json_response,
    sse_event,
    sse_response,
)
from core.records import RequestRecord
from core.schemas import ChatBody, CompletionBody, GenerateBody, ResponseFormat
from core.settings import ServerSettings
from core.state import ModelState

if TYPE_CHECKING:  # annotations only: adapters import this module without onnxruntime-genai
    from core.engine import Engine

log = logging.getLogger("ortserve")

ROUTES = frozenset(
    {"/", "/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz",
     "/readyz", "/openapi.json"}
)  # fmt: skip
# With API keys set, every other route needs one (/metrics too, unless METRICS_PUBLIC).
# "/" is the chat playground: the page holds no data; its API calls carry the user's key.
PUBLIC_ROUTES = frozenset({"/", "/healthz", "/readyz"})
METRICS_ROUTE = "/metrics"  # the edge daemon's, when it passes a scrape
_MODEL_PREFIX = "/v1/models/"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass
class _Context:
    """Per-request state shared by the route and the record at the end."""

    request_id: str
    completion: Completion | None = None


_Body = TypeVar("_Body", bound=BaseModel)


def _parse(model: type[_Body], body: bytes) -> _Body:
    try:
        data = json.loads(body)
    except RecursionError:  # the parser recurses once per nesting level
        raise InvalidRequestError("the request body's JSON is nested too deeply") from None
    except ValueError as exc:  # invalid JSON or UTF-8, or an int past Python's 4,300 digits
        detail = "" if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError) else f": {exc}"
        raise InvalidRequestError(f"the request body is not valid JSON{detail}") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0]
        # A union reports one error per member, each under the member's tag
        # (`messages.0.content.str`): name the field they share instead.
        loc = list(first["loc"])
        shared = [e["loc"] for e in errors if e["loc"][: len(loc) - 1] == tuple(loc[:-1])]
        if len(shared) > 1:
            loc = loc[:-1]
        where = ".".join(str(p) for p in loc)
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidRequestError(
            f"{where}: {message}" if where else message, where or None
        ) from None


class Api:
    """The whole HTTP API over one model state.

    Attributes:
        in_flight: Requests being handled now (a stream counts until it ends or closes).
    """

    def __init__(
        self,
        state: ModelState,
        settings: ServerSettings,
        on_record: Callable[[RequestRecord], None] | None = None,
        metrics: Callable[[], tuple[str, bytes]] | None = None,
    ) -> None:
        """Serve `state`'s model; `on_record` hears of every finished request; `metrics`
        (content type and body of a Prometheus scrape) adds `GET /metrics`."""
        self.state = state
        self.settings = settings
        self.on_record = on_record
        self.draining = False
        self._stopping = threading.Event()
        self.in_flight = 0
        self._lock = threading.Lock()
        self._keys = [k.encode() for k in settings.api_keys]
        self._routes: dict[str, dict[str, Callable[[Request, _Context], Response]]] = {
            "/": {"GET": self._playground},
            "/generate": {"POST": self._generate},
            "/v1/completions": {"POST": self._completions},
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/models": {"GET": self._models},
            "/healthz": {"GET": self._healthz},
            "/readyz": {"GET": self._readyz},
            "/openapi.json": {"GET": self._openapi},
        }
        assert set(self._routes) == ROUTES  # one list of routes, for adapters' metrics too
        self._scrape = metrics
        if metrics is not None:
            self._routes[METRICS_ROUTE] = {"GET": self._metrics}

    # -- entry point -------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """Answer one request; a streamed answer's body is an iterator of SSE chunks."""
        start = time.perf_counter()
        supplied = request.headers.get("x-request-id", "")
        request_id = supplied if _REQUEST_ID.fullmatch(supplied) else uuid.uuid4().hex
        with self._lock:
            self.in_flight += 1
        ctx = _Context(request_id)
        try:
            response = self._dispatch(request, ctx)
        except OrtServeError as exc:
            response = error_response(exc)
        except Exception:  # never a traceback in a body; the log has it
            log.exception("unhandled error in %s %s", request.method, request.path)
            response = error_response(OrtServeError("internal error"))
        response.headers.append(("x-request-id", request_id))
        response.headers.extend(self._cors(request))
        record = RequestRecord(request_id, request.method, request.path, response.status)
        if request.path == METRICS_ROUTE and self._scrape is not None:
            with self._lock:  # a scrape is not an API request: no record, no log line
                self.in_flight -= 1
        elif isinstance(response.body, bytes):
            self._finish(record, ctx, start)
        else:
            response.body = self._finish_when_done(response.body, record, ctx, start)
        return response

    def _cors(self, request: Request) -> list[tuple[str, str]]:
        """CORS headers for a browser origin the settings allow (none by default)."""
        origin = request.headers.get("origin", "")
        allowed = self.settings.cors_origins
        if not origin or not ("*" in allowed or origin.rstrip("/") in allowed):
            return []
        headers = [("access-control-allow-origin", origin), ("vary", "Origin"),
                   ("access-control-expose-headers", "x-request-id, retry-after")]  # fmt: skip
        if request.method == "OPTIONS":  # a preflight
            headers += [
                ("access-control-allow-methods", "GET, HEAD, POST, OPTIONS"),
                ("access-control-allow-headers",
                 "authorization, content-type, x-api-key, x-request-id"),
                ("access-control-max-age", "600"),
            ]  # fmt: skip
        return headers

    def start_draining(self) -> None:
        """Refuse new generations from now on; requests in flight go on."""
        self.draining = True

    def stop_generations(self) -> None:
        """End every running generation at its next text: a stream with a final
        `shutting_down` error event, a buffered request with that 503 (the drain's end)."""
        self.draining = True
        self._stopping.set()

    def _finish(self, record: RequestRecord, ctx: _Context, start: float) -> None:
        with self._lock:
            self.in_flight -= 1
        if self.on_record is None:
            return
        done = ctx.completion
        if done is not None:
            record = replace(
                record,
                prompt_tokens=done.prompt_tokens,
                completion_tokens=done.completion_tokens,
                ttft_s=done.timings.ttft_s,
                tokens_per_s=done.timings.decode_tokens_per_s,
            )
        record = replace(record, duration_s=time.perf_counter() - start)
        try:
            self.on_record(record)
        except Exception:  # observers must not break requests
            log.exception("request record observer failed")

    def _finish_when_done(
        self, body: Iterator[bytes], record: RequestRecord, ctx: _Context, start: float
    ) -> Iterator[bytes]:
        try:
            yield from body
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            self._finish(record, ctx, start)

    # -- routing, auth, limits --------------------------------------------------------

    def _dispatch(self, request: Request, ctx: _Context) -> Response:
        methods = self._routes.get(request.path)
        if methods is None and request.path.startswith(_MODEL_PREFIX):
            methods = {"GET": self._model}  # /v1/models/{id}: the id may hold slashes
        if methods is None:
            raise NotFoundError(f"no route {request.path}")
        # HEAD wherever GET is (RFC 9110), OPTIONS everywhere (with Allow; CORS preflight).
        allowed = tuple(sorted({*methods, *(["HEAD"] if "GET" in methods else []), "OPTIONS"}))
        if request.method == "OPTIONS":
            return Response(204, [("allow", ", ".join(allowed))])
        if request.method not in allowed:
            raise MethodNotAllowedError(
                f"{request.method} is not allowed on {request.path}; use {', '.join(allowed)}",
                allowed,
            )
        public = request.path in PUBLIC_ROUTES or (
            request.path == METRICS_ROUTE and self.settings.metrics_public
        )
        if not public:
            self._authenticate(request)
        if len(request.body) > self.settings.max_body_bytes:
            # An adapter may stop reading at limit + 1 bytes: say only what is certain.
            raise PayloadTooLargeError(
                f"the request body is larger than this server's limit of "
                f"{self.settings.max_body_bytes} bytes"
            )
        if request.method == "HEAD":
            response = methods["GET"](request, ctx)
            if not isinstance(response.body, bytes):
                response.close_body()
            response.body = b""  # GET's status and headers, no body
            return response
        return methods[request.method](request, ctx)

    def _authenticate(self, request: Request) -> None:
        """Check the request's API key (none needed when no keys are set).

        Raises:
            AuthenticationError: A key is needed and the request has no valid one.
        """
        if not self._keys:
            return
        auth = request.headers.get("authorization", "")
        supplied = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        supplied = supplied or request.headers.get("x-api-key", "").strip()
        # Compare with every key, in constant time, whatever matches first.
        given = supplied.encode()
        matches = [hmac.compare_digest(given, key) for key in self._keys]
        if not supplied or not any(matches):
            raise AuthenticationError(
                "missing or invalid API key: send 'Authorization: Bearer KEY' or 'x-api-key'"
            )

    def _engine(self) -> Engine:
        if self.draining:
            raise DrainingError("the server is shutting down; retry on another instance")
        return self.state.require()

    # -- generation plumbing ----------------------------------------------------------

    def _start(
        self,
        engine: Engine,
        request: GenerationRequest,
        param: str = "max_tokens",
        cancelled: threading.Event | None = None,
    ) -> GenerationStream:
        """Start `request`; `param` names the route's token-limit field in errors; a set
        `cancelled` (the client left) ends its wait for a slot."""
        limit = self.settings.max_new_tokens
        if request.options.max_new_tokens > limit:
            raise InvalidRequestError(
                f"{param} {request.options.max_new_tokens} is above this server's limit of {limit}",
                param,
            )
        # It checks the prompt's length once it has the tokens.
        return engine.stream(request, cancelled)

    def _timed(
        self, stream: GenerationStream, cancelled: threading.Event | None = None
    ) -> Iterator[str]:
        """The stream's deltas, stopped with a timeout error past request_timeout_s, or
        with `ClientClosedError` once `cancelled` is set (closing the stream frees the
        slot at the next token)."""
        deadline = time.monotonic() + self.settings.request_timeout_s
        try:
            for delta in stream:
                if cancelled is not None and cancelled.is_set():
                    raise ClientClosedError("the client closed the request during generation")
                if self._stopping.is_set():
                    raise DrainingError(
                        "the server shut down before this generation ended; retry on "
                        "another instance"
                    )
                yield delta
                if time.monotonic() > deadline:
                    raise RequestTimeoutError(
                        f"the generation ran past the {self.settings.request_timeout_s:g} s "
                        "request timeout"
                    )
        finally:
            stream.close()

    def _run(
        self, stream: GenerationStream, cancelled: threading.Event | None = None
    ) -> Completion:
        for _ in self._timed(stream, cancelled):
            pass
        done = stream.completion
        assert done is not None  # the stream ended: its completion holds the whole text
        return done

    def _sse_stream(
        self,
        stream: GenerationStream,
        ctx: _Context,
        delta_event: Callable[[str], Any],
        final_event: Callable[[Completion], Any],
        first_events: list[Any] | None = None,
        done_marker: bool = True,
        usage_base: dict[str, Any] | None = None,
    ) -> Response:
        """SSE of a generation; an error after the first byte is sent as a final event.

        With `usage_base` (OpenAI's `stream_options.include_usage`), a usage event on that
        base follows the final event.
        """

        def chunks() -> Iterator[bytes]:
            try:
                for event in first_events or []:
                    yield sse_event(event)
                for delta in self._timed(stream):
                    yield sse_event(delta_event(delta))
                done = stream.completion
                assert done is not None  # the stream ended
                ctx.completion = done
                yield sse_event(final_event(done))
                if usage_base is not None:
                    yield sse_event({**usage_base, "choices": [], "usage": self._usage(done)})
            except OrtServeError as exc:
                yield sse_event(error_payload(exc))
                return
            except Exception:
                log.exception("error while streaming %s", ctx.request_id)
                yield sse_event(error_payload(OrtServeError("internal error")))
                return
            finally:
                stream.close()
                # A stream closed early (client gone, drain timeout) still counts its tokens.
                ctx.completion = ctx.completion or stream.completion
            if done_marker:
                yield SSE_DONE

        return sse_response(chunks())

    # -- routes -----------------------------------------------------------------------

    def _generate(self, request: Request, ctx: _Context) -> Response:
        body = _parse(GenerateBody, request.body)
        engine = self._engine()
        options = Sampling(
            max_new_tokens=body.max_new_tokens, temperature=body.temperature, top_p=body.top_p,
            top_k=body.top_k, seed=body.seed,
        )  # fmt: skip
        gen = GenerationRequest(prompt=body.prompt, options=options, stop=tuple(body.stop or ()))
        stream = self._start(engine, gen, "max_new_tokens", request.cancelled)

        def counts(done: Completion) -> dict[str, Any]:
            return {
                "tokens_generated": done.completion_tokens,
                "prompt_tokens": done.prompt_tokens,
                "finish_reason": done.finish_reason,
            }

        if body.stream:
            return self._sse_stream(
                stream, ctx, lambda d: {"text": d},
                lambda done: {"done": True, **counts(done)}, done_marker=False,
            )  # fmt: skip
        done = self._run(stream, request.cancelled)
        ctx.completion = done
        return json_response(200, {"generated_text": done.text, **counts(done)})

    def _openai_common(self, body: CompletionBody | ChatBody) -> Sampling:
        served = self.state.engine.model_name if self.state.engine else None
        if body.model is not None and served is not None and body.model != served:
            raise ModelNotFoundError(
                f"the model {body.model!r} does not exist; this server has {served!r}"
            )
        max_tokens = body.max_tokens
        if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
        if max_tokens is None:  # OpenAI's defaults: 16 for completions, "as many as fit" for chat
            limit = self.settings.max_new_tokens
            max_tokens = min(16, limit) if isinstance(body, CompletionBody) else limit
        return Sampling(
            max_new_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
            seed=body.seed,
        )  # fmt: skip

    def _ids(self, request_id: str, prefix: str) -> tuple[str, int]:
        return f"{prefix}-{request_id}", int(time.time())

    def _usage(self, done: Completion) -> dict[str, int]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
        }

    def _completions(self, request: Request, ctx: _Context) -> Response:
        body = _parse(CompletionBody, request.body)
        options = self._openai_common(body)
        engine = self._engine()
        gen = GenerationRequest(prompt=body.text(), options=options, stop=tuple(body.stop or ()))
        stream = self._start(engine, gen, cancelled=request.cancelled)
        cid, created = self._ids(ctx.request_id, "cmpl")
        base = {"id": cid, "object": "text_completion", "created": created,
                "model": engine.model_name}  # fmt: skip

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

        if body.stream:
            return self._sse_stream(
                stream, ctx, lambda d: {**base, "choices": [choice(d, None)]},
                lambda done: {**base, "choices": [choice("", _finish(done))]},
                usage_base=base if _include_usage(body) else None,
            )  # fmt: skip
        done = self._run(stream, request.cancelled)
        ctx.completion = done
        return json_response(
            200, {**base, "choices": [choice(done.text, _finish(done))], "usage": self._usage(done)}
        )

    def _chat(self, request: Request, ctx: _Context) -> Response:
        body = _parse(ChatBody, request.body)
        options = self._openai_common(body)
        engine = self._engine()
        gen = GenerationRequest(
            messages=[m.as_template_input() for m in body.messages],
            template_kwargs=body.chat_template_kwargs,
            options=options,
            stop=tuple(body.stop or ()),
            guidance=_guidance(body.response_format),
        )
        given = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        stream = self._start(engine, gen, given, request.cancelled)
        cid, created = self._ids(ctx.request_id, "chatcmpl")
        base = {"id": cid, "object": "chat.completion.chunk", "created": created,
                "model": engine.model_name, "system_fingerprint": _fingerprint(engine)}  # fmt: skip

        if body.stream:

            def delta(text: str) -> dict[str, Any]:
                return {**base, "choices": [{"index": 0, "delta": {"content": text},
                                             "logprobs": None, "finish_reason": None}]}  # fmt: skip

            def final(done: Completion) -> dict[str, Any]:
                return {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                             "finish_reason": _finish(done)}]}  # fmt: skip

            first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "logprobs": None, "finish_reason": None}]}  # fmt: skip
            return self._sse_stream(stream, ctx, delta, final, first_events=[first],
                                    usage_base=base if _include_usage(body) else None)  # fmt: skip
        done = self._run(stream, request.cancelled)
        ctx.completion = done
        message = {"role": "assistant", "content": done.text, "refusal": None}
        return json_response(200, {
            **base, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": _finish(done)}],
            "usage": self._usage(done),
        })  # fmt: skip

    def _models(self, request: Request, ctx: _Context) -> Response:
        engine = self.state.require()
        return json_response(200, {"object": "list", "data": [_model_card(engine)]})

    def _model(self, request: Request, ctx: _Context) -> Response:
        engine = self.state.require()
        name = request.path.removeprefix(_MODEL_PREFIX)
        if name != engine.model_name:
            raise ModelNotFoundError(
                f"the model {name!r} does not exist; this server has {engine.model_name!r}"
            )
        return json_response(200, _model_card(engine))

    def _health(self) -> dict[str, Any]:
        state = self.state
        status = "draining" if self.draining else state.status
        payload: dict[str, Any] = {"status": status, **state.describe()}
        engine = state.engine
        if engine is not None:
            payload.update(active=engine.admission.active, waiting=engine.admission.waiting)
        return payload

    def _healthz(self, request: Request, ctx: _Context) -> Response:
        return json_response(200, {**self._health(), "alive": True})

    def _readyz(self, request: Request, ctx: _Context) -> Response:
        payload = self._health()
        ready = payload["status"] == "ready"
        # Retry-After only where waiting helps: not after a failed load.
        retry = not ready and payload["status"] != "failed"
        return json_response(200 if ready else 503, payload,
                             [("retry-after", "5")] if retry else None)  # fmt: skip

    def _metrics(self, request: Request, ctx: _Context) -> Response:
        assert self._scrape is not None  # the route exists only with a scrape
        content_type, body = self._scrape()
        return Response(200, [("content-type", content_type)], body)

    def _openapi(self, request: Request, ctx: _Context) -> Response:
        from core.openapi import openapi_document  # builds JSON schemas: not on the cold path

        return json_response(200, openapi_document(self.settings.max_new_tokens))

    def _playground(self, request: Request, ctx: _Context) -> Response:
        body, policy = _playground_page()
        return Response(200, [
            ("content-type", "text/html; charset=utf-8"),
            ("content-security-policy", policy),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
            ("cache-control", "no-cache"),
        ], body)  # fmt: skip


@functools.cache
def _playground_page() -> tuple[bytes, str]:
    """The chat playground (core/playground.html, read once) and its content security
    policy: only its own inline script and style (by hash) and calls to this origin."""
    page = (Path(__file__).parent / "playground.html").read_text(encoding="utf-8")

    def digest(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
        hashes = (base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in blocks)
        return " ".join(f"'sha256-{h}'" for h in hashes) or "'none'"

    policy = (
        f"default-src 'none'; script-src {digest('script')}; style-src {digest('style')}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return page.encode(), policy


def _model_card(engine: Engine) -> dict[str, Any]:
    created = int(datetime.fromisoformat(engine.manifest.created_at).timestamp())
    return {"id": engine.model_name, "object": "model", "created": created,
            "owned_by": "ortserve"}  # fmt: skip


def _include_usage(body: CompletionBody | ChatBody) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def _finish(done: Completion) -> str:
    return "stop" if done.finish_reason == "stop" else "length"


def _fingerprint(engine: Engine) -> str:
    return f"fp_{engine.digest[:12]}"


_WHITESPACE_RULE = {"whitespace_flexible": False}


def _guidance(response_format: ResponseFormat | None) -> Guidance | None:
    """response_format → constrained decoding. Compact JSON keeps small models from
    wandering into endless whitespace, which flexible-whitespace grammars allow."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        schema: dict[str, Any] = {"type": "object"}
    else:
        if response_format.json_schema is None:
            where = "response_format.json_schema"
            raise InvalidRequestError(f"{where} is required for type json_schema", where)
        schema = dict(response_format.json_schema.schema_)
    schema.setdefault("x-guidance", _WHITESPACE_RULE)
    return Guidance("json_schema", json.dumps(schema))
