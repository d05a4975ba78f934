"""The console's pages: `GET /` (the chat playground), `GET /console/usage` (usage charts and keys),
`GET /console/batches` (the key's batches with their progress) and `GET /console/models` (the engine models'
residency, with load and unload buttons).

The pages themselves hold no data and need no key: their scripts call the API with the key the user gives
them (the playground and the batches page the public `/v1` API, the usage and models pages the admin API).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter
from starlette.responses import FileResponse

router = APIRouter(include_in_schema=False)


def page_path(name: str) -> Path:
    return Path(str(files("tokenrelay.console") / "static" / name))


def page(name: str) -> FileResponse:
    return FileResponse(page_path(name), headers={"Cache-Control": "no-cache"})


# HEAD too: clients check that a server is there with `HEAD /` before their first request (Claude Code does).
@router.api_route("/", methods=["GET", "HEAD"])
async def playground() -> FileResponse:
    return page("playground.html")


@router.get("/console/usage")
async def usage() -> FileResponse:
    return page("usage.html")


@router.get("/console/batches")
async def batches() -> FileResponse:
    return page("batches.html")


@router.get("/console/models")
async def models() -> FileResponse:
    return page("models.html")
