"""The database opened and migrated, for commands that run outside the server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncEngine

from tokenrelay.config import Settings
from tokenrelay.store.database import create_engine, database_url
from tokenrelay.store.migrate import upgrade


@asynccontextmanager
async def opened_database(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url(settings))
    try:
        await upgrade(engine)
        yield engine
    finally:
        await engine.dispose()
