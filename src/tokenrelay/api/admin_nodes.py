"""`/admin/nodes`: upstream nodes added and removed at run time (a node registers itself with an admin key).

Registrations live in this process's memory: each replica is told on its own, and a restart forgets them
(nodes re-register, as they do after their own restarts). Re-registering a name replaces that node.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field
from starlette.responses import JSONResponse, Response

from tokenrelay.adminauth import require_admin
from tokenrelay.api.parsing import validate_json
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.config import UpstreamSettings
from tokenrelay.errors import NotFound

router = APIRouter(prefix="/admin/nodes", dependencies=[Depends(require_admin)])


class NodeRegistration(UpstreamSettings):
    """An upstream entry of the config file, plus the model id clients use for it."""

    model_id: str = Field(min_length=1)

    def upstream(self) -> UpstreamSettings:
        return UpstreamSettings.model_validate(self.model_dump(exclude={"model_id"}))


def _routed(request: Request) -> list[RoutedBackend]:
    return [b for b in request.app.state.services.registry.all() if isinstance(b, RoutedBackend)]


def _listing(backend: RoutedBackend, names: list[str] | None = None) -> list[dict[str, Any]]:
    return [
        {"model_id": backend.card.id} | node.status()
        for name, node in backend.nodes.items()
        if names is None or name in names
    ]


@router.get("")
async def list_nodes(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [row for b in _routed(request) for row in _listing(b)]})


@router.post("")
async def register_node(request: Request) -> JSONResponse:
    registration = validate_json(NodeRegistration, await request.body())
    backend = await request.app.state.services.routed_backend(registration.model_id)
    upstream = registration.upstream()
    replaced = upstream.label in backend.nodes
    await backend.add_node(upstream)
    return JSONResponse(_listing(backend, [upstream.label])[0], status_code=200 if replaced else 201)


@router.delete("/{name}")
async def remove_node(name: str, request: Request, model_id: str | None = None) -> Response:
    """Remove the node `name` from every model it serves, or from `model_id` only."""
    services = request.app.state.services
    removed = 0
    for backend in _routed(request):
        if model_id not in (None, backend.card.id) or not await backend.remove_node(name):
            continue
        removed += 1
        if backend.dynamic and not backend.nodes:
            services.registry.remove(backend.card.id)
            await backend.close()
    if not removed:
        raise NotFound(f"No node named {name!r} is registered" + (f" for model {model_id!r}." if model_id else "."))
    return Response(status_code=204)
