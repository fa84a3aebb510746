"""Request bodies: the base every API's body extends (`Body`: OpenAI's conventions for
unknown fields and errors), the generation body's shared fields and their validators, and
`parse`, which turns bytes into a body or a 400 that names the field."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, TypeVar

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

from ortserve.core.errors import InvalidRequestError
from ortserve.core.generation import GenerationRequest, Guidance
from ortserve.core.protocol.bounds import check_grammar, check_regex, check_schema
from ortserve.core.protocol.patterns import closed_objects, ecma_schema
from ortserve.core.protocol.serving import Event, Reply, Served
from ortserve.core.settings import MAX_TOKENS_BOUND
from ortserve.core.stops import MAX_STOP_STRINGS

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
