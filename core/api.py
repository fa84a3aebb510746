"""The HTTP API, framework-free: a router. Route and method, auth, the body-size limit,
errors as HTTP, the request record, SSE framing; what answers each route is named in
core.routes' table (a body's meaning and its answer are core.protocol's, the probes
core.health's), generating is core.service's.

Every adapter (edge daemon, Lambda, Cloud Functions) calls `Api.handle` and writes the
`Response` back, so the same request gives the same bytes on every target.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ortserve.core.content_filter import ContentFilterError
from ortserve.core.errors import (
    AuthenticationError,
    BusyError,
    ClientClosedError,
    DrainingError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelNotFoundError,
    NotFoundError,
    OrtServeError,
    PayloadTooLargeError,
)
from ortserve.core.generation import Completion, Drafts, GenerationStream
from ortserve.core.http import (
    SSE_DONE,
    Request,
    Response,
    error_response,
    json_response,
    ndjson_line,
    ndjson_response,
    sse_event,
    sse_response,
)
from ortserve.core.logs import escaped
from ortserve.core.protocol.bodies import GenerationBody, parse
from ortserve.core.protocol.serving import Event, MultiChoiceReply, Reply, Served
from ortserve.core.records import RequestRecord
from ortserve.core.registry import Lease, Models
from ortserve.core.routes import (
    METRICS_ROUTE,
    PUBLIC_ROUTES,
    TABLE,
    error_shape,
    find,
    ollama_shaped,
)
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from ortserve.core.tenants import tenant_of

if TYPE_CHECKING:  # annotations only: adapters import this module without onnxruntime-genai
    from ortserve.core.embedding import EmbeddingModel, ServedEmbedding
    from ortserve.core.service import Choices, Service

log = logging.getLogger("ortserve")

# With API keys set, every route but the public ones needs a key (/metrics too, unless
# METRICS_PUBLIC). The chat playground ("/" and its scripts) holds no data; its API calls
# carry the key. The routes themselves: core.routes, the one table.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass
class Context:
    """Per-request state shared by the route's answer and the record at the end."""

    request_id: str
    completion: Completion | None = None
    reply: Reply | None = None  # a generation's: it says how the answer ended
    ending: str = ""  # set where the answer ended otherwise (an error)
    filtered: str = ""  # the content filter's rule that refused the request
    reason: str = ""  # why the answer is an error (its code and public message)
    tenant: str = ""  # whose request it is (core.tenants): "" when no keys are set
    keyed: bool = False  # it carried a valid API key (or admin key)
    admin: bool = False  # it carried an admin key (ORTSERVE_ADMIN_KEYS)
    embedded_tokens: int = 0  # an embedding request's input tokens
    lease: Lease | None = None  # its hold on the model it asked for (core.registry)
    keep_s: float | None = None  # how long that model stays loaded after it (keep_alive)


#: What answers a route (core.routes' `Route.answer`): a function of the API, the request
#: and its context, which it may fill in for the record.
Answer = Callable[["Api", Request, Context], Response]


