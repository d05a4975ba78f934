"""`/v1/responses` routes: create, retrieve, delete, and list a response's input items.

The body of a new response is read and validated by the endpoint itself, so bad input gets the API's 400s,
not FastAPI's 422s; FastAPI is only told its schema.

A response that a node made and keeps (a native relay) is read, listed and deleted at that node: the gateway
checks that the caller's key made it, then forwards the call (the node sees only the gateway's own key).
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, Response

from tokenrelay.api.server import caller_of, services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import answers, json_body
from tokenrelay.backends.base import NodeBacked
from tokenrelay.calls.request_ids import request_id_of
from tokenrelay.errors import NotFound, UpstreamError
from tokenrelay.openai.responses.protocol import ResponsesRequest
from tokenrelay.openai.responses.render import item_list
from tokenrelay.openai.responses.serving import create_response
from tokenrelay.openai.serving import GENERATION_ERRORS
from tokenrelay.store.responses import ResponseStore, StoredResponse

router = APIRouter()

_CREATED = answers("A response object, or with `stream: true` a stream of response events (SSE).", GENERATION_ERRORS)
_FOUND = error_responses(404)


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest), responses=_CREATED)
async def create(request: Request) -> Response:
    return await create_response(request)


@router.get("/v1/responses/{response_id}", responses=_FOUND)
async def retrieve(response_id: str, request: Request) -> Response:
    stored = await _stored(request, response_id)
    if stored.node is not None:
        return await _forwarded(request, stored, "GET", _path(response_id))
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}", responses=_FOUND)
async def delete(response_id: str, request: Request) -> Response:
    key_id = caller_of(request).key_id
    stored = await _stored(request, response_id)
    answer = None
    if stored.node is not None:
        try:
            answer = await _forwarded(request, stored, "DELETE", _path(response_id))
        except NotFound:  # gone at the node already (expired there): forget it here too
            await _store(request).delete(response_id, key_id)
            raise
        if answer.status_code >= 300:  # the node kept it: so does the gateway
            return answer
    if not await _store(request).delete(response_id, key_id):
        raise _not_found(response_id)
    return answer if answer is not None else JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items", responses=error_responses(400, 404))
async def input_items(
    response_id: str,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    stored = await _stored(request, response_id)
    if stored.node is not None:
        query = urlencode({"limit": limit, "order": order} | ({"after": after} if after is not None else {}))
        return await _forwarded(request, stored, "GET", f"{_path(response_id)}/input_items?{query}")
    return JSONResponse(item_list(stored.input_items, limit=limit, order=order, after=after))


def _store(request: Request) -> ResponseStore:
    return services_of(request).responses


async def _stored(request: Request, response_id: str) -> StoredResponse:
    stored = await _store(request).get(response_id, caller_of(request).key_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


async def _forwarded(request: Request, stored: StoredResponse, method: str, path: str) -> Response:
    """The answer of the node that keeps `stored`: as the node wrote it, but a 404 in the gateway's words and
    a node's server error as the gateway's 502."""
    backend = await services_of(request).backend(stored.model)
    if not isinstance(backend, NodeBacked):
        raise UpstreamError(f"The model `{stored.model}` that made this response is no longer served by nodes.")
    status, content = await backend.fetch(stored.node or "", method, path, request_id_of(request.scope))
    if status == 404:
        raise _not_found(stored.response["id"])
    if status >= 500:
        raise UpstreamError(f"The upstream node that keeps this response answered {status}.")
    return Response(content, status_code=status, media_type="application/json")


def _path(response_id: str) -> str:
    return f"/responses/{quote(response_id, safe='')}"


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"No response with id '{response_id}' was found.", param="response_id")
