"""`GET /v1/models`, `GET /v1/models/{id}` and `GET /health`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from tokenrelay.backends.base import Backend

router = APIRouter()


def model_body(backend: Backend) -> dict[str, Any]:
    card = backend.card
    return {"id": card.id, "object": "model", "created": card.created, "owned_by": card.owned_by}


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    backends = request.app.state.services.registry.all()
    return JSONResponse({"object": "list", "data": [model_body(b) for b in backends]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> JSONResponse:
    return JSONResponse(model_body(request.app.state.services.registry.get(model_id)))


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    services = request.app.state.services
    ready = services.ready()
    body = {"status": "ok" if ready else "starting", "models": services.model_status()}
    return JSONResponse(body, status_code=200 if ready else 503)