class Api:
    """The whole HTTP API over one model state. The routes' answers (core.routes) are
    functions of it: they read its state and settings and call `loaded`, `served` and
    `generate`.

    Attributes:
        state: The model's state (loading, ready or failed).
        settings: The server's settings.
        draining: Set once the server refuses new generations (shutdown).
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
        self.in_flight = 0
        self._lock = threading.Lock()
        self._keys = [k.encode() for k in settings.api_keys]
        self._admin_keys = [k.encode() for k in settings.admin_keys]
        self._routes: dict[str, dict[str, Answer]] = {}
        for route in TABLE:
            self._routes.setdefault(route.path, {})[route.method] = route.answer
        # Every model served: this one first, then ORTSERVE_MODELS (core.registry); and
        # the places embedding requests take (as many as generations).
        self.registry = Models(state, settings)
        self._embedding_slots = threading.BoundedSemaphore(max(1, settings.max_concurrency))
        self._scrape = metrics
        if metrics is not None:
            self._routes[METRICS_ROUTE] = {"GET": Api._metrics}

    # -- entry point -------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """Answer one request; a streamed answer's body is an iterator of SSE chunks."""
        start = time.perf_counter()
        supplied = request.headers.get("x-request-id", "")
        request_id = supplied if _REQUEST_ID.fullmatch(supplied) else uuid.uuid4().hex
        with self._lock:
            self.in_flight += 1
        ctx = Context(request_id)
        shape = error_shape(request.path)
        try:
            response = self._dispatch(request, ctx)
        except OrtServeError as exc:
            response = error_response(exc, shape)
            ctx.reason = _reason(exc)
            if isinstance(exc, ContentFilterError):
                ctx.filtered = exc.rule
        except Exception:  # never a traceback in a body; the log has it
            # The path is the client's: escaped, one line (log forging).
            log.exception("unhandled error in %s %s", request.method, escaped(request.path))
            internal = OrtServeError("internal error")
            response = error_response(internal, shape)
            ctx.reason = _reason(internal)
        if ctx.reply is not None and response.status in (500, 504):
            ctx.ending = "error"  # a generation that failed or ran out of time
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
        headers = [
            ("access-control-allow-origin", origin),
            ("vary", "Origin"),
            ("access-control-expose-headers", "x-request-id, retry-after"),
        ]
        if request.method == "OPTIONS":  # a preflight
            headers += [
                ("access-control-allow-methods", "GET, HEAD, POST, OPTIONS"),
                (
                    "access-control-allow-headers",
                    "authorization, content-type, x-api-key, x-request-id",
                ),
                ("access-control-max-age", "600"),
            ]
        return headers

    def start_draining(self) -> None:
        """Refuse new generations from now on; requests in flight go on."""
        self.draining = True

    def stop_generations(self) -> None:
        """End every running generation at its next text: a stream with a final
        `shutting_down` error event, a buffered request with that 503 (the drain's end)."""
        self.draining = True
        for state in self.registry.states:
            service = state.service
            if service is not None:
                service.stop_generations()

    def _finish(self, record: RequestRecord, ctx: Context, start: float) -> None:
        if ctx.lease is not None:
            ctx.lease.release(ctx.keep_s)
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
                filtered=done.filtered,
                redactions=done.redactions,
                draft_tokens=done.drafts.drafted if done.drafts is not None else 0,
                accepted_tokens=done.drafts.accepted if done.drafts is not None else 0,
            )
        if ctx.embedded_tokens:
            record = replace(record, prompt_tokens=ctx.embedded_tokens)
        ending = ctx.ending
        if not ending and done is not None and ctx.reply is not None:
            ending = ctx.reply.ending(done)
        record = replace(
            record,
            duration_s=time.perf_counter() - start,
            ending=ending,
            filtered=record.filtered or ctx.filtered,
            reason=ctx.reason,
        )
        try:
            self.on_record(record)
        except Exception:  # observers must not break requests
            log.exception("request record observer failed")

    def _finish_when_done(
        self, body: Iterator[bytes], record: RequestRecord, ctx: Context, start: float
    ) -> Iterator[bytes]:
        try:
            yield from body
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            self._finish(record, ctx, start)

    # -- routing, auth, limits --------------------------------------------------------

    def _dispatch(self, request: Request, ctx: Context) -> Response:
        public = request.path in PUBLIC_ROUTES or (
            request.path == METRICS_ROUTE and self.settings.metrics_public
        )
        # The key is checked before the route: without one, an unknown route or a wrong
        # method answers as a real route does (401), so routes cannot be discovered. A CORS
        # preflight carries no key by design: without one, every path answers it alike.
        supplied = _supplied_key(request)
        admin = _matches(supplied, self._admin_keys)
        keyed = admin or _matches(supplied, self._keys)
        ctx.keyed, ctx.admin = keyed, admin
        ctx.tenant = tenant_of(supplied) if keyed else ""
        if not public and not (keyed or not (self._keys or self._admin_keys)):
            if request.method == "OPTIONS":
                return Response(204, [("allow", "GET, HEAD, OPTIONS, POST")])
            raise AuthenticationError(
                "missing or invalid API key: send 'Authorization: Bearer KEY' or 'x-api-key'"
            )
        route = find(request.path)  # /v1/models/{model}: the id may hold slashes
        methods = self._routes.get(request.path if route is None else route.path)
        if methods is None:
            raise NotFoundError(_no_route(request.path))
        # HEAD wherever GET is (RFC 9110), OPTIONS everywhere (with Allow; CORS preflight).
        allowed = tuple(sorted({*methods, *(["HEAD"] if "GET" in methods else []), "OPTIONS"}))
        if request.method == "OPTIONS":
            return Response(204, [("allow", ", ".join(allowed))])
        if request.method not in allowed:
            raise MethodNotAllowedError(
                f"{request.method} is not allowed on {request.path}; use {', '.join(allowed)}",
                allowed,
            )
        if len(request.body) > self.settings.max_body_bytes:
            # An adapter may stop reading at limit + 1 bytes: say only what is certain.
            raise PayloadTooLargeError(
                f"the request body is larger than this server's limit of "
                f"{self.settings.max_body_bytes} bytes"
            )
        if request.method == "HEAD":
            response = methods["GET"](self, request, ctx)
            if not isinstance(response.body, bytes):
                response.close_body()
            response.body = b""  # GET's status and headers, no body
            return response
        return methods[request.method](self, request, ctx)

    def _service(
        self, request: Request, ctx: Context, name: str | None
    ) -> tuple[Service, ModelState]:
        """The service of the model `name` names for a new generation (none while
        draining), held for the request (`ctx.lease`, released when it ends).

        Raises:
            ModelNotFoundError: No model has that name.
            ModelUnavailableError: It is loading past QUEUE_TIMEOUT_S, failed, or does
                not fit the memory budget beside the models in use.
            InvalidRequestError: It is an embedding model.
        """
        if self.draining:
            raise DrainingError("the server is shutting down; retry on another instance")
        state = self.registry.pick(name, ollama_shaped(request.path))
        ctx.lease = self.registry.acquire(state)
        return state.require(self.settings.queue_timeout_s, request.cancelled), state

    # -- generation routes --------------------------------------------------------------

    def generate(self, body_type: type[GenerationBody], request: Request, ctx: Context) -> Response:
        """Answer a generation route (its answer in core.protocol names `body_type`): the
        body says what to generate and how to answer; the service generates."""
        body = parse(body_type, request.body)
        body.sent_by(ctx.tenant)
        service, state = self._service(request, ctx, getattr(body, "model", None))
        served = self.served(service, state)
        keep_alive = getattr(body, "keep_alive", None)
        # Ollama's: how long the model stays after this request. It changes what the
        # server holds for everyone: with keys set, an admin key's request only.
        if keep_alive is not None and (ctx.admin or not (self._keys or self._admin_keys)):
            from ortserve.core.durations import seconds

            ctx.keep_s = seconds(keep_alive)
        instant = body.instant_answer(served)
        if instant is not None:
            return json_response(200, instant)
        generation = replace(
            body.to_generation(served), tenant=body.tenant, cache_salt=body.cache_salt
        )
        reply = body.reply(ctx.request_id, served)
        ctx.reply = reply
        if body.choices > 1:
            assert isinstance(reply, MultiChoiceReply)  # only OpenAI's bodies have n
            choices = service.stream_choices(
                generation, body.choices, request.cancelled, request.deadline
            )
            return self._choices(choices, reply, ctx, body.stream)
        stream = service.stream(generation, request.cancelled, request.deadline)
        if body.stream:
            return self._stream(stream, reply, ctx)
        done = stream.collect()
        ctx.completion = done
        return json_response(200, reply.body(done))

    def _stream(self, stream: GenerationStream, reply: Reply, ctx: Context) -> Response:
        """A generation's events, as SSE or NDJSON (the reply's framing)."""

        def events() -> Iterator[Event]:
            reply.opened(stream.prompt_tokens)
            yield from reply.first_events()
            for delta in stream:
                delta_event = reply.delta(delta, stream.take_logprobs())
                if delta_event is not None:
                    yield delta_event
            done = stream.completion
            assert done is not None  # the stream ended
            ctx.completion = done
            yield from reply.final_events(done)

        def close() -> None:
            stream.close()
            # A stream closed early (client gone, drain timeout) still counts its tokens.
            ctx.completion = ctx.completion or stream.completion

        body = self._guarded(events(), reply, ctx, close)
        return sse_response(body) if reply.framing == "sse" else ndjson_response(body)

    def _choices(
        self, choices: Choices, reply: MultiChoiceReply, ctx: Context, stream: bool
    ) -> Response:
        """Several choices of one request: one body with them all, or one SSE stream
        whose events carry each choice's `index`."""
        if not stream:
            dones = choices.collect()
            ctx.completion = _merged(dones)
            return json_response(200, reply.bodies(dones))

        def events() -> Iterator[Event]:
            started: set[int] = set()
            for item in choices:
                if isinstance(item, int):  # choice `item` ended
                    done = choices.completions[item]
                    assert done is not None
                    yield from reply.finish_events(done, item)
                    continue
                if item.index not in started:
                    started.add(item.index)
                    yield from reply.first_events(item.index)
                delta_event = reply.delta(item.text, item.logprobs, item.index)
                if delta_event is not None:
                    yield delta_event
            dones = [c for c in choices.completions if c is not None]
            ctx.completion = _merged(dones)
            yield from reply.usage_events(dones)

        def close() -> None:
            choices.close()
            so_far = [c for c in choices.completions if c is not None]
            ctx.completion = ctx.completion or (_merged(so_far) if so_far else None)

        return sse_response(self._guarded(events(), reply, ctx, close))

    def _guarded(
        self,
        events: Iterator[Event],
        reply: Reply,
        ctx: Context,
        close: Callable[[], None],
    ) -> Iterator[bytes]:
        """`events`, encoded in the reply's framing; an error after the first byte is sent
        as a final error event (and no `[DONE]`); `close` runs however it ends."""

        def encode(event: Event) -> bytes:
            if reply.framing == "ndjson":
                return ndjson_line(event)
            # Anthropic's streams name each event after its type.
            return sse_event(event, str(event["type"]) if reply.named_events else None)

        try:
            for event in events:
                yield encode(event)
        except OrtServeError as exc:
            # A client that left (seen between tokens, before the adapter closed the
            # stream) cancelled its answer: no error of the server's.
            left = isinstance(exc, ClientClosedError)
            ctx.ending, ctx.reason = ("cancelled" if left else "error"), _reason(exc)
            yield encode(reply.error_event(exc))
            return
        except Exception:
            log.exception("error while streaming %s", ctx.request_id)
            internal = OrtServeError("internal error")
            ctx.ending, ctx.reason = "error", _reason(internal)
            yield encode(reply.error_event(internal))
            return
        finally:
            close()
        if reply.done_marker:
            yield SSE_DONE

    # -- what the routes' answers ask of the server -----------------------------------

    def loaded(self, request: Request) -> Service:
        """The model's service; a request that comes while it loads waits for the load
        (up to QUEUE_TIMEOUT_S, as for a slot), as Ollama's requests do."""
        return self.state.require(self.settings.queue_timeout_s, request.cancelled)

    def service_of(
        self, request: Request, ctx: Context, name: str | None
    ) -> tuple[Service, Served]:
        """The service of the generative model `name` names and what formats know of it,
        held for the request (as a generation holds it).

        Raises:
            As `_service`.
        """
        service, state = self._service(request, ctx, name)
        return service, self.served(service, state)

    def served(self, service: Service, state: ModelState | None = None) -> Served:
        """What request formats need to know of `service`'s model, under the names it is
        served as (`state`'s: ALIASES, SERVED_NAME or the name it was given, else the
        manifest's name)."""
        engine = service.engine
        manifest = engine.manifest
        names = self.registry.names(state or self.state) or (engine.model_name,)
        model, *aliases = names
        return Served(
            model,
            engine.digest,
            manifest.created_at,
            service.max_new_tokens,
            service.default_new_tokens,
            context_length=engine.context_length,
            chat_template=engine.text.template,
            precision=manifest.precision,
            size=sum(f.size for f in manifest.files),
            token_bytes=engine.text.token_bytes,
            aliases=tuple(aliases),
            also_known_as=(engine.model_name,),
            sampling=engine.sampling_defaults,
            adapters=tuple(engine.adapters),
            limit_set=bool(self.settings.max_new_tokens),
        )

    def models(self, request: Request) -> list[Served]:
        """Every model this server serves, the model first (waiting for its first load
        as `loaded` does), then the others, loaded or not (as their manifests say them;
        one whose folder cannot be read is left out, and /readyz says why)."""
        listed: list[Served] = []
        for state in self.registry.states:
            if state is self.state and state.status != "unloaded":
                # Its first load waited for (as `loaded` does); failed: the 503 says why.
                state.require_embedder(self.settings.queue_timeout_s, request.cancelled)
            if state.service is not None:
                listed.append(self.served(state.service, state))
            elif state.embedder is not None:
                listed.append(self.served_embedding(self.registry.names(state), state.embedder))
            else:
                declared = _declared(state, self.registry.names(state))
                if declared is not None:
                    listed.append(declared)
        return listed

    @staticmethod
    def served_embedding(names: tuple[str, ...], embedder: EmbeddingModel) -> Served:
        """What the listing routes need to know of an embedding model."""
        manifest = embedder.manifest
        return Served(
            names[0] if names else embedder.name,
            embedder.digest,
            manifest.created_at if manifest is not None else "1970-01-01T00:00:00+00:00",
            0,
            0,
            context_length=embedder.max_tokens,
            precision=embedder.config.precision,
            size=embedder.size,
            also_known_as=names[1:],
            kind="embedding",
            dimensions=embedder.dimensions,
        )

    def embedding(
        self, request: Request, ctx: Context, name: str | None, ollama: bool = False
    ) -> ServedEmbedding:
        """The embedding model `name` names (None or "": the first one served), held for
        the request (`ctx.lease`).

        Raises:
            ModelNotFoundError: No model has that name, or no embedding model is served.
            InvalidRequestError: It names a generative model.
            ModelUnavailableError: It is loading past QUEUE_TIMEOUT_S, failed, or does
                not fit the memory budget.
        """
        from ortserve.core.embedding import ServedEmbedding

        if self.draining:
            raise DrainingError("the server is shutting down; retry on another instance")
        embedding = [s for s in self.registry.states if s.kind == "embedding"]
        named = bool(name and name.strip())  # a blank name is none: the first one served
        state = self.registry.find(name) if named else (embedding[0] if embedding else None)
        if state is None:
            have = ", ".join(repr(self.registry.names(s)[0]) for s in embedding if s.names)
            quoted = f"model '{name}'" if ollama else f"the model {name!r}"
            raise ModelNotFoundError(
                f"{quoted} not found; this server has {have or 'no embedding model'} for embeddings"
            )
        if state.kind != "embedding":
            raise InvalidRequestError(
                f"the model {name!r} generates text; it does not make embeddings "
                "(serve an embedding model beside it: `ortserve serve MODEL "
                "all-minilm:l6-v2`)",
                "model",
            )
        ctx.lease = self.registry.acquire(state)
        embedder = state.require_embedder(self.settings.queue_timeout_s, request.cancelled)
        assert embedder is not None  # its manifest says embedding, and it loaded
        name_id = self.registry.names(state)
        return ServedEmbedding(
            embedder, name_id[0] if name_id else embedder.name, state.content_filter
        )

    @contextlib.contextmanager
    def embedding_slot(self, request: Request) -> Iterator[None]:
        """One of the places embedding requests take (as many as MAX_CONCURRENCY): a
        request waits for one up to QUEUE_TIMEOUT_S, then gets 503 with Retry-After.

        Raises:
            BusyError: No place within QUEUE_TIMEOUT_S.
        """
        timeout = self.settings.queue_timeout_s
        if not self._embedding_slots.acquire(timeout=timeout):
            raise BusyError(
                f"every embedding place was busy for {timeout:.0f} s; retry later", timeout
            )
        try:
            yield
        finally:
            self._embedding_slots.release()

    def _metrics(self, request: Request, ctx: Context) -> Response:
        assert self._scrape is not None  # the route exists only with a scrape
        content_type, body = self._scrape()
        return Response(200, [("content-type", content_type)], body)


