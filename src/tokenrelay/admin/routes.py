"""Operator API: `/admin/keys` (create, list, show, revoke, rotate), `/admin/usage` and `/admin/usage/series`,
for admin keys only."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import JSONResponse

from tokenrelay.admin.guard import require_admin
from tokenrelay.api.parsing import validate_json
from tokenrelay.api.server import services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import json_body
from tokenrelay.auth.keyspec import KeyCreate
from tokenrelay.errors import InvalidRequest
from tokenrelay.store.timeutil import parse_instant, utcnow
from tokenrelay.usage.report import GROUPINGS, UsageQuery, usage_report
from tokenrelay.usage.series import DEFAULT_LIMIT, MAX_LIMIT, SERIES_GROUPINGS, SeriesQuery, usage_series
from tokenrelay.usage.window import Bucket, window

router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)], responses=error_responses(401, 403))

# A date (2026-01-31) or an ISO 8601 date-time (naive means UTC).
Instant = Annotated[
    str | None,
    Query(
        json_schema_extra={"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]}
    ),
]


@router.post("/keys", status_code=201, openapi_extra=json_body(KeyCreate), responses=error_responses(400, 409))
async def create_key(request: Request) -> JSONResponse:
    wanted = validate_json(KeyCreate, await request.body())
    record, secret = await services_of(request).keys.create(wanted.spec())
    # The secret is in this response and nowhere else, ever.
    return JSONResponse({**record.to_json(), "key": secret}, status_code=201)


@router.get("/keys")
async def list_keys(request: Request) -> JSONResponse:
    records = await services_of(request).keys.list()
    return JSONResponse({"object": "list", "data": [r.to_json() for r in records]})


@router.get("/keys/{ref}", responses=error_responses(404))
async def get_key(ref: str, request: Request) -> JSONResponse:
    return JSONResponse((await services_of(request).keys.get(ref)).to_json())


@router.delete("/keys/{ref}", responses=error_responses(404))
async def revoke_key(ref: str, request: Request) -> JSONResponse:
    return JSONResponse((await services_of(request).keys.revoke(ref)).to_json())


@router.post("/keys/{ref}/rotate", responses=error_responses(404, 409))
async def rotate_key(ref: str, request: Request) -> JSONResponse:
    record, secret = await services_of(request).keys.rotate(ref)
    return JSONResponse({**record.to_json(), "key": secret})


def _instant(text: str | None, param: str) -> datetime | None:
    try:
        return parse_instant(text) if text is not None else None
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=param) from None


@router.get("/usage", responses=error_responses(400))
async def get_usage(
    request: Request,
    key: str | None = None,
    model: str | None = None,
    since: Instant = None,
    by: Literal[GROUPINGS] | None = None,  # type: ignore[valid-type]
) -> JSONResponse:
    start = _instant(since, "since")
    server = services_of(request)
    await server.ledger.flush()  # this replica's queued rows count too
    query = UsageQuery(key=key, model=model, since=start, by=by)
    report = await usage_report(server.database, query, server.settings.currency)
    return JSONResponse(report)


@router.get("/usage/series", responses=error_responses(400))
async def get_usage_series(
    request: Request,
    bucket: Bucket = "hour",
    by: Literal[SERIES_GROUPINGS] | None = None,  # type: ignore[valid-type]
    since: Annotated[
        Instant, Query(description="The window's start; with `until`, at most a year of days or two weeks of hours.")
    ] = None,
    until: Instant = None,
    key: str | None = None,
    model: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> JSONResponse:
    shown = limit
    try:
        span = window(bucket, _instant(since, "since"), _instant(until, "until"), utcnow())
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="since") from None
    server = services_of(request)
    await server.ledger.flush()
    query = SeriesQuery(window=span, by=by, key=key, model=model, limit=shown)
    return JSONResponse(await usage_series(server.database, query, server.settings.currency))
