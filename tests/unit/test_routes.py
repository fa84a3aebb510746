"""The one route table (core.routes) and what is derived from it (#28 item 4)."""

from __future__ import annotations

from ortserve.core import playground
from ortserve.core.api import _BODIES, Api
from ortserve.core.openapi import openapi_document
from ortserve.core.routes import (
    METRICS_ROUTE,
    PUBLIC_ROUTES,
    ROUTES,
    TABLE,
    WITHOUT_MODEL,
    find,
    label,
)


def test_every_route_is_answered_by_the_api() -> None:
    for route in TABLE:
        if route.answer == "_generate":
            assert route.method == "POST" and route.body in _BODIES, route
        else:
            assert callable(getattr(Api, route.answer, None)), route
        assert route.method == "POST" or route.body is None, route


def test_the_openapi_document_lists_the_documented_routes_and_their_methods() -> None:
    paths = openapi_document(100)["paths"]
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