def _supplied_key(request: Request) -> str:
    """The API key a request carries (`Authorization: Bearer` or `x-api-key`), or ""."""
    auth = request.headers.get("authorization", "")
    supplied = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return supplied or request.headers.get("x-api-key", "").strip()


def _matches(supplied: str, keys: list[bytes]) -> bool:
    """Whether `supplied` is one of `keys`: compared with every key, in constant time,
    whatever matches first."""
    given = supplied.encode()
    matches = [hmac.compare_digest(given, key) for key in keys]
    return bool(supplied) and any(matches)


def _no_route(path: str) -> str:
    """A 404's words: a path that exists under /v1 says so (an OpenAI client whose
    base_url lacks /v1 asks for /chat/completions)."""
    if find(f"/v1{path}") is not None:
        return (
            f"no route {path}: did you mean /v1{path}? (an OpenAI client's base_url ends with /v1)"
        )
    return f"no route {path}"


def _reason(exc: OrtServeError) -> str:
    """A request record's `reason`: the error's code and the message its answer carries."""
    return f"{exc.code}: {exc.message}"


def _merged(dones: list[Completion]) -> Completion:
    """One request's figures over its choices (for its record): the prompt once, every
    choice's tokens, the first choice's timings."""
    first = dones[0]
    drafts = [d.drafts for d in dones if d.drafts is not None]
    return replace(
        first,
        completion_tokens=sum(d.completion_tokens for d in dones),
        drafts=Drafts(sum(d.drafted for d in drafts), sum(d.accepted for d in drafts))
        if drafts
        else None,
    )


def _declared(state: ModelState, names: tuple[str, ...]) -> Served | None:
    """What the listing routes say of a model that is not loaded, from its manifest (None:
    there is none to read)."""
    from ortserve.core.manifest import manifest_digest
    from ortserve.core.state import pinned_folder

    manifest = state.manifest()
    if manifest is None or not names:
        return None
    try:
        digest = manifest_digest(pinned_folder(state.settings.model_dir))
    except OSError:
        return None
    embedding = manifest.kind == "embedding"
    return Served(
        names[0],
        digest,
        manifest.created_at,
        0,
        0,
        precision=manifest.precision,
        size=sum(f.size for f in manifest.files),
        also_known_as=names[1:],
        kind="embedding" if embedding else "generative",
    )
