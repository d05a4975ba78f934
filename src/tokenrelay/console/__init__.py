"""The web console: plain pages and assets shipped inside the package, served by tokenrelay itself.

No CDN and no build step: deployments without internet access get the same pages.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from tokenrelay.console import pages

STATIC_PREFIX = "/console/static"


def install_console(app: FastAPI) -> None:
    app.mount(STATIC_PREFIX, StaticFiles(packages=[("tokenrelay.console", "static")]), name="console-static")
    app.include_router(pages.router)
