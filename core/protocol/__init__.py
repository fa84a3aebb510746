"""Request and response formats of the HTTP API, one module per API family.

Each request body (pydantic) has `to_generation()`, the one place it becomes a
`GenerationRequest`, and `reply()`, which builds its answer: the whole JSON body, or the
events of a stream. Each module also holds its routes' answers, which core.routes' table
names; `core.api` routes to them, `core.service` runs what they ask for.

- `native`: POST /generate.
- `openai`: POST /v1/completions and /v1/chat/completions, GET /v1/models.
- `responses`: POST /v1/responses (OpenAI's Responses API).
- `ollama`: POST /api/generate and /api/chat, and the model routes of Ollama's API.
- `tools`: tool calling (OpenAI's and Ollama's `tools`).
"""

from __future__ import annotations

import difflib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from ortserve.core.errors import InvalidRequestError, OrtServeError
from ortserve.core.generation import (
    HOUSE_SAMPLING,
    Completion,
    GenerationRequest,
    Guidance,
    SamplingDefaults,
    TokenLogprob,
)
from ortserve.core.http import error_payload
from ortserve.core.names import same_name
from ortserve.core.protocol.bounds import check_grammar, check_regex, check_schema
from ortserve.core.protocol.patterns import closed_objects, ecma_schema
from ortserve.core.settings import MAX_TOKENS_BOUND
from ortserve.core.stops import MAX_STOP_STRINGS

if TYPE_CHECKING:  # core.protocol.tools imports this module
    from ortserve.core.protocol.replies import SamplingCard
    from ortserve.core.protocol.tools import ToolPlan


