"""Operator API: `/admin/keys` (create, list, show, revoke, rotate), `/admin/usage` and `/admin/usage/series`,
for admin keys only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse

from tokenrelay.admin.guard import require_admin
from tokenrelay.auth.keyspec import KeyCreate
from tokenrelay.errors import InvalidRequest
from tokenrelay.openai.parsing import validate_json
from tokenrelay.store.timeutil import parse_instant, utcnow
from tokenrelay.usage.report import GROUPINGS, UsageQuery, usage_report
from tokenrelay.usage.series import DEFAULT_LIMIT, MAX_LIMIT, SERIES_GROUPINGS, SeriesQuery, usage_series
from tokenrelay.usage.window import BUCKETS, window

router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])


def _accounting(request: Request) -> Any:
    return request.app.state.services.accounting


@router.post("/keys")
async def create_key(request: Request) -> JSONResponse:
    wanted = validate_json(KeyCreate, await request.body())
    record, secret = await _accounting(request).keys.create(wanted.spec())
    # The secret is in this response and nowhere else, ever.
    return JSONResponse({**record.to_json(), "key": secret}, status_code=201)


@router.get("/keys")
async def list_keys(request: Request) -> JSONResponse:
    records = await _accounting(request).keys.list()
    return JSONResponse({"object": "list", "data": [r.to_json() for r in records]})


@router.get("/keys/{ref}")
async def get_key(ref: str, request: Request) -> JSONResponse:
    return JSONResponse((await _accounting(request).keys.get(ref)).to_json())


@router.delete("/keys/{ref}")
async def revoke_key(ref: str, request: Request) -> JSONResponse:
    return JSONResponse((await _accounting(request).keys.revoke(ref)).to_json())


@router.post("/keys/{ref}/rotate")
async def rotate_key(ref: str, request: Request) -> JSONResponse:
    record, secret = await _accounting(request).keys.rotate(ref)
    return JSONResponse({**record.to_json(), "key": secret})


def _instant(text: str | None, param: str) -> datetime | None:
    try:
        return parse_instant(text) if text is not None else None
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=param) from None


def _one_of(value: str | None, allowed: tuple[str, ...], param: str) -> None:
    if value is not None and value not in allowed:
        raise InvalidRequest(f"`{param}` must be one of {', '.join(allowed)}.", param=param)


def _count(text: str | None, param: str, default: int, most: int) -> int:
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= most:
        raise InvalidRequest(f"`{param}` must be a whole number from 1 to {most}.", param=param)
    return int(text)


@router.get("/usage")
async def get_usage(
    request: Request, key: str | None = None, model: str | None = None, since: str | None = None, by: str | None = None
) -> JSONResponse:
    _one_of(by, GROUPINGS, "by")
    start = _instant(since, "since")
    accounting = _accounting(request)
    await accounting.ledger.flush()  # this replica's queued rows count too
    report = await usage_report(accounting.engine, UsageQuery(key=key, model=model, since=start, by=by))
    return JSONResponse(report)


@router.get("/usage/series")
async def get_usage_series(
    request: Request,
    bucket: str = "hour",
    by: str | None = None,
    since: str | None = None,
    until: str | None = None,
    key: str | None = None,
    model: str | None = None,
    limit: str | None = None,
) -> JSONResponse:
    _one_of(bucket, BUCKETS, "bucket")
    _one_of(by, SERIES_GROUPINGS, "by")
    shown = _count(limit, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    try:
        span = window(bucket, _instant(since, "since"), _instant(until, "until"), utcnow())
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="since") from None
    accounting = _accounting(request)
    await accounting.ledger.flush()
    query = SeriesQuery(window=span, by=by, key=key, model=model, limit=shown)
    return JSONResponse(await usage_series(accounting.engine, query))
