"""Database URLs and the async engine (aiosqlite for SQLite, asyncpg for PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tokenrelay.config import Settings

ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}

# A writer waits this long for SQLite's lock (other requests, the ledger, a `tokenrelay keys` command).
SQLITE_BUSY_MS = 30_000


def database_url(settings: Settings) -> URL:
    """The configured URL with its async driver; a SQLite file in the data dir when none is configured."""
    if settings.database_url is None:
        return make_url(f"sqlite+aiosqlite:///{Path(settings.data_dir) / 'tokenrelay.db'}")
    url = make_url(settings.database_url)
    backend, _, driver = url.drivername.partition("+")
    if backend not in ASYNC_DRIVERS:
        raise ValueError(f"unsupported database {backend!r}: use sqlite:///path or postgresql://...")
    if not driver or driver in ("psycopg2", "psycopg", "pysqlite"):
        url = url.set(drivername=ASYNC_DRIVERS[backend])
    return url


def create_engine(url: URL) -> AsyncEngine:
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    return create_async_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


def _sqlite_engine(url: URL) -> AsyncEngine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, connect_args={"timeout": SQLITE_BUSY_MS / 1000})

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        # WAL lets key lookups and reports read while the ledger writes; the busy timeout makes
        # concurrent writers (requests, the ledger, a CLI command) queue instead of failing.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def redacted(url: URL) -> str:
    return url.render_as_string(hide_password=True)