@dataclass(frozen=True)
class Served:
    """What a request's format needs to know of the server.

    Attributes:
        model: The served model's id (the first of the names it is served under).
        digest: Its manifest's sha256 (the system fingerprint).
        created_at: When it was baked (ISO 8601).
        max_new_tokens: The most new tokens a request may ask for (MAX_NEW_TOKENS, or
            the model's context where the operator set none).
        default_new_tokens: What "as many as fit" gives a request that sets no limit
            (OpenAI's chat, Ollama's `num_predict` -1).
        context_length: The model's context in tokens (0: unknown).
        chat_template: The model's chat template (None: it has none).
        precision: Its weights' precision (int4, ...).
        size: The baked folder's size in bytes.
        token_bytes: The bytes a token id stands for (for log probabilities).
        aliases: Its other names, listed after the id (/v1/models, /api/tags).
        also_known_as: Names it answers to but that are not listed (the manifest's model
            name, where the model is served under another).
        sampling: What a request that sends no sampling fields samples with.
    """

    model: str
    digest: str
    created_at: str
    max_new_tokens: int
    default_new_tokens: int
    context_length: int = 0
    chat_template: str | None = None
    precision: str = ""
    size: int = 0
    token_bytes: Callable[[int], bytes] = field(default=lambda token_id: b"", repr=False)
    aliases: tuple[str, ...] = ()
    also_known_as: tuple[str, ...] = ()
    sampling: SamplingDefaults = HOUSE_SAMPLING
    adapters: tuple[str, ...] = ()

    def sampling_card(self) -> SamplingCard:
        """The sampling defaults, as /v1/models states them."""
        d = self.sampling
        return {
            "temperature": d.temperature,
            "top_p": d.top_p,
            "top_k": d.top_k,
            "repetition_penalty": d.repetition_penalty,
            "origin": d.origin,
        }

    @property
    def names(self) -> tuple[str, ...]:
        """Every name listed for it, its id first, then `MODEL:ADAPTER` for each LoRA
        adapter baked beside it."""
        return (self.model, *self.aliases, *(f"{self.model}:{a}" for a in self.adapters))

    def answering(self, name: str | None) -> str:
        """The `model` an answer to a request for `name` states: the model's id, or
        `MODEL:ADAPTER` for a LoRA adapter's (as vLLM answers)."""
        adapter = self.adapter_of(name)
        return self.model if adapter is None else f"{self.model}:{adapter}"

    def adapter_of(self, name: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (`MODEL:ADAPTER`; None: the model
        alone, or another model)."""
        listed = self.named(name)
        if listed is None or not self.adapters:
            return None
        head, _, tail = listed.rpartition(":")
        return tail if head == self.model and tail in self.adapters else None

    def named(self, name: str | None) -> str | None:
        """The listed name that `name` (a request's `model`) stands for: any of its names or
        unlisted names in any case, with or without Ollama's `:latest`; a missing or empty
        one means the one model, as llama-server reads it. None: another model."""
        if name is None or not name.strip():
            return self.model
        for known in (*self.names, *self.also_known_as):
            if same_name(name, known):
                return known if known in self.names else self.model
        return None

    @property
    def created(self) -> int:
        """When it was baked, in Unix seconds."""
        return int(datetime.fromisoformat(self.created_at).timestamp())


#: One JSON object a reply sends: a whole answer, or an event of a stream. Each route's
#: own shapes are TypedDicts (core.protocol.replies), published in the OpenAPI document.
Event = Mapping[str, Any]


class Reply(ABC):
    """How a route answers one generation: a JSON body, or the events of a stream."""

    #: How a stream is framed: server-sent events, or one JSON object per line.
    framing: Literal["sse", "ndjson"] = "sse"
    #: A stream ends with `data: [DONE]` (OpenAI's routes).
    done_marker = True
    #: The request's tools (chat routes that take them), which decide a `tool_calls` ending.
    tools: ToolPlan | None = None

    def error_event(self, exc: OrtServeError) -> Event:
        """The event that ends a stream an error cut (after its first byte)."""
        return error_payload(exc)

    def first_events(self) -> Sequence[Event]:
        """Events sent before the first text."""
        return []

    @abstractmethod
    def delta(self, text: str, logprobs: list[TokenLogprob] | None = None) -> Event | None:
        """The event of one text delta (with its tokens' log probabilities, when asked);
        None: nothing to send for it now (the text is held back)."""

    @abstractmethod
    def final_events(self, done: Completion) -> Sequence[Event]:
        """The events after the last text (finish reason, usage)."""

    @abstractmethod
    def body(self, done: Completion) -> Event:
        """The whole answer of a request that is not streamed."""

    def ending(self, done: Completion) -> str:
        """How the answer ended, for the request's record: the finish reason (`stop`,
        `length`, `cancelled`, `content_filter`; chat with tools: `tool_calls`)."""
        return self.tools.ending(done) if self.tools is not None else done.finish_reason


class MultiChoiceReply(Reply):
    """A reply that can carry several choices of one request (OpenAI's `n`)."""

    def first_events(self, index: int = 0) -> Sequence[Event]:
        """Events sent before choice `index`'s first text."""
        return []

    @abstractmethod
    def delta(
        self, text: str, logprobs: list[TokenLogprob] | None = None, index: int = 0
    ) -> Event | None:
        """The event of one text delta of choice `index` (None: nothing to send now)."""

    @abstractmethod
    def finish_events(self, done: Completion, index: int = 0) -> Sequence[Event]:
        """The events after choice `index`'s last text."""

    @abstractmethod
    def usage_events(self, dones: Sequence[Completion]) -> Sequence[Event]:
        """The events after every choice ended (usage, when asked for)."""

    @abstractmethod
    def bodies(self, dones: Sequence[Completion]) -> Event:
        """The whole answer with every choice."""


#: What a body that takes no images says of an image (OpenAI's `image_url` and
#: `input_image` content parts, Ollama's `images`).
NO_IMAGES = "this model takes no images"
#: Content parts that hold an image (or audio, or a file): refused with NO_IMAGES.
IMAGE_PARTS = frozenset({"image_url", "input_image", "image", "input_audio", "file", "input_file"})


class Body(BaseModel):
    """A request body: OpenAI's conventions for every API.

    An unknown field is a 400 that names the nearest known one (`max_token`: did you mean
    `max_tokens`?), as OpenAI answers; `accepted` names the fields real clients send that
    this server does not use, which are accepted and dropped. `null` for an optional field
    means its default (the openai client sends `temperature=None` when asked), and values
    are not coerced (`"max_tokens": "5"`, `"stream": "yes"` are errors: strict
    validation). The bounds are the ones the server keeps, so the OpenAPI document
    advertises only what it accepts.
    """

    # defer_build: a model's validator is built on first use, not at import: a Lambda cold
    # start that answers /generate builds one, not all of them. extra="forbid": the
    # document says `additionalProperties: false` (the check itself is `_known_fields`).
    model_config = ConfigDict(extra="forbid", defer_build=True, strict=True)

    #: Fields real clients send that this server does not use: accepted, then dropped
    #: (the OpenAPI document lists them).
    accepted: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            cls._refuse(data)
            data = {k: v for k, v in data.items() if k not in cls.accepted}
            cls._known_fields(data)  # null or not: the schema says no other field
            data = {k: v for k, v in data.items() if v is not None}
        return data

    @classmethod
    def _refuse(cls, data: dict[str, Any]) -> None:
        """Refuse, in words, what the body cannot take, before its fields are read.

        Raises:
            ValueError: What it cannot take (the field's 400).
        """

    @classmethod
    def _known_fields(cls, data: dict[str, Any]) -> None:
        known = [f.alias or name for name, f in cls.model_fields.items()]
        for key in data:
            if key not in known:
                near = difflib.get_close_matches(str(key), known, n=1)
                hint = f": did you mean {near[0]}?" if near else ""
                raise PydanticCustomError(
                    "unknown_field", "unknown field {field}", {"field": key, "hint": hint}
                )

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        for name in sorted(cls.accepted):
            target.setdefault("properties", {})[name] = {"description": "accepted; not used"}
        return schema


class TextPart(Body):
    """A message's content part: text only; an image (or audio, or file) part is refused
    in words (NO_IMAGES) rather than as a type mismatch."""

    @classmethod
    def _refuse(cls, data: dict[str, Any]) -> None:
        if data.get("type") in IMAGE_PARTS:
            raise ValueError(NO_IMAGES)


class GenerationBody(Body):
    """A body that asks for a generation."""

    stream: bool = False
    cache_salt: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="only requests of this API key with the same salt share prompt-cache "
        "entries (vLLM's `cache_salt`); left out: every request of this API key may",
    )
    _tenant: str = PrivateAttr(default="")

    @property
    def tenant(self) -> str:
        """Whose request it is (core.tenants): what it may find of earlier requests (a
        stored response) is that tenant's only."""
        return self._tenant

    def sent_by(self, tenant: str) -> None:
        """Say whose request it is (`Api.generate`, once the body is parsed)."""
        self._tenant = tenant

    @property
    def choices(self) -> int:
        """How many choices it asks for (OpenAI's `n`; 1 elsewhere)."""
        return 1

    def to_generation(self, served: Served) -> GenerationRequest:
        """The generation this body asks for.

        Raises:
            InvalidRequestError: It asks for what the server cannot give (another model,
                an incomplete response format).
        """
        raise NotImplementedError

    def reply(self, request_id: str, served: Served) -> Reply:
        """How its answer is built."""
        raise NotImplementedError

    def instant_answer(self, served: Served) -> Event | None:
        """The whole answer of a request that asks for no text (Ollama's load and unload
        requests), given at once; None: it asks for a generation.

        Raises:
            ModelNotFoundError: It names another model.
        """
        return None


def _stops(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


def _stop_rules(value: Any) -> Any:
    """Say what is wrong with stop strings in words (a union's own errors would say
    "Input should be a valid string" for a list too long or holding an empty string)."""
    if isinstance(value, list):
        if len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"give at most {MAX_STOP_STRINGS} stop strings, not {len(value)}")
        if any(item == "" for item in value):
            raise ValueError("a stop string cannot be empty")
    elif value == "":
        raise ValueError("a stop string cannot be empty")
    return value


def integral(value: Any) -> Any:
    """A JSON number with no fractional part (`5.0`) is the integer JSON Schema says it
    is; anything else goes to strict validation as it came (`"5"`, `true`, `5.5` fail)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer field: `5` or `5.0`, never `"5"` or `true`.
Int = Annotated[int, BeforeValidator(integral)]

_StopString = Annotated[str, Field(min_length=1)]
# Fields both APIs share.
#: Up to MAX_STOP_STRINGS non-empty strings (the bounds are in the schema, so that the
#: OpenAPI document says them); validated into a list.
Stop = Annotated[
    _StopString | Annotated[list[_StopString], Field(max_length=MAX_STOP_STRINGS)] | None,
    AfterValidator(_stops),
    BeforeValidator(_stop_rules),
]
# The bounds come before the validator, so that the JSON schema says them.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1), BeforeValidator(integral)]
SEED = Field(default=None, description="same seed, same output")
# The sampling fields: left out (or null), each is the model's default, as /v1/models,
# /api/show and `ortserve show` state it (the engine fills them: core.generation).
MODEL_DEFAULT = "left out: the model's default (its `sampling` in /v1/models)"
TEMPERATURE_DOC = f"0 is greedy; higher samples more freely; {MODEL_DEFAULT}"
TOP_P_DOC = f"nucleus sampling mass; {MODEL_DEFAULT}"
TOP_K_DOC = (
    "keep the k most likely tokens; 0, or k at or above the vocabulary size: keep all; "
    + MODEL_DEFAULT
)
REPETITION_PENALTY_DOC = f"above 1 makes repeating a token less likely (1: none); {MODEL_DEFAULT}"
#: A token limit (the OpenAPI document's maximum is the server's own).
TokenLimit = Annotated[int, Field(ge=1, le=MAX_TOKENS_BOUND), BeforeValidator(integral)]
UNAPPLIED = (
    "not applied by this server: leave it out (or send 0, or an empty logit_bias); "
    "repetition_penalty is the penalty it applies"
)


def _unapplied(value: Any) -> Any:
    """A field taken at its no-op value only (0, empty): anything else is refused in words,
    never silently ignored."""
    if value:
        raise ValueError(UNAPPLIED)
    return value


#: OpenAI's frequency_penalty and presence_penalty: 0 only (clients send 0 by default).
NoPenalty = Annotated[float, Field(ge=0.0, le=0.0), BeforeValidator(_unapplied)]
#: OpenAI's logit_bias: empty only.
NoBias = Annotated[dict[str, float], Field(max_length=0), BeforeValidator(_unapplied)]
#: top_k (0: every token). Its bounds inside the type: on an optional field, pydantic wrote
#: them into the schema as `ge`/`le`, which JSON Schema does not know.
TopK = Annotated[int, Field(ge=0, le=100000), BeforeValidator(integral)]
#: A count of tokens that may be 0.
TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS_BOUND), BeforeValidator(integral)]


#: What the OpenAPI document says beside a constraint: no minimum length (Service.budget
#: refuses min_tokens and ignore_eos with guidance).
NO_MINIMUM_PROPERTIES: JsonDict = {
    "min_tokens": {"anyOf": [{"const": 0}, {"type": "null"}]},
    "ignore_eos": {"anyOf": [{"const": False}, {"type": "null"}]},
}
NO_MINIMUM: JsonDict = {"properties": NO_MINIMUM_PROPERTIES}
#: The OpenAPI rule of both chat APIs (chat completions, Responses): a tool_choice needs tools.
TOOL_CHOICE_NEEDS_TOOLS: JsonDict = {
    "if": {"properties": {"tool_choice": {"not": {"type": "null"}}}, "required": ["tool_choice"]},
    "then": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
}


def when_a_call_is_forced(then: JsonDict) -> JsonDict:
    """The OpenAPI rule: with tool_choice `required` or a named function (the call is
    constrained already), `then` holds (no other constrained output beside it)."""
    forced: JsonDict = {"anyOf": [{"const": "required"}, {"type": "object"}]}
    return {
        "if": {"properties": {"tool_choice": forced}, "required": ["tool_choice"]},
        "then": then,
    }


MIN_TOKENS_DOC = (
    "extension (vLLM's): generate at least this many tokens, EOS held back until then "
    "(never more than the token limit; without one, the default limit rises to it)"
)
SPECULATIVE_DOC = (
    "extension: false decodes this request one token a forward pass, without speculative "
    "drafts (the answer is the same either way; ORTSERVE_SPECULATIVE)"
)
IGNORE_EOS_DOC = "extension (llama-server's, vLLM's): generate the whole token limit"


def _bounded(check: Callable[[Any], None]) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        check(value)  # a ValueError: the field's 400
        return value

    return validate


#: A JSON schema from a client, its cost bounded (core.protocol.bounds) as it is parsed.
JsonSchema = Annotated[dict[str, Any], AfterValidator(_bounded(check_schema))]
#: A regex from a client, its cost bounded.
Regex = Annotated[str, AfterValidator(_bounded(check_regex))]
#: A lark grammar from a client, its cost bounded.
Grammar = Annotated[str, AfterValidator(_bounded(check_grammar))]


def json_guidance(schema: dict[str, Any], field: str, closed: bool = True) -> Guidance:
    """Constrained decoding to JSON valid against `schema`, compact unless the schema's
    `x-guidance` says otherwise: flexible whitespace lets small models wander into
    endless newlines. Its `pattern`s mean what JSON Schema says (ECMA-262: `\\d` is
    [0-9]; core.protocol.patterns). `closed`: objects take only their declared
    properties where the schema does not say otherwise (`closed_objects`; OpenAI's
    `strict: true`); False (`strict: false`) keeps JSON Schema's open objects.

    Raises:
        InvalidRequestError: The schema (as a whole: tools are joined into one) breaks a
            bound of core.protocol.bounds; `field` is where the client gave it.
    """
    try:
        check_schema(schema)  # before any walk: a deep schema would overflow the stack
    except ValueError as exc:
        raise InvalidRequestError(f"{field}: {exc}", field) from None
    schema = ecma_schema(closed_objects(schema) if closed else schema)
    return Guidance(
        "json_schema", json.dumps({"x-guidance": {"whitespace_flexible": False}, **schema})
    )


_B = TypeVar("_B", bound=Body)


_NAME_SHOWN = 64  # characters of an unknown field's name an error repeats


def parse(model: type[_B], body: bytes) -> _B:
    """Validate a raw request body as `model`.

    Raises:
        InvalidRequestError: Not JSON, not an object, or invalid; `param` names the field.
    """
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
        # A validator's own words (a bound, a rule, an unknown field) say more than a
        # union's other members' "Input should be ...".
        words = ("value_error", "unknown_field")
        first = next((e for e in errors if e["type"] in words), errors[0])
        # A union reports one error per member, each under the member's tag
        # (`messages.0.content.str`): name the field they share instead.
        loc = list(first["loc"])
        if first["type"] == "unknown_field":
            context = first.get("ctx") or {}
            path = _holder(data, loc, context["field"]) or _in_body(data, loc)
            # The name as sent, but never more of it than a name needs: the 400 (and the
            # request's log line) would repeat a megabyte-long key.
            name = str(context["field"])
            shown = name if len(name) <= _NAME_SHOWN else f"{name[:_NAME_SHOWN]}…"
            where = ".".join(str(p) for p in [*path, shown])
            raise InvalidRequestError(f"unknown field {where}{context['hint']}", where) from None
        shared = [e["loc"] for e in errors if e["loc"][: len(loc) - 1] == tuple(loc[:-1])]
        if len(shared) > 1:
            loc = loc[:-1]
        where = ".".join(str(p) for p in _in_body(data, loc))
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidRequestError(
            f"{where}: {message}" if where else message, where or None
        ) from None


def _holder(data: Any, loc: list[int | str], key: str) -> list[int | str] | None:
    """The path in the body, along `loc` (its union tags left out), of the object that
    holds `key`; None: none does."""
    if not loc:
        return [] if isinstance(data, dict) and key in data else None
    part, rest = loc[0], loc[1:]
    keyed = isinstance(data, dict) and part in data
    indexed = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
    if keyed or indexed:
        inner = _holder(data[part], rest, key)
        if inner is not None:
            return [part, *inner]
    return _holder(data, rest, key)  # a union member's tag


def _in_body(data: Any, loc: list[int | str]) -> list[int | str]:
    """An error's location as the body's own keys and indexes: a tagged union's member
    tag inside it (`response_format.json_schema.json_schema.schema`) is not one of them
    and is left out; the last part stays (a missing field's name)."""
    path: list[int | str] = []
    node = data
    for i, part in enumerate(loc):
        keyed = isinstance(node, dict) and part in node
        indexed = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if keyed or indexed:
            node = node[part]
        elif i < len(loc) - 1:
            continue  # a union member's tag
        path.append(part)
    return path


def public_finish(done: Completion) -> Literal["stop", "length", "content_filter"]:
    """How an answer ended, as OpenAI's `finish_reason` and Ollama's `done_reason` say it:
    `stop` (an end token or stop string), `content_filter` (the filter ended it; OpenAI's
    own reason), else `length` (the token limit, or a cancelled generation's cut)."""
    if done.finish_reason in ("stop", "content_filter"):
        return done.finish_reason
    return "length"
