"""The HTTP API's one route table: every route, its method, what answers it, and who
may call it. The API's dispatch (core.api), the OpenAPI document (core.openapi), the
public routes (no API key), the Lambda routes that answer before the model is loaded,
and the metric labels (edge.metrics) are all derived from it.

Each route names its answer as a function (core.api.Answer), where its API lives:
core.protocol's modules, core.health, core.playground. They type the API they are given
under TYPE_CHECKING, so importing this table never imports core.api (which imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ortserve.core import health, playground
from ortserve.core.http import ErrorShape, Request, Response, json_response
from ortserve.core.protocol import (
    adapters,
    anthropic,
    chat,
    embeddings,
    native,
    ollama,
    openai,
    responses,
)
from ortserve.core.protocol.bodies import Body
from ortserve.core.protocol.replies import (
    AnthropicBlockDelta,
    AnthropicBlockStart,
    AnthropicBlockStop,
    AnthropicError,
    AnthropicMessage,
    AnthropicMessageDelta,
    AnthropicMessageStart,
    AnthropicMessageStop,
    AnthropicPing,
    AnthropicTokenCount,
    ChatCompletion,
    ChatCompletionChunk,
    EmbeddingList,
    Generated,
    GeneratedEnd,
    GeneratedText,
    Health,
    LoraAdapterReply,
    ModelCard,
    ModelList,
    OllamaEmbed,
    OllamaEmbedding,
    OllamaLine,
    OllamaPs,
    OllamaShow,
    OllamaTags,
    OllamaVersion,
    ResponseArgumentsEvent,
    ResponseErrorEvent,
    ResponseItemEvent,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponsePartEvent,
    ResponseTextEvent,
    TextCompletion,
)
from ortserve.core.settings import MAX_TOKENS_BOUND

if TYPE_CHECKING:  # core.api imports this module
    from ortserve.core.api import Answer, Api, Context

Method = Literal["GET", "POST"]
#: Paths under this prefix are Ollama's: their errors take Ollama's shape (known or not).
OLLAMA_PREFIX = "/api/"


#: Paths under this prefix are Anthropic's Messages API: their errors take its shape.
ANTHROPIC_PREFIX = "/v1/messages"


def ollama_shaped(path: str) -> bool:
    """Whether the errors (and streams) of a request to `path` take Ollama's shape."""
    return path.startswith(OLLAMA_PREFIX)


def error_shape(path: str) -> ErrorShape:
    """Whose conventions the errors of a request to `path` follow (known route or not)."""
    if ollama_shaped(path):
        return "ollama"
    anthropic = path == ANTHROPIC_PREFIX or path.startswith(f"{ANTHROPIC_PREFIX}/")
    return "anthropic" if anthropic else "openai"


@dataclass(frozen=True)
class Route:
    """One route of the API.

    Attributes:
        path: The path; a `{name}` part takes the rest of the path (slashes included).
        method: The method it answers (HEAD comes with GET, OPTIONS everywhere).
        answer: What answers it: a function of the API, the request and its context.
        summary: What it does (the OpenAPI operation's summary).
        body: The pydantic model of its JSON body (a POST).
        reply: The shape of its JSON answer (a TypedDict of core.protocol.replies).
        events: The shapes of its stream's events or lines (generation routes).
        public: Answered without an API key (it holds no data).
        without_model: Answered without the model (so a lazily loading Lambda does not
            wait for the load first).
        documented: In the OpenAPI document (the playground's page and scripts are not).
    """

    path: str
    method: Method
    answer: Answer
    summary: str
    body: type[Body] | None = None
    reply: type | None = None
    events: tuple[type, ...] = ()
    public: bool = False
    without_model: bool = False
    documented: bool = True

    @property
    def ollama(self) -> bool:
        """Ollama's route: errors in Ollama's shape, streams in NDJSON."""
        return ollama_shaped(self.path)

    @property
    def error_shape(self) -> ErrorShape:
        """Whose conventions its errors follow (`error_shape`)."""
        return error_shape(self.path)

    @property
    def prefix(self) -> str | None:
        """For a path with a `{name}` part, the fixed part before it (else None)."""
        head, brace, _ = self.path.partition("{")
        return head if brace else None


def _openapi(api: Api, request: Request, ctx: Context) -> Response:
    """GET /openapi.json: this table as an OpenAPI document, with the server's token limit."""
    from ortserve.core.openapi import openapi_document  # builds JSON schemas: not on the cold path

    # Without MAX_NEW_TOKENS any limit is accepted (and cut to what fits).
    limit = api.settings.max_new_tokens or MAX_TOKENS_BOUND
    return json_response(200, openapi_document(TABLE, limit))


def _playground() -> tuple[Route, ...]:
    page = Route(
        "/",
        "GET",
        playground.page,
        "the chat playground",
        public=True,
        without_model=True,
        documented=False,
    )
    assets = (
        Route(
            path,
            "GET",
            playground.asset,
            "a playground script",
            public=True,
            without_model=True,
            documented=False,
        )
        for path in sorted(playground.ASSETS)
    )
    return (page, *assets)


