"""The store's own pieces: database URLs, migrations on both databases, time-ordered ids."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from tokenrelay.config import Settings
from tokenrelay.store.database import create_engine, database_url
from tokenrelay.store.ids import time_ordered_id
from tokenrelay.store.migrate import upgrade

PG_HOST = "postgres@127.0.0.1:5432"
POSTGRES = f"postgresql://{PG_HOST}/test"


def test_urls_get_their_async_driver_and_sqlite_is_the_default(tmp_path: Path) -> None:
    assert str(database_url(Settings(data_dir=str(tmp_path)))) == f"sqlite+aiosqlite:///{tmp_path / 'tokenrelay.db'}"
    assert database_url(Settings(database_url=POSTGRES)).drivername == "postgresql+asyncpg"
    assert database_url(Settings(database_url="postgresql+psycopg2://h/db")).drivername == "postgresql+asyncpg"
    assert database_url(Settings(database_url="sqlite:///x.db")).drivername == "sqlite+aiosqlite"
    with pytest.raises(ValueError, match="unsupported database 'mysql'"):
        database_url(Settings(database_url="mysql://h/db"))


async def tables_after_two_upgrades(url: str) -> set[str]:
    engine = create_engine(make_url(url))
    try:
        await upgrade(engine)
        await upgrade(engine)  # a second start finds nothing to do
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


async def on_a_new_postgresql_database() -> set[str]:
    name = f"t{uuid.uuid4().hex[:12]}"
    admin = create_engine(make_url(f"postgresql+asyncpg://{PG_HOST}/test"))

    async def run(statement: str) -> None:
        async with admin.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql(statement)

    await run(f"CREATE DATABASE {name}")
    try:
        return await tables_after_two_upgrades(f"postgresql+asyncpg://{PG_HOST}/{name}")
    finally:
        await run(f"DROP DATABASE {name}")
        await admin.dispose()


def test_migrations_build_the_same_tables_on_sqlite_and_postgresql(tmp_path: Path) -> None:
    on_sqlite = asyncio.run(tables_after_two_upgrades(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"))
    assert {"api_keys", "key_counters", "reservations", "responses"} <= on_sqlite
    assert asyncio.run(on_a_new_postgresql_database()) == on_sqlite


def test_ids_are_unique_and_ordered_by_time() -> None:
    ids = [time_ordered_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and uuid.UUID(i).version == 7 for i in ids)
    assert sorted(i[:12] for i in ids) == [i[:12] for i in ids]  # the millisecond prefix never goes back
