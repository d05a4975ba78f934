"""Bring the schema to the newest Alembic revision, at startup and before any CLI command touches the data."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

SCRIPTS = "tokenrelay.store:migrations"
# Replicas starting together on one PostgreSQL take this advisory lock so only one migrates at a time.
PG_MIGRATION_LOCK = 0x746F6B72  # "tokr"


def alembic_config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPTS)
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": PG_MIGRATION_LOCK})
    command.upgrade(alembic_config(connection), "head")


async def upgrade(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(_upgrade)
