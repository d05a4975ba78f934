"""`GET /v1/models`, `GET /v1/models/{id}` and `GET /health`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from tokenrelay.api.server import caller_of, services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.backends.base import Backend, ModelCard, OnDemand
from tokenrelay.errors import ModelNotFound

router = APIRouter()


# Beyond OpenAI's four fields (clients ignore what they do not know, as with vLLM's `max_model_len`): whether an
# engine model is in memory now, and what it takes there.
RESIDENCY_FIELDS = ("state", "pinned", "memory_bytes", "memory_estimate_bytes")


def model_body(backend: Backend) -> dict[str, Any]:
    card = backend.card
    body: dict[str, Any] = {"id": card.id, "object": "model", "created": card.created, "owned_by": card.owned_by}
    if card.context_length is not None:
        body["context_length"] = card.context_length
    if isinstance(backend, OnDemand):
        status = backend.status()
        body.update({name: status[name] for name in RESIDENCY_FIELDS if name in status})
    return body


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    backends = [b for b in services_of(request).registry.all() if caller_of(request).may_use(b.card.id)]
    if "anthropic-version" in request.headers:
        return JSONResponse(anthropic_list([b.card for b in backends]))
    return JSONResponse({"object": "list", "data": [model_body(b) for b in backends]})


def anthropic_list(cards: list[ModelCard]) -> dict[str, Any]:
    """The list in Anthropic's shape, for its clients (they send `anthropic-version`): one path serves both
    families, as Anthropic's own API and OpenAI's are both asked for `/v1/models`."""
    data = [
        {
            "type": "model",
            "id": card.id,
            "display_name": card.id,
            "created_at": datetime.fromtimestamp(card.created, UTC).isoformat().replace("+00:00", "Z"),
        }
        for card in cards
    ]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"data": data, "has_more": False, "first_id": first, "last_id": last}


@router.get("/v1/models/{model_id:path}", responses=error_responses(404))
async def get_model(model_id: str, request: Request) -> JSONResponse:
    if not caller_of(request).may_use(model_id):
        raise ModelNotFound(model_id)
    return JSONResponse(model_body(services_of(request).registry.get(model_id)))


@router.get("/health", responses={503: {"description": "Some model is not ready yet (same body)."}})
async def health(request: Request) -> JSONResponse:
    services = services_of(request)
    ready = services.ready()
    body = {"status": "ok" if ready else "starting", "models": services.model_status()}
    return JSONResponse(body, status_code=200 if ready else 503)
