"""The supervisor process of `serve --workers N`: checks, one migration, then uvicorn's multiprocess supervisor."""

from __future__ import annotations

import asyncio
import logging
import os

from uvicorn import Config
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from tokenrelay.config import Settings
from tokenrelay.observability.metrics.multiprocess import metrics_dir_for_workers
from tokenrelay.server.uvicorn_options import uvicorn_options
from tokenrelay.server.workers.handover import ENV, settings_json
from tokenrelay.store.opened import opened_database

log = logging.getLogger("tokenrelay.serve")

APP = "tokenrelay.server.workers.app:worker_app"


class EmbeddedModelsWithWorkers(ValueError):
    """Several workers would each load their own copy of an embedded model."""


def check_upstream_only(settings: Settings) -> None:
    embedded = [m.id for m in settings.served_models() if m.embedded]
    if embedded:
        raise EmbeddedModelsWithWorkers(
            f"--workers {settings.workers} needs upstream-only models, but {', '.join(embedded)} "
            f"{'runs' if len(embedded) == 1 else 'run'} on the embedded llama.cpp engine (each worker would load "
            "its own copy); use --workers 1"
        )


async def migrate(settings: Settings) -> None:
    # Once, before the workers start: on SQLite nothing else keeps them from creating the same tables at once.
    async with opened_database(settings):
        pass


def serve_workers(settings: Settings) -> int:
    """Run the workers until SIGTERM or SIGINT; each one finishes its requests and writes its ledger."""
    check_upstream_only(settings)
    asyncio.run(migrate(settings))
    with metrics_dir_for_workers():
        os.environ[ENV] = settings_json(settings)
        try:
            return supervise(settings)
        finally:
            os.environ.pop(ENV, None)


def supervise(settings: Settings) -> int:
    config = Config(APP, factory=True, workers=settings.workers, **uvicorn_options(settings))
    log.info("starting %d workers", settings.workers)
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    # uvicorn's supervisor stops everything when a worker fails to start; say so with the exit status.
    failed = any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes)
    return STARTUP_FAILURE if failed else 0
