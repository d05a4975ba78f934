"""`GET /metrics`: Prometheus text format, open by default, admin-only with `metrics_require_admin`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from tokenrelay.admin.guard import require_admin
from tokenrelay.api.server import services_of
from tokenrelay.observability.metrics import CONTENT_TYPE_LATEST

router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse, response_description="Prometheus text format.")
async def metrics(request: Request) -> Response:
    services = services_of(request)
    if services.settings.metrics_require_admin:
        await require_admin(request)
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)
