"""Helpers for the keys / limits / ledger tests: a fresh database per test, the CLI, the ledger's rows."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servers import ROOT, server_env
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tokenrelay.store.database import create_engine

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
FAST_CACHE = {"TOKENRELAY_ACCOUNTING__KEY_CACHE_SECONDS": "1"}


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'tokenrelay-test.db'}"


async def _admin(sql: str) -> None:
    engine = create_engine(make_url(PG_ADMIN_URL).set(drivername="postgresql+asyncpg"))
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty PostgreSQL database for one test (module), dropped afterwards."""
    name = f"tokenrelay_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def cli(*args: str, url: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tokenrelay", *args, "--database-url", url]
    result = subprocess.run(command, capture_output=True, text=True, env=server_env(), cwd=ROOT, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def create_key(url: str, name: str, *flags: str) -> str:
    """`tokenrelay keys create`, returning the secret from the last line of its output."""
    return cli("keys", "create", "--name", name, *flags, url=url).stdout.strip().splitlines()[-1]


async def _query(url: str, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    from tokenrelay.config import Settings
    from tokenrelay.store.database import database_url

    engine = create_engine(database_url(Settings(database_url=url)))
    try:
        async with engine.connect() as conn:
            return [dict(row._mapping) for row in await conn.execute(text(sql), params)]
    finally:
        await engine.dispose()


def query(url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    return asyncio.run(_query(url, sql, params))


def ledger_rows(url: str) -> list[dict[str, Any]]:
    return query(url, "SELECT * FROM usage ORDER BY started_at")


def ledger_row(url: str, request_id: str, timeout: float = 10) -> dict[str, Any]:
    """The ledger's row of one request, once the server has written it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = query(url, "SELECT * FROM usage WHERE request_id = :id", id=request_id)
        if rows:
            return rows[0]
        time.sleep(0.1)
    raise AssertionError(f"no ledger row for {request_id}")


def counters(url: str, key_name: str) -> dict[str, Any]:
    sql = "SELECT c.* FROM key_counters c JOIN api_keys k ON k.id = c.key_id WHERE k.name = :name"
    return query(url, sql, name=key_name)[0]
