"""Schemathesis against the edge daemon's own /openapi.json: no 5xx, documented error
shape, and the document says what the server accepts: schema-valid bodies are accepted
(ST202, `positive_data_acceptance`) and schema-invalid ones refused (ST201,
`negative_data_rejection`).

Exceptions, by nature, each a 400 that names its reason: a `guided_regex` or
`guided_grammar` string, a `response_format` or tool `parameters` schema can be
schema-valid and still not a valid regular expression, grammar or JSON schema for the
guidance, or one this model's tokens cannot follow; and a prompt can be too long for the
model's context, or a beam search's `num_beams` x prompt tokens too many for one pass
(no JSON Schema counts tokens); a `previous_response_id` can name a
response this process does not keep (no JSON Schema knows them); the Messages API's
last turn must be the user's (JSON Schema cannot single out an array's last item); a
`model` may name a chat model on an embedding route, or the reverse (no schema knows
which model is which). And a body over the server's size limit is a 413 whatever its
content (no JSON Schema counts bytes): 65 generated tools, one more than `tools` allows,
easily pass 64 KiB.

schemathesis 4.32's pytest plugin fails on pytest 9 (`Function` has no `_nodeid`), so
the operations' hypothesis strategies are driven directly here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
)

from tests.functional.harness import AUTH, edge_server

pytestmark = pytest.mark.slow


_GUIDES = ("guided_regex", "guided_grammar")
# The 400s a schema cannot rule out (see the module's docstring).
_SEMANTIC = re.compile(
    r"invalid guidance|the guidance cannot be followed|the prompt has \d+ tokens"
    r"|a beam search prefills num_beams x prompt tokens"
    r"|is not one of the tools|previous_response_id .* is not kept here"
    r"|the last turn must be the user's|it does not make embeddings|is an embedding model"
)


def _semantic_refusal(response: Any) -> bool:
    if response.status_code == 413:  # over the size limit (see the module's docstring)
        return True
    if response.status_code != 400:
        return False
    error = response.json()["error"]
    return bool(_SEMANTIC.search(error if isinstance(error, str) else error["message"]))


def _check(case: Any) -> None:
    response = case.call(headers=AUTH)
    body = case.body if isinstance(case.body, dict) else {}
    guided = any(body.get(name) is not None for name in _GUIDES)
    # Every answer, error or not, has the shape the document gives it (replies included:
    # core.protocol.replies).
    case.validate_response(response, checks=[response_schema_conformance], headers=AUTH)
    if not guided and not _semantic_refusal(response):
        checks = [positive_data_acceptance, negative_data_rejection]
        case.validate_response(response, checks=checks, headers=AUTH)
    # 503 is documented (busy, loading, draining); anything else from 500 up is a bug.
    assert response.status_code < 500 or response.status_code == 503, (case, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        if case.path.startswith("/api/"):  # Ollama's routes: {"error": message}
            assert isinstance(error, str) and "Traceback" not in error, error
        elif case.path.startswith("/v1/messages"):  # Anthropic's: {"type": "error", ...}
            assert response.json()["type"] == "error" and {"type", "message"} <= set(error)
            assert "Traceback" not in error["message"]
        else:
            assert {"message", "type", "code"} <= set(error), error
            assert "Traceback" not in error["message"]


def test_no_server_errors_and_errors_keep_their_shape(tiny_model_dir: Path) -> None:
    # Short generations keep a bounded number of examples quick.
    with edge_server(tiny_model_dir, {"ORTSERVE_MAX_NEW_TOKENS": "16"}) as base:
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=AUTH)
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]  # an Err would raise here: the schema is ours
        assert len(operations) == 21
        for operation in operations:
            for mode in (
                schemathesis.GenerationMode.POSITIVE,
                schemathesis.GenerationMode.NEGATIVE,
            ):
                check = settings(
                    max_examples=25,
                    deadline=None,
                    suppress_health_check=list(HealthCheck),
                    database=None,
                )(given(case=operation.as_strategy(generation_mode=mode))(_check))
                try:
                    check()
                except Unsatisfiable:  # no invalid request exists (a GET without parameters)
                    assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
