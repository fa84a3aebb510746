"""Schemathesis against the edge daemon's own /openapi.json: no 5xx, documented error shape.

schemathesis 4.32's pytest plugin fails on pytest 9 (`Function` has no `_nodeid`), so
the operations' hypothesis strategies are driven directly here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.functional.harness import AUTH, edge_server

pytestmark = pytest.mark.slow


def _check(case: Any) -> None:
    response = case.call(headers=AUTH)
    # 503 is documented (busy, loading, draining); anything else from 500 up is a bug.
    assert response.status_code < 500 or response.status_code == 503, (case, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert {"message", "type", "code"} <= set(error), error
        assert "Traceback" not in error["message"]


def test_no_server_errors_and_errors_keep_their_shape(tiny_model_dir: Path) -> None:
    # Short generations keep a bounded number of examples quick.
    with edge_server(tiny_model_dir, {"ORTSERVE_MAX_NEW_TOKENS": "16"}) as base:
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=AUTH)
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]  # an Err would raise here: the schema is ours
        assert len(operations) == 7
        for operation in operations:
            check = settings(
                max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
                database=None,
            )(given(case=operation.as_strategy())(_check))  # fmt: skip
            check()
