"""The one route table (core.routes) and what is derived from it (#28 item 4)."""

from __future__ import annotations

from typing import cast

from ortserve.core import playground
from ortserve.core.api import Api, Context
from ortserve.core.http import Request, Response
from ortserve.core.openapi import openapi_document
from ortserve.core.protocol.bodies import GenerationBody
from ortserve.core.routes import (
    METRICS_ROUTE,
    PUBLIC_ROUTES,
    ROUTES,
    TABLE,
    WITHOUT_MODEL,
    error_shape,
    find,
    label,
)


class _Generations:
    """Stands in for the API: what a generation route's answer asks it to generate."""

    def __init__(self) -> None:
        self.bodies: list[type[GenerationBody]] = []

    def generate(self, body_type: type[GenerationBody], request: Request, ctx: Context) -> Response:
        self.bodies.append(body_type)
        return Response(200, [], b"")


def test_each_generation_route_parses_the_body_its_document_names() -> None:
    """A route's answer is a function and its body a type (mypy and the import check
    them): here, that each generation route's answer parses the body its route names,
    the one the OpenAPI document publishes."""
    generations = [r for r in TABLE if r.events]
    assert {r.path for r in generations} == {
        "/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/api/generate",
        "/api/chat",
    }
    for route in generations:
        api = _Generations()
        route.answer(cast(Api, api), Request("POST", route.path), Context("id"))
        assert route.method == "POST" and api.bodies == [route.body], route
    document = openapi_document(TABLE, 100)
    for route in TABLE:
        assert route.method == "POST" or route.body is None, route
        if route.body is not None and route.documented:
            schema = document["paths"][route.path]["post"]["requestBody"]["content"]
            assert schema["application/json"]["schema"]["$ref"].endswith(route.body.__name__)
            assert route.body.__name__ in document["components"]["schemas"]


def test_the_openapi_document_lists_the_documented_routes_and_their_methods() -> None:
    paths = openapi_document(TABLE, 100)["paths"]
    documented = {r.path: r for r in TABLE if r.documented}
    assert set(paths) == set(documented)
    for path, item in paths.items():
        route = documented[path]
        assert set(item) == {route.method.lower()}
        operation = item[route.method.lower()]
        assert operation["summary"] == route.summary
        assert ("security" in operation) == (not route.public)
    assert "/openapi.json" in ROUTES and "/" in ROUTES  # served, just not documented


def test_public_and_model_free_routes_are_the_table_flags() -> None:
    assert {"/healthz", "/readyz", *playground.ROUTES} == PUBLIC_ROUTES
    # A lazily loading Lambda loads before /readyz (ready means loaded), not before these.
    assert PUBLIC_ROUTES - {"/readyz"} == WITHOUT_MODEL


def test_a_path_finds_its_route_and_its_metric_label() -> None:
    assert find("/v1/chat/completions") is not None
    model = find("/v1/models/org/name:tag")  # an id may hold slashes
    assert model is not None and model.path == "/v1/models/{model}"
    assert find("/v1/model") is None and find("/nope") is None
    assert label("/generate") == "/generate"
    assert label("/v1/models/org/name") == "/v1/models/{model}"  # one label for every id
    assert label("/wp-admin/login.php") == "other"  # unknown paths: no unbounded labels
    assert label(METRICS_ROUTE) == METRICS_ROUTE
    assert METRICS_ROUTE not in ROUTES  # only the daemon has it


def test_each_api_keeps_its_own_error_shape() -> None:
    """Errors (known route or not) follow the conventions of the API a path belongs to."""
    assert error_shape("/api/nope") == "ollama"
    assert error_shape("/v1/messages") == error_shape("/v1/messages/count_tokens") == "anthropic"
    assert error_shape("/v1/messages/nope") == "anthropic"
    assert error_shape("/v1/messagesx") == error_shape("/v1/chat/completions") == "openai"
    assert error_shape("/generate") == "openai"


def test_the_document_holds_json_schema_keywords_only() -> None:
    """pydantic wrote an optional field's bounds as `ge`/`le` (no JSON Schema keyword: a
    client, and the fuzz test, saw no bound at all); they are `minimum`/`maximum`."""
    leaked: list[str] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            leaked.extend(f"{where}.{k}" for k in node.keys() & {"ge", "le", "gt", "lt"})
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}.{i}")

    schemas = openapi_document(TABLE, 100)["components"]["schemas"]
    walk(schemas, "schemas")
    assert leaked == []
    top_k = schemas["GenerateBody"]["properties"]["top_k"]["anyOf"][0]
    assert (top_k["minimum"], top_k["maximum"]) == (0, 100000)
