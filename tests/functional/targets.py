"""The four targets of the tiny model, each with the harness's settings (keys, limits) plus
a test's own: the in-process core, the Cloud Functions server, the edge daemon, Lambda."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.harness import API_KEY, Http, InProcess, Target, edge_server, gcf_server
from tests.functional.lambda_target import LambdaTarget, lambda_app

TARGETS = ["core", "gcf", "edge", "lambda"]


@contextmanager
def open_target(kind: str, model_dir: Path, gcf_bundle: Path, **settings: Any) -> Iterator[Target]:
    """Target `kind` serving `model_dir` (the gcf one its baked `gcf_bundle`), with
    `settings` as ServerSettings fields (the servers get them as ORTSERVE_* variables)."""
    env = {f"ORTSERVE_{name.upper()}": str(value) for name, value in settings.items()}
    if kind == "core":
        values: dict[str, Any] = {
            "model_dir": model_dir,
            "providers": "cpu",
            "api_keys": [API_KEY, "other-key"],
            "max_body_bytes": 64 * 1024,
            "max_new_tokens": 2000,
            **settings,
        }
        server = ServerSettings(**values)
        state = ModelState(server)
        state.load()
        assert state.status == "ready", state.reason
        yield InProcess(Api(state, server))
    elif kind == "gcf":
        with gcf_server(gcf_bundle, env) as base:
            yield Http("gcf", base)
    elif kind == "edge":
        with edge_server(model_dir, env) as base:
            yield Http("edge", base)
    else:
        yield LambdaTarget(lambda_app(model_dir, **settings).handle)
