"""Operator API: `/admin/keys` (create, list, show, revoke, rotate) and `/admin/usage`, for admin keys only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse

from tokenrelay.adminauth import require_admin
from tokenrelay.api.parsing import validate_json
from tokenrelay.auth.keyspec import KeyCreate
from tokenrelay.errors import InvalidRequest
from tokenrelay.timeutil import parse_instant
from tokenrelay.usage.report import GROUPINGS, UsageQuery, usage_report

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


@router.get("/usage")
async def get_usage(
    request: Request, key: str | None = None, model: str | None = None, since: str | None = None, by: str | None = None
) -> JSONResponse:
    if by is not None and by not in GROUPINGS:
        raise InvalidRequest(f"`by` must be one of {', '.join(GROUPINGS)}.", param="by")
    try:
        start = parse_instant(since) if since is not None else None
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="since") from None
    accounting = _accounting(request)
    await accounting.ledger.flush()  # this replica's queued rows count too
    report = await usage_report(accounting.engine, UsageQuery(key=key, model=model, since=start, by=by))
    return JSONResponse(report)
