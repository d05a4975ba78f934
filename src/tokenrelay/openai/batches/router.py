"""`/v1/batches` routes: create, retrieve, cancel, list. A batch is its key's alone (the admin key sees all)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import Field
from starlette.responses import JSONResponse

from tokenrelay.api.parsing import read_body, validate_json
from tokenrelay.api.server import Waking, caller_of, services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import json_body
from tokenrelay.errors import InvalidRequest, NotFound
from tokenrelay.openai.batches.render import batch_body
from tokenrelay.openai.files.router import not_found as file_not_found
from tokenrelay.openai.files.router import page
from tokenrelay.protocol.common import WireModel
from tokenrelay.store.batches import BatchStore

router = APIRouter()


class BatchCreate(WireModel):
    """The body of `POST /v1/batches`; `endpoint` is one of `lines.ENDPOINTS`."""

    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
    completion_window: Literal["24h"]
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(default=None, max_length=16)


@router.post("/v1/batches", openapi_extra=json_body(BatchCreate), responses=error_responses(400, 404))
async def create(request: Request) -> JSONResponse:
    wanted = validate_json(BatchCreate, await read_body(request.receive))
    principal = caller_of(request)
    services = services_of(request)
    input_file = await services.files.get(principal, wanted.input_file_id)
    if input_file is None:
        raise file_not_found(wanted.input_file_id)
    if input_file.purpose != "batch":
        message = f"The file {wanted.input_file_id} has purpose {input_file.purpose!r}; a batch's input needs 'batch'."
        raise InvalidRequest(message, param="input_file_id")
    window = services.settings.batches.window_seconds
    row = await _store(request).create(principal, wanted.endpoint, wanted.input_file_id, wanted.metadata, window)
    _runner(request).wake()
    return JSONResponse(batch_body(row))


@router.get("/v1/batches", responses=error_responses(400))
async def list_batches(
    request: Request, after: str | None = None, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> JSONResponse:
    found = await _store(request).page(caller_of(request), after, limit + 1)
    return JSONResponse(page([batch_body(row) for row in found], limit))


@router.get("/v1/batches/{batch_id}", responses=error_responses(404))
async def retrieve(batch_id: str, request: Request) -> JSONResponse:
    row = await _store(request).get(caller_of(request), batch_id)
    if row is None:
        raise _not_found(batch_id)
    return JSONResponse(batch_body(row))


@router.post("/v1/batches/{batch_id}/cancel", responses=error_responses(404, 409))
async def cancel(batch_id: str, request: Request) -> JSONResponse:
    row = await _store(request).cancel(caller_of(request), batch_id)
    if row is None:
        raise _not_found(batch_id)
    if row["status"] not in ("cancelling", "cancelled"):
        message = f"Cannot cancel a batch whose status is {row['status']!r}."
        raise InvalidRequest(message, code="batch_not_cancellable", status=409)
    _runner(request).wake()
    return JSONResponse(batch_body(row))


def _store(request: Request) -> BatchStore:
    return services_of(request).batches


def _runner(request: Request) -> Waking:
    return services_of(request).batch_runner


def _not_found(batch_id: str) -> NotFound:
    return NotFound(f"No such Batch object: {batch_id}", param="batch_id")
