"""The OpenAPI document of the HTTP API, generated from the route table (core.routes) and
the pydantic request models."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic.json_schema import models_json_schema

from ortserve.core.protocol.replies import REPLIES, Health

if TYPE_CHECKING:  # core.routes imports this module (its /openapi.json answer)
    from ortserve.core.routes import Route

_REF = "#/components/schemas/{model}"
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}
_OLLAMA_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}


def _ref(shape: type | str) -> dict[str, str]:
    """A reference to a component schema: a body's or a reply's (by its class), or one
    named here (errors)."""
    name = shape if isinstance(shape, str) else shape.__name__
    return {"$ref": _REF.format(model=name)}


def _answer(route: Route) -> dict[str, Any]:
    """A 200's content: the route's JSON reply and, for a generation, its stream (SSE, or
    Ollama's NDJSON), whose events' shapes `x-events` names (OpenAPI 3.1 cannot)."""
    assert route.reply is not None  # every documented route says what it answers
    content: dict[str, Any] = {"application/json": {"schema": _ref(route.reply)}}
    if route.events:
        stream = "application/x-ndjson" if route.ollama else "text/event-stream"
        content[stream] = {"x-events": [_ref(shape) for shape in route.events]}
    return {"description": route.summary, "content": content}


def _error(route: Route) -> dict[str, Any]:
    shapes = {"ollama": "OllamaError", "anthropic": "AnthropicError"}
    name = shapes.get(route.error_shape, "Error")
    return {"application/json": {"schema": _ref(name)}}


def _post(route: Route) -> dict[str, Any]:
    assert route.body is not None  # every POST route takes a JSON body
    error = _error(route)
    return {
        "post": {
            "summary": route.summary,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(route.body)}},
            },
            "responses": {
                "200": _answer(route),
                **{
                    code: {"description": text, "content": error}
                    for code, text in (
                        ("400", "invalid request"),
                        ("401", "missing or invalid API key"),
                        ("403", "an admin key's route (loading or unloading adapters)"),
                        ("404", "unknown route or model"),
                        ("405", "method not allowed"),
                        ("409", "an adapter in use (unloading it)"),
                        ("413", "body too large"),
                        ("503", "busy, loading or shutting down (see Retry-After)"),
                        ("504", "generation timed out"),
                    )
                },
            },
            "security": [{"bearer": []}, {"apiKey": []}, {}],
        }
    }


def _get(route: Route) -> dict[str, Any]:
    # A health route says why it is not ready in its own shape; the others, as errors.
    not_ready = route.reply is Health
    unavailable = {"application/json": {"schema": _ref(Health)}} if not_ready else _error(route)
    operation: dict[str, Any] = {
        "summary": route.summary,
        "responses": {
            "200": _answer(route),
            "503": {"description": "not ready", "content": unavailable},
        },
    }
    if not route.public:
        operation["security"] = [{"bearer": []}, {"apiKey": []}, {}]
    return {"get": operation}


# The token-limit fields, whose bound is the server's MAX_NEW_TOKENS.
_TOKEN_LIMITS = {
    "GenerateBody": ("max_new_tokens", "min_tokens"),
    "CompletionBody": ("max_tokens", "min_tokens"),
    "ChatBody": ("max_tokens", "max_completion_tokens", "min_tokens"),
    "ResponsesBody": ("max_output_tokens",),
    "MessagesBody": ("max_tokens",),
    "OllamaOptions": ("num_predict",),
}


def _bound(schema: dict[str, Any], maximum: int) -> None:
    """Set `maximum` on an integer schema, or on the integer member of an anyOf."""
    for member in [schema, *schema.get("anyOf", [])]:
        if member.get("type") == "integer":
            member["maximum"] = maximum


_NULL = {"type": "null"}
_ANNOTATIONS = ("title", "description", "default")


def _nullable_optionals(schema: dict[str, Any]) -> None:
    """Say in the schema what the bodies do: `null` for an optional field means its
    default (OpenAI's convention), so every optional property also accepts null."""
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        if name in required or prop.get("type") == "null":
            continue
        members = prop.get("anyOf")
        if members is None:
            kept = {k: v for k, v in prop.items() if k in _ANNOTATIONS}
            inner = {k: v for k, v in prop.items() if k not in _ANNOTATIONS}
            prop.clear()
            prop.update(kept, anyOf=[inner, _NULL])
        elif _NULL not in members:
            members.append(_NULL)


def _operation(route: Route) -> dict[str, Any]:
    """The OpenAPI path item of one route of the table."""
    if route.method == "POST":
        return _post(route)
    operation = _get(route)
    if route.prefix is not None:  # /v1/models/{model}
        name = route.path[len(route.prefix) :].strip("{}")
        operation["get"]["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        ]
        operation["get"]["responses"]["404"] = {"description": f"no such {name}"}
    return operation


def _reply_schemas() -> dict[str, Any]:
    """The JSON schemas of every reply shape (core.protocol.replies), by name."""
    from pydantic import TypeAdapter

    schemas: dict[str, Any] = {}
    for shape in REPLIES:
        schema = TypeAdapter(shape).json_schema(ref_template=_REF, mode="serialization")
        schemas.update(schema.pop("$defs", {}))
        schemas[shape.__name__] = schema
    return schemas


@cache
def openapi_document(routes: tuple[Route, ...], max_new_tokens: int) -> dict[str, Any]:
    """The OpenAPI 3.1 document for `routes` (core.routes' TABLE), with this server's
    token limit (built once per table and limit)."""
    bodies = dict.fromkeys(r.body for r in routes if r.body is not None and r.documented)
    _, schemas = models_json_schema([(m, "validation") for m in bodies], ref_template=_REF)
    components = dict(schemas.get("$defs", {}))
    for model, fields in _TOKEN_LIMITS.items():
        for name in fields:
            _bound(components[model]["properties"][name], max_new_tokens)
    for component in components.values():
        _nullable_optionals(component)
    components["Error"] = _ERROR
    components["OllamaError"] = _OLLAMA_ERROR
    replies = _reply_schemas()
    assert not replies.keys() & components.keys(), "a reply is named like a request part"
    components.update(replies)
    return {
        "openapi": "3.1.0",
        "info": {"title": "ortserve", "version": "1"},
        "paths": {r.path: _operation(r) for r in routes if r.documented},
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }
