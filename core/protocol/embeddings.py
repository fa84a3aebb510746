"""Embeddings from a dedicated embedding model (core.embedding): OpenAI's
POST /v1/embeddings, Ollama's POST /api/embed and its older POST /api/embeddings.

Every input is checked before any is embedded: the content filter's input rules (a deny
rule refuses the request, a redaction changes the text embedded), then its length in
tokens against the model's (`max_tokens`, special tokens included): over it, a 400 that
names the input, unless the request asks for truncation (Ollama's `truncate`, true by
default as Ollama has it; OpenAI's route never truncates, as OpenAI does not). A request
holds at most MAX_INPUTS inputs and MAX_REQUEST_TOKENS tokens in all (OpenAI's limits),
and at most as many embedding requests run at once as generations may
(ORTSERVE_MAX_CONCURRENCY); the others wait for a place as long as a generation would.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from ortserve.core.errors import InvalidRequestError
from ortserve.core.generation import GenerationRequest
from ortserve.core.http import json_response
from ortserve.core.protocol.bodies import Body, integral, parse
from ortserve.core.protocol.replies import (
    EmbeddingItem,
    EmbeddingList,
    OllamaEmbed,
    OllamaEmbedding,
)

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    import numpy as np

    from ortserve.core.api import Api, Context
    from ortserve.core.embedding import ServedEmbedding
    from ortserve.core.http import Request, Response

#: The most inputs one request may hold (OpenAI's limit).
MAX_INPUTS = 2048
#: The most tokens one request's inputs may hold in all (OpenAI's limit).
MAX_REQUEST_TOKENS = 300_000

_TokenId = Annotated[int, Field(ge=0, le=2**31 - 1), BeforeValidator(integral)]
#: `dimensions`: its bounds inside the type (on an optional field pydantic wrote them as
#: `ge`, which JSON Schema does not know).
Dimensions = Annotated[int, Field(ge=1, le=65536), BeforeValidator(integral)]


def _input_shape(value: Any) -> Any:
    """Refuse an input of no known shape, or an empty one, in words."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise ValueError(
            "input must be a string, a list of strings, a list of token ids, or a list of "
            "lists of token ids (none empty)"
        )
    if len(value) > MAX_INPUTS:
        raise ValueError(f"give at most {MAX_INPUTS} inputs, not {len(value)}")
    return value


class EmbeddingsBody(Body):
    """POST /v1/embeddings."""

    accepted = frozenset({"user"})

    model: str | None = Field(default=None, description="an embedding model's name")
    input: Annotated[
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[list[_TokenId], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[_TokenId], Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_INPUTS),
        ],
        BeforeValidator(_input_shape),
    ] = Field(description="a text, texts, a text's token ids, or several texts' token ids")
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="base64: each vector's float32 bytes (little-endian)"
    )
    dimensions: Dimensions | None = Field(
        default=None, description="the model's own dimensions only (it cannot shorten)"
    )


class OllamaEmbedBody(Body):
    """POST /api/embed."""

    # Ollama's options and keep_alive: a loaded embedding model stays; none applies here.
    accepted = frozenset({"options", "keep_alive"})

    model: str = Field(description="an embedding model's name")
    input: Annotated[
        str | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)],
        BeforeValidator(_input_shape),
    ]
    truncate: bool = Field(
        default=True, description="cut an input longer than the model takes (Ollama's default)"
    )
    dimensions: Dimensions | None = Field(default=None, description="the model's own only")


class OllamaEmbeddingsBody(Body):
    """POST /api/embeddings (Ollama's older route): one prompt."""

    accepted = frozenset({"options", "keep_alive"})

    model: str = Field(description="an embedding model's name")
    prompt: str = Field(description="the text (empty: an empty vector, as Ollama answers)")


def _check_dimensions(served: ServedEmbedding, dimensions: int | None) -> None:
    if dimensions is not None and dimensions != served.model.dimensions:
        raise InvalidRequestError(
            f"dimensions {dimensions}: {served.name} gives {served.model.dimensions}-dimension "
            "vectors and was not trained to be shortened",
            "dimensions",
        )


def _screened(served: ServedEmbedding, texts: Sequence[str]) -> list[str]:
    """The texts as the content filter's input rules leave them (a deny rule: its 400)."""
    screen = served.content_filter
    if screen is None:
        return list(texts)
    return [str(screen.screen(GenerationRequest(prompt=text)).request.prompt) for text in texts]


def _token_ids(
    served: ServedEmbedding, texts: Sequence[str], truncate: bool, field: str
) -> list[list[int]]:
    """Each text's token ids, checked (or cut) against the model's length."""
    for i, text in enumerate(texts):
        if not text:
            raise InvalidRequestError(f"{field}.{i}: an empty string has no embedding", field)
    rows = served.model.tokenize(_screened(served, texts))
    return [_fitted(served, row, truncate, f"{field}.{i}") for i, row in enumerate(rows)]


