"""`/v1/responses` routes: create, retrieve, delete, and list a response's input items.

Served as a FastAPI router rather than through the generation lane: the lane serves the two hot generation
paths with as little in front of them as possible, while these four routes (one of them generating) gain
more from FastAPI than they lose: path parameters, methods per path, the app's error handlers and key-auth
middleware, and a place in /openapi.json (the request schema is the pydantic model's). The body is still
read and validated by the endpoint itself, so bad input gets the API's 400s, not FastAPI's 422s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, Response

from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import SSE, SSE_EVENT, json_body
from tokenrelay.errors import NotFound
from tokenrelay.openai.models import caller
from tokenrelay.openai.responses.protocol import ResponsesRequest
from tokenrelay.openai.responses.render import item_list
from tokenrelay.openai.responses.serving import create_response
from tokenrelay.openai.responses.store import ResponseStore, StoredResponse

router = APIRouter()

_CREATED = {
    200: {
        "description": "A response object, or with `stream: true` a stream of response events (SSE).",
        "content": {"application/json": {"schema": {"type": "object"}}, SSE: {"schema": SSE_EVENT}},
    },
    **error_responses(400, 404, 413, 429, 502, 503),
}
_FOUND = error_responses(404)


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest), responses=_CREATED)
async def create(request: Request) -> Response:
    return await create_response(request)


@router.get("/v1/responses/{response_id}", responses=_FOUND)
async def retrieve(response_id: str, request: Request) -> JSONResponse:
    stored = await _stored(request, response_id)
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}", responses=_FOUND)
async def delete(response_id: str, request: Request) -> JSONResponse:
    if not await _store(request).delete(response_id, caller(request).key_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items", responses=error_responses(400, 404))
async def input_items(
    response_id: str,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> JSONResponse:
    stored = await _stored(request, response_id)
    return JSONResponse(item_list(stored.input_items, limit=limit, order=order, after=after))


def _store(request: Request) -> ResponseStore:
    store: Any = request.app.state.services.responses
    return store


async def _stored(request: Request, response_id: str) -> StoredResponse:
    stored = await _store(request).get(response_id, caller(request).key_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"No response with id '{response_id}' was found.", param="response_id")
