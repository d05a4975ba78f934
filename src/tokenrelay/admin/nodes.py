"""`/admin/nodes`: upstream nodes added and removed at run time (a node registers itself with an admin key).

Registrations are kept in the database, so every replica and worker serves them and they survive a restart:
the process that takes a registration or removal applies it at once, the others when a request names a model
they do not know yet or at their next sync (`routing.registry_sync_seconds`, `registrations.sync`).
A node's `api_key` is stored encrypted under a key derived from the server's admin key. Re-registering a name
replaces that node. Nodes of the config file are not registrations: they change with the file only.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field
from starlette.responses import JSONResponse, Response

from tokenrelay.admin.guard import require_admin
from tokenrelay.api.parsing import validate_json
from tokenrelay.api.server import services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import json_body
from tokenrelay.backends.base import NodeBacked
from tokenrelay.config import UpstreamSettings
from tokenrelay.errors import InvalidRequest, NotFound

router = APIRouter(prefix="/admin/nodes", dependencies=[Depends(require_admin)], responses=error_responses(401, 403))


class NodeRegistration(UpstreamSettings):
    """An upstream entry of the config file, plus the model id clients use for it."""

    model_id: str = Field(min_length=1, max_length=256)

    def upstream(self) -> UpstreamSettings:
        return UpstreamSettings.model_validate(self.model_dump(exclude={"model_id"}))


def _routed(request: Request) -> list[NodeBacked]:
    return [b for b in services_of(request).registry.all() if isinstance(b, NodeBacked)]


def _listing(backend: NodeBacked, names: list[str] | None = None) -> list[dict[str, Any]]:
    return [
        {"model_id": backend.card.id} | node.status()
        for name, node in backend.nodes.items()
        if names is None or name in names
    ]


def _serves(request: Request, model_id: str, name: str) -> bool:
    backend = services_of(request).registry.find(model_id)
    return isinstance(backend, NodeBacked) and name in backend.nodes


@router.get("")
async def list_nodes(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [row for b in _routed(request) for row in _listing(b)]})


@router.post(
    "",
    status_code=201,
    openapi_extra=json_body(NodeRegistration),
    responses={200: {"description": "A node of that name was replaced."}, **error_responses(400)},
)
async def register_node(request: Request) -> JSONResponse:
    registration = validate_json(NodeRegistration, await request.body())
    upstream, model_id = registration.upstream(), registration.model_id
    nodes = services_of(request).nodes
    if upstream.api_key is not None and not nodes.store.seal.available:
        raise InvalidRequest(
            "A node with an `api_key` needs the server's admin key (TOKENRELAY_ADMIN_KEY) configured: "
            "the key is stored encrypted under it.",
            param="api_key",
        )
    if len(upstream.label) > 256:
        raise InvalidRequest("A node's name may have at most 256 characters.", param="name")
    replaced = _serves(request, model_id, upstream.label)
    replaced = await nodes.store.put(model_id, upstream) or replaced
    await nodes.refresh()
    backend = services_of(request).registry.get(model_id)
    assert isinstance(backend, NodeBacked)  # the refresh above made it one if it was not
    return JSONResponse(_listing(backend, [upstream.label])[0], status_code=200 if replaced else 201)


@router.delete("/{name}", status_code=204, responses=error_responses(404))
async def remove_node(name: str, request: Request, model_id: str | None = None) -> Response:
    """Remove the registered node `name` from every model it serves, or from `model_id` only."""
    nodes = services_of(request).nodes
    if not await nodes.store.delete(name, model_id):
        where = f" for model {model_id!r}" if model_id else ""
        config_file = "nodes of the config file go only when removed from it"
        raise NotFound(f"No node named {name!r} is registered{where} ({config_file}).")
    await nodes.refresh()
    return Response(status_code=204)