def _fitted(served: ServedEmbedding, row: list[int], truncate: bool, where: str) -> list[int]:
    limit = served.model.max_tokens
    if len(row) <= limit:
        return row
    if truncate:
        return served.model.truncate(row)
    raise InvalidRequestError(
        f"{where} has {len(row)} tokens; {served.name} takes at most {limit} (special tokens "
        "included): shorten it" + (", or send truncate: true" if where.startswith("input") else ""),
        where.split(".", maxsplit=1)[0],
    )


def _given_ids(served: ServedEmbedding, rows: list[list[int]]) -> list[list[int]]:
    """Token-id input (a text's tokens, as OpenAI's clients send them), checked against
    the vocabulary, with the model's special tokens around each."""
    model = served.model
    for i, row in enumerate(rows):
        bad = next((t for t in row if t >= model.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"input.{i}: token id {bad} is not in {served.name}'s vocabulary of "
                f"{model.vocab_size}",
                "input",
            )
    return [_fitted(served, model.around(row), False, f"input.{i}") for i, row in enumerate(rows)]


def _vectors(
    api: Api, request: Request, ctx: Context, served: ServedEmbedding, rows: list[list[int]]
) -> np.ndarray[Any, Any]:
    total = sum(len(r) for r in rows)
    ctx.embedded_tokens = total  # the request's record (and the metrics) count them
    if total > MAX_REQUEST_TOKENS:
        raise InvalidRequestError(
            f"the inputs hold {total} tokens; one request may hold at most {MAX_REQUEST_TOKENS}",
            "input",
        )
    with api.embedding_slot(request):
        return served.model.embed(rows)


# -- the routes' answers (core.routes) ---------------------------------------------------


def embeddings(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/embeddings (OpenAI's)."""
    body = parse(EmbeddingsBody, request.body)
    served = api.embedding(request, ctx, body.model)
    _check_dimensions(served, body.dimensions)
    given = body.input
    if isinstance(given, str):
        rows = _token_ids(served, [given], False, "input")
    elif isinstance(given[0], str):
        rows = _token_ids(served, [str(t) for t in given], False, "input")
    elif isinstance(given[0], int):
        rows = _given_ids(served, [[int(t) for t in given]])
    else:
        rows = _given_ids(served, [[int(t) for t in row] for row in given])
    vectors = _vectors(api, request, ctx, served, rows)
    data: list[EmbeddingItem] = []
    for i, vector in enumerate(vectors):
        value: list[float] | str = (
            base64.b64encode(vector.astype("<f4").tobytes()).decode()
            if body.encoding_format == "base64"
            else vector.tolist()
        )
        data.append({"object": "embedding", "embedding": value, "index": i})
    tokens = sum(len(r) for r in rows)
    reply: EmbeddingList = {
        "object": "list",
        "data": data,
        "model": served.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json_response(200, reply)


def embed(api: Api, request: Request, ctx: Context) -> Response:
    """POST /api/embed (Ollama's)."""
    start = time.perf_counter()
    body = parse(OllamaEmbedBody, request.body)
    loading = time.perf_counter()
    served = api.embedding(request, ctx, body.model, ollama=True)
    loaded = time.perf_counter() - loading
    _check_dimensions(served, body.dimensions)
    texts = [body.input] if isinstance(body.input, str) else body.input
    rows = _token_ids(served, texts, body.truncate, "input")
    vectors = _vectors(api, request, ctx, served, rows)
    reply: OllamaEmbed = {
        "model": served.name,
        "embeddings": vectors.tolist(),
        "total_duration": int((time.perf_counter() - start) * 1e9),
        "load_duration": int(loaded * 1e9),
        "prompt_eval_count": sum(len(r) for r in rows),
    }
    return json_response(200, reply)


def embeddings_legacy(api: Api, request: Request, ctx: Context) -> Response:
    """POST /api/embeddings (Ollama's older route): an empty prompt gets an empty vector,
    a long one is cut, as Ollama's own does."""
    body = parse(OllamaEmbeddingsBody, request.body)
    served = api.embedding(request, ctx, body.model, ollama=True)
    if not body.prompt:
        empty: OllamaEmbedding = {"embedding": []}
        return json_response(200, empty)
    rows = _token_ids(served, [body.prompt], True, "prompt")
    vectors = _vectors(api, request, ctx, served, rows)
    reply: OllamaEmbedding = {"embedding": vectors[0].tolist()}
    return json_response(200, reply)
