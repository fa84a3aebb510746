"""The probes' answers: GET /healthz (the process is alive) and GET /readyz (the model is
loaded and ready), both from the model's state (core.state) and the API's drain.

What a probe says depends on who asks. A request with a valid key (API or admin) gets
everything: what is loaded, from where, the engine's process. Without one, on a server
that has keys, a probe says its status only (a load balancer needs no more, and an
unauthenticated caller learns nothing of the model or the machine). On a server without
any key, anyone may ask: it says what is loaded, never where from (no file paths) nor
which process runs it (no pid).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal, cast

from ortserve.core.http import Request, Response, json_response
from ortserve.core.protocol.replies import Health

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context
    from ortserve.core.registry import Models
    from ortserve.core.state import ModelState

Status = Literal["loading", "ready", "restarting", "failed", "draining"]

# Fields that hold a location on the machine or a process id, wherever they are nested:
# an adapter's and a reload's folder, the engine process's pid.
_PRIVATE_FIELDS = frozenset({"pid", "model_dir", "source"})
# An absolute path in free text (a reason): its folders; the file's own name stays, as
# it says what is wrong (`…/model.onnx.data does not match its sha256`). A URL's path
# (after `scheme:/`) is not one.
_FOLDERS = re.compile(r"(?<![\w.:/~-])/(?:[^\s/'\"`,;:()\[\]{}]+/)*")


def healthz(api: Api, request: Request, ctx: Context) -> Response:
    """GET /healthz: always 200 while the process answers, with what /readyz says."""
    health = _health(api, ctx)
    health["alive"] = True
    return json_response(200, health)


def readyz(api: Api, request: Request, ctx: Context) -> Response:
    """GET /readyz: 200 once the model is ready, else 503 with its status and why."""
    full = _health(api, ctx, shown=False)
    status = full["status"]
    ready = status == "ready"
    # Retry-After only where waiting helps: not after a failed load.
    retry = not ready and status != "failed"
    if not ready:  # the record (the server's own log) says why, whoever asked
        why = full.get("reason")
        ctx.reason = f"not ready: {status}" + (f" ({why})" if why else "")
    payload = _shown(api, ctx, full)
    return json_response(200 if ready else 503, payload, [("retry-after", "5")] if retry else None)


def _health(api: Api, ctx: Context, *, shown: bool = True) -> Health:
    """The probes' answer: everything (`shown` False), or what `ctx`'s caller may see."""
    state = api.state
    engine = state.engine
    # Unloaded (several models: its keep_alive ran out) is ready: it loads on its next
    # request.
    status: Status = "ready" if state.status == "unloaded" else state.status
    if engine is not None and engine.model.state != "ready":  # its process restarts
        status = "failed" if engine.model.state == "failed" else "restarting"
    status = "draining" if api.draining else status
    # mypy --strict (extra checks) wants Health's own optional keys in a ** item too.
    payload: Health = {"status": status, **state.describe()}  # type: ignore[typeddict-item]
    service = state.service
    if service is not None:
        stats = service.stats()
        payload["active"], payload["waiting"] = stats.active, stats.waiting
    registry = api.registry
    if registry.several:  # served beside it: each loads on its first request
        payload["memory_budget_mib"] = registry.budget_mib
        payload["memory_held_mib"] = registry.loaded_mib()
        payload["models"] = [
            {"status": s.status, **s.describe(), **_until(registry, s)} for s in registry.states
        ]
    return _shown(api, ctx, payload) if shown else payload


def _until(registry: Models, state: ModelState) -> dict[str, Any]:
    """When a loaded model unloads (`expires_at`, ISO 8601; none: for good, or in use)."""
    from datetime import UTC, datetime

    if state.status != "ready":
        return {}
    at = registry.expires_at(state)
    when = None if at is None else datetime.fromtimestamp(at, UTC).isoformat()
    return {"expires_at": when}


def _shown(api: Api, ctx: Context, payload: Health) -> Health:
    """What of `payload` the request's caller may see (the module's docstring)."""
    if ctx.keyed:
        return payload
    settings = api.settings
    if settings.api_keys or settings.admin_keys:
        return {"status": payload["status"]}
    return cast(Health, _without_locations(payload))


def _without_locations(value: Any) -> Any:
    """`value` (JSON data) without pids and paths: `_PRIVATE_FIELDS` dropped, and each
    absolute path in text cut to its file's name."""
    if isinstance(value, dict):
        return {
            key: _without_locations(item)
            for key, item in value.items()
            if key not in _PRIVATE_FIELDS
        }
    if isinstance(value, list):
        return [_without_locations(item) for item in value]
    if isinstance(value, str):
        return _FOLDERS.sub("…/", value)
    return value
