"""vLLM's runtime LoRA routes: `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`.

The adapters are those baked beside the model (`ortserve bake --adapter NAME=PATH`); a
request for `MODEL:NAME` loads its adapter on first use, so loading ahead only spares
that request the load, and unloading frees the adapter's memory while the model stays.
vLLM loads any path it is given; here `lora_path`, when sent, must be the baked
adapter's source (a server that read any path a client names would read any file), and an
error never repeats a path, the client's or the server's.

Both change what the server holds: on a server with keys they need an admin key
(ORTSERVE_ADMIN_KEYS), an API key gets a 403. A server without any key (one user, on
loopback) lets anyone call them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ortserve.core.errors import InvalidRequestError, PermissionDeniedError
from ortserve.core.http import Request, Response, json_response
from ortserve.core.protocol.bodies import Body, parse
from ortserve.core.protocol.replies import LoraAdapterReply

if TYPE_CHECKING:
    from ortserve.core.api import Api, Context


class LoraAdapterBody(Body):
    """POST /v1/load_lora_adapter, /v1/unload_lora_adapter (vLLM's bodies)."""

    lora_name: str = Field(
        max_length=200, description="the adapter: NAME, or MODEL:NAME as requests name it"
    )
    lora_path: str | None = Field(
        default=None,
        max_length=4096,
        description="accepted when it is the baked adapter's source (adapters are baked: "
        "ortserve bake --adapter)",
    )


def load_lora_adapter(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/load_lora_adapter: load a baked adapter now (an admin's request)."""
    _require_admin(api, ctx)
    return _act(api, request, load=True)


def unload_lora_adapter(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/unload_lora_adapter: free a loaded adapter, the model stays (an admin's
    request)."""
    _require_admin(api, ctx)
    return _act(api, request, load=False)


def _require_admin(api: Api, ctx: Context) -> None:
    """Let the request change what the server holds only with an admin key, or when the
    server has no key at all.

    Raises:
        PermissionDeniedError: The server has keys and the request carries no admin key.
    """
    settings = api.settings
    if ctx.admin or not (settings.api_keys or settings.admin_keys):
        return
    raise PermissionDeniedError(
        "loading and unloading adapters needs an admin key (ORTSERVE_ADMIN_KEYS); "
        "a request for MODEL:NAME loads its adapter without one"
    )


def _act(api: Api, request: Request, *, load: bool) -> Response:
    """Load or unload the adapter the body names.

    Raises:
        ModelNotFoundError: No such adapter.
        InvalidRequestError: A `lora_path` that is not the adapter's source.
        ConflictError: Unloading an adapter a request decodes with.
    """
    body = parse(LoraAdapterBody, request.body)
    service = api.loaded(request)
    engine = service.engine
    served = api.served(service)
    name = served.adapter_of(body.lora_name) or body.lora_name
    engine.check_adapter(name)
    if body.lora_path is not None and body.lora_path != engine.adapters[name].source:
        # Neither path is repeated: the client's may be anything, the server's is its own.
        raise InvalidRequestError(
            f"lora_path: not the folder adapter {name!r} was baked from; adapters are baked "
            f"beside the model (ortserve bake --adapter), so leave lora_path out",
            param="lora_path",
        )
    changed = engine.load_adapter(name) if load else engine.unload_adapter(name)
    reply: LoraAdapterReply = {
        "object": "lora_adapter",
        "id": f"{served.model}:{name}",
        "loaded": load,
        "changed": changed,
        "loaded_adapters": engine.loaded_adapters(),
    }
    return json_response(200, reply)
