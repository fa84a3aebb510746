"""The probes' answers: GET /healthz (the process is alive) and GET /readyz (the model is
loaded and ready), both from the model's state (core.state) and the API's drain."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ortserve.core.http import Request, Response, json_response
from ortserve.core.protocol.replies import Health

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context


def healthz(api: Api, request: Request, ctx: Context) -> Response:
    """GET /healthz: always 200 while the process answers, with what /readyz says."""
    health = _health(api)
    health["alive"] = True
    return json_response(200, health)


def readyz(api: Api, request: Request, ctx: Context) -> Response:
    """GET /readyz: 200 once the model is ready, else 503 with its status and why."""
    payload = _health(api)
    ready = payload["status"] == "ready"
    # Retry-After only where waiting helps: not after a failed load.
    retry = not ready and payload["status"] != "failed"
    if not ready:
        why = payload.get("reason")
        ctx.reason = f"not ready: {payload['status']}" + (f" ({why})" if why else "")
    return json_response(200 if ready else 503, payload, [("retry-after", "5")] if retry else None)


def _health(api: Api) -> Health:
    state = api.state
    engine = state.engine
    status: Literal["loading", "ready", "restarting", "failed", "draining"] = state.status
    if engine is not None and engine.model.state != "ready":  # its process restarts
        status = "failed" if engine.model.state == "failed" else "restarting"
    status = "draining" if api.draining else status
    # mypy --strict (extra checks) wants Health's own optional keys in a ** item too.
    payload: Health = {"status": status, **state.describe()}  # type: ignore[typeddict-item]
    service = state.service
    if service is not None:
        stats = service.stats()
        payload["active"], payload["waiting"] = stats.active, stats.waiting
    return payload