TABLE: tuple[Route, ...] = (
    *_playground(),
    Route(
        "/generate",
        "POST",
        native.generate,
        "generate text (native API)",
        body=native.GenerateBody,
        reply=Generated,
        events=(GeneratedText, GeneratedEnd),
    ),
    Route(
        "/v1/completions",
        "POST",
        openai.completions,
        "OpenAI-compatible completion",
        body=openai.CompletionBody,
        reply=TextCompletion,
        events=(TextCompletion,),
    ),
    Route(
        "/v1/chat/completions",
        "POST",
        chat.chat_completions,
        "OpenAI-compatible chat completion",
        body=chat.ChatBody,
        reply=ChatCompletion,
        events=(ChatCompletionChunk,),
    ),
    Route(
        "/v1/responses",
        "POST",
        responses.responses,
        "OpenAI-compatible response (the Responses API)",
        body=responses.ResponsesBody,
        reply=ResponseObject,
        events=(
            ResponseLifecycleEvent,
            ResponseItemEvent,
            ResponsePartEvent,
            ResponseTextEvent,
            ResponseArgumentsEvent,
            ResponseErrorEvent,
        ),
    ),
    Route(
        "/v1/messages",
        "POST",
        anthropic.messages,
        "Anthropic-compatible message (the Messages API)",
        body=anthropic.MessagesBody,
        reply=AnthropicMessage,
        events=(
            AnthropicMessageStart,
            AnthropicBlockStart,
            AnthropicPing,
            AnthropicBlockDelta,
            AnthropicBlockStop,
            AnthropicMessageDelta,
            AnthropicMessageStop,
            AnthropicError,
        ),
    ),
    Route(
        "/v1/messages/count_tokens",
        "POST",
        anthropic.count_tokens,
        "a conversation's prompt tokens (Anthropic's count_tokens)",
        body=anthropic.CountTokensBody,
        reply=AnthropicTokenCount,
    ),
    Route(
        "/v1/embeddings",
        "POST",
        embeddings.embeddings,
        "OpenAI-compatible embeddings (an embedding model's)",
        body=embeddings.EmbeddingsBody,
        reply=EmbeddingList,
    ),
    Route("/v1/models", "GET", openai.models, "the served model", reply=ModelList),
    Route(
        "/v1/models/{model}",
        "GET",
        openai.model,
        "one model, by its id (the served one)",
        reply=ModelCard,
    ),
    Route(
        "/v1/load_lora_adapter",
        "POST",
        adapters.load_lora_adapter,
        "load a baked LoRA adapter now (vLLM's route; a request loads it on first use)",
        body=adapters.LoraAdapterBody,
        reply=LoraAdapterReply,
    ),
    Route(
        "/v1/unload_lora_adapter",
        "POST",
        adapters.unload_lora_adapter,
        "free a loaded LoRA adapter; the model stays (vLLM's route)",
        body=adapters.LoraAdapterBody,
        reply=LoraAdapterReply,
    ),
    Route(
        "/healthz",
        "GET",
        health.healthz,
        "process alive",
        reply=Health,
        public=True,
        without_model=True,
    ),
    # Public, but a lazily loading Lambda loads first: "ready" must mean loaded.
    Route("/readyz", "GET", health.readyz, "model loaded and ready", reply=Health, public=True),
    Route("/openapi.json", "GET", _openapi, "this document", documented=False),
    Route(
        "/api/generate",
        "POST",
        ollama.generate,
        "Ollama-compatible generate (NDJSON)",
        body=ollama.OllamaGenerateBody,
        reply=OllamaLine,
        events=(OllamaLine,),
    ),
    Route(
        "/api/chat",
        "POST",
        ollama.chat,
        "Ollama-compatible chat (NDJSON)",
        body=ollama.OllamaChatBody,
        reply=OllamaLine,
        events=(OllamaLine,),
    ),
    Route(
        "/api/embed",
        "POST",
        embeddings.embed,
        "Ollama-compatible embeddings (an embedding model's)",
        body=embeddings.OllamaEmbedBody,
        reply=OllamaEmbed,
    ),
    Route(
        "/api/embeddings",
        "POST",
        embeddings.embeddings_legacy,
        "Ollama's older embeddings route (one prompt)",
        body=embeddings.OllamaEmbeddingsBody,
        reply=OllamaEmbedding,
    ),
    Route(
        "/api/tags",
        "GET",
        ollama.tags,
        "the served model, as Ollama lists models",
        reply=OllamaTags,
    ),
    Route(
        "/api/show",
        "POST",
        ollama.show,
        "the served model's details (Ollama)",
        body=ollama.OllamaShowBody,
        reply=OllamaShow,
    ),
    Route(
        "/api/ps",
        "GET",
        ollama.ps,
        "the loaded model (Ollama's ps; none while loading)",
        reply=OllamaPs,
    ),
    Route(
        "/api/version",
        "GET",
        ollama.version,
        "the server's version (Ollama)",
        reply=OllamaVersion,
    ),
)

#: The edge daemon's Prometheus scrape, when it passes one to the API (not in TABLE:
#: only the daemon has it; public with METRICS_PUBLIC).
METRICS_ROUTE = "/metrics"

#: Every fixed path (metric labels: any other path counts as "other").
ROUTES = frozenset(r.path for r in TABLE if r.prefix is None)
#: Routes answered without an API key.
PUBLIC_ROUTES = frozenset(r.path for r in TABLE if r.public)
#: Routes that answer without the model.
WITHOUT_MODEL = frozenset(r.path for r in TABLE if r.without_model)
#: Routes an embedding model answers.
EMBEDDING_ROUTES = frozenset({"/v1/embeddings", "/api/embed", "/api/embeddings"})


def find(path: str) -> Route | None:
    """The route of `path`: its own, else the one whose `{name}` part takes its rest."""
    exact = _BY_PATH.get(path)
    if exact is not None:
        return exact
    return next(
        (
            r
            for r in TABLE
            if r.prefix is not None and path.startswith(r.prefix) and path != r.prefix
        ),
        None,
    )


def label(path: str) -> str:
    """The metric label of a request's path: its route's path (`/v1/models/{model}` for
    any model), or "other" (unknown paths must not make unbounded label values)."""
    if path == METRICS_ROUTE:
        return path
    route = find(path)
    return route.path if route is not None else "other"


_BY_PATH = {r.path: r for r in TABLE}
assert len(_BY_PATH) == len(TABLE), "one route per path"
