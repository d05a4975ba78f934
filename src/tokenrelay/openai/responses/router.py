"""`/v1/responses` routes: create, retrieve, delete, and list a response's input items.

Served as a FastAPI router rather than through the generation lane: the lane serves the two hot generation
paths with as little in front of them as possible, while these four routes (one of them generating) gain
more from FastAPI than they lose: path parameters, methods per path, the app's error handlers and key-auth
middleware, and a place in /openapi.json (the request schema is the pydantic model's). The body is still
read and validated by the endpoint itself, so bad input gets the API's 400s, not FastAPI's 422s.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from tokenrelay.errors import InvalidRequest, NotFound
from tokenrelay.openai.models import caller
from tokenrelay.openai.responses.protocol import ResponsesRequest
from tokenrelay.openai.responses.render import item_list
from tokenrelay.openai.responses.serving import create_response
from tokenrelay.openai.responses.store import ResponseStore, StoredResponse

router = APIRouter()

# The request schema, documented from the model; its `$defs` stay beside it, so references point there.
_SCHEMA_AT = "#/paths/~1v1~1responses/post/requestBody/content/application~1json/schema/$defs/{model}"
_REQUEST_BODY = {
    "required": True,
    "content": {"application/json": {"schema": ResponsesRequest.model_json_schema(ref_template=_SCHEMA_AT)}},
}
_CREATED = {200: {"description": "A response object, or with `stream: true` a stream of response events (SSE)."}}


@router.post("/v1/responses", openapi_extra={"requestBody": _REQUEST_BODY}, responses=_CREATED)
async def create(request: Request) -> Response:
    return await create_response(request)


@router.get("/v1/responses/{response_id}")
async def retrieve(response_id: str, request: Request) -> JSONResponse:
    stored = await _stored(request, response_id)
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, request: Request) -> JSONResponse:
    if not await _store(request).delete(response_id, caller(request).key_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request) -> JSONResponse:
    query = request.query_params
    limit = _limit(query.get("limit", "20"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("`order` must be `asc` or `desc`.", param="order")
    stored = await _stored(request, response_id)
    return JSONResponse(item_list(stored.input_items, limit=limit, order=order, after=query.get("after")))


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise InvalidRequest("`limit` must be a whole number from 1 to 100.", param="limit")
    return int(text)


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
