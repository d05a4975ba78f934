"""`/admin/models`: which engine models are loaded, and loading or unloading one by hand."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse

from tokenrelay.admin.guard import require_admin
from tokenrelay.api.server import services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.backends.resident import ResidentModel
from tokenrelay.errors import InvalidRequest

router = APIRouter(prefix="/admin/models", dependencies=[Depends(require_admin)], responses=error_responses(401, 403))


def _resident(request: Request, model_id: str) -> ResidentModel:
    backend = services_of(request).registry.get(model_id)
    if not isinstance(backend, ResidentModel):
        message = f"The model `{model_id}` is not an engine model served alone: it is not loaded or unloaded by hand."
        raise InvalidRequest(message, param="model", code="not_loadable")
    return backend


# What an operator reads of an engine model's residency (its `status()` holds these and the engine's own state).
FIELDS = ("state", "pinned", "context_length", "memory_bytes", "memory_estimate_bytes", "in_flight", "loads", "unloads")


def _body(model: ResidentModel) -> dict[str, Any]:
    status = model.status()
    return {"id": model.card.id, "object": "model"} | {name: status.get(name) for name in FIELDS}


@router.get("")
async def list_models(request: Request) -> JSONResponse:
    models = [b for b in services_of(request).registry.all() if isinstance(b, ResidentModel)]
    return JSONResponse({"object": "list", "data": [_body(model) for model in models]})


@router.post("/{model_id:path}/load", responses=error_responses(400, 404, 503))
async def load_model(model_id: str, request: Request) -> JSONResponse:
    model = _resident(request, model_id)
    await model.load()
    return JSONResponse(_body(model))


@router.post("/{model_id:path}/unload", responses=error_responses(400, 404, 409))
async def unload_model(model_id: str, request: Request) -> JSONResponse:
    """Unloads at once; a model with requests in flight is refused (409): those requests keep it loaded."""
    model = _resident(request, model_id)
    if model.in_flight:
        message = f"The model `{model_id}` has {model.in_flight} requests in flight; unload it when they are done."
        raise InvalidRequest(message, code="model_busy", status=409)
    await model.unload("asked by the operator")
    return JSONResponse(_body(model))
