"""What each worker process imports: the app factory uvicorn calls once the worker has started."""

from __future__ import annotations

from fastapi import FastAPI

from tokenrelay.observability.logs import configure_logging
from tokenrelay.server.app import create_app
from tokenrelay.server.workers.handover import settings_from_env


def worker_app() -> FastAPI:
    settings = settings_from_env()
    configure_logging(settings.log_level, settings.log_format)  # a spawned process starts without our handlers
    return create_app(settings)
