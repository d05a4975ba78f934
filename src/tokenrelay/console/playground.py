"""`GET /`: the chat playground page (its script talks to the public API like any client)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter
from starlette.responses import FileResponse

router = APIRouter(include_in_schema=False)


def page_path(name: str) -> Path:
    return Path(str(files("tokenrelay.console") / "static" / name))


@router.get("/")
async def playground() -> FileResponse:
    return FileResponse(page_path("playground.html"), headers={"Cache-Control": "no-cache"})
