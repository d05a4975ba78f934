"""`/v1/files` routes: upload (multipart), list, retrieve, content, delete; a file is its key's alone."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.datastructures import UploadFile
from starlette.responses import JSONResponse, Response

from tokenrelay.api.ignored import ignored_header
from tokenrelay.api.server import caller_of, services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.errors import MISSING_REQUIRED_PARAMETER, InvalidRequest, NotFound
from tokenrelay.store.files import FileStore, StoredFile

log = logging.getLogger(__name__)
router = APIRouter()

# The one purpose a client uploads here; `batch_output` files are written by batches.
UPLOAD_PURPOSES = ("batch",)
# The form's fields besides its file: `purpose` and a few a client may add (Starlette's parser stops past them).
MAX_FIELDS = 8
USED = frozenset({"file", "purpose"})
_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)},
                    },
                    # Other fields (e.g. `expires_after[seconds]`) are accepted and named in the answer's
                    # x-tokenrelay-ignored-fields header; the form holds one file and at most MAX_FIELDS fields.
                    "additionalProperties": {"type": "string"},
                    "maxProperties": 1 + MAX_FIELDS,
                    "description": "Fields besides `file` and `purpose` are accepted without effect and named in "
                    "the `x-tokenrelay-ignored-fields` response header.",
                }
            }
        },
    }
}


@router.post("/v1/files", openapi_extra=_UPLOAD_BODY, responses=error_responses(400, 413))
async def upload(request: Request) -> JSONResponse:
    limit = services_of(request).settings.batches.max_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + (64 << 10):  # the form's own bytes
        raise _too_large(limit)
    async with request.form(max_files=1, max_fields=MAX_FIELDS) as form:
        ignored = [name for name in form if name not in USED]
        purpose, upload = form.get("purpose"), form.get("file")
        if not isinstance(purpose, str) or not purpose:
            raise InvalidRequest(
                "Missing required parameter: 'purpose'.", param="purpose", code=MISSING_REQUIRED_PARAMETER
            )
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequest(
                f"Invalid value for 'purpose': {purpose!r}. This server accepts 'batch' files only.", param="purpose"
            )
        if not isinstance(upload, UploadFile):
            raise _missing("file")
        content = await upload.read(limit + 1)
        filename = upload.filename or "upload.jsonl"
    if len(content) > limit:
        raise _too_large(limit)
    stored = await _store(request).create(caller_of(request), filename, purpose, content)
    response = JSONResponse(stored.body())
    if ignored:
        log.info("file upload: fields accepted without effect: %s", ", ".join(ignored))
        response.raw_headers.append(ignored_header(ignored))
    return response


@router.get("/v1/files", responses=error_responses(400))
async def list_files(
    request: Request,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> JSONResponse:
    found = await _store(request).list(caller_of(request), purpose, limit + 1, after, order)
    return JSONResponse(page([f.body() for f in found], limit))


@router.get("/v1/files/{file_id}", responses=error_responses(404))
async def retrieve(file_id: str, request: Request) -> JSONResponse:
    return JSONResponse((await _found(request, file_id)).body())


@router.get("/v1/files/{file_id}/content", responses=error_responses(404))
async def content(file_id: str, request: Request) -> Response:
    data = await _store(request).content(caller_of(request), file_id)
    if data is None:
        raise not_found(file_id)
    return Response(data, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", responses=error_responses(404))
async def delete(file_id: str, request: Request) -> JSONResponse:
    if not await _store(request).delete(caller_of(request), file_id):
        raise not_found(file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


def page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A list object of at most `limit` items, from `limit + 1` read (the extra one says there are more)."""
    shown = items[:limit]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(items) > limit,
    }


async def _found(request: Request, file_id: str) -> StoredFile:
    stored = await _store(request).get(caller_of(request), file_id)
    if stored is None:
        raise not_found(file_id)
    return stored


def _store(request: Request) -> FileStore:
    return services_of(request).files


def not_found(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", param="id")


def _too_large(limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"The file is larger than this server accepts ({limit} bytes).", code="file_too_large", status=413
    )


def _missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code=MISSING_REQUIRED_PARAMETER)
