"""The stored responses table on SQLite and PostgreSQL: per-key visibility, deletion and expiry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from accounting_support import postgres_database, sqlite_url
from sqlalchemy import update

from tokenrelay.config import ResponsesSettings, Settings
from tokenrelay.store.database import create_engine, database_url
from tokenrelay.store.migrate import upgrade
from tokenrelay.store.responses import ResponseStore
from tokenrelay.store.schema import responses
from tokenrelay.store.timeutil import utcnow


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with postgres_database() if request.param == "postgresql" else nullcontext(sqlite_url(tmp_path)) as value:
        yield value


def response(rid: str, text: str) -> dict[str, Any]:
    item = {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    return {"id": rid, "object": "response", "model": "m", "output": [item]}


async def scenario(url: str, retention: float | None) -> dict[str, Any]:
    engine = create_engine(database_url(Settings(database_url=url)))
    await upgrade(engine)
    store = ResponseStore(engine, ResponsesSettings(retention_days=retention))
    user = {"id": "msg_u", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    older = {"id": "msg_o", "type": "message", "role": "user", "content": "before"}
    seen: dict[str, Any] = {}
    try:
        await store.put(response("resp_a", "hello"), "key1", [user], [older])
        await store.put(response("resp_anon", "x"), None, [user], [])
        mine = await store.get("resp_a", "key1")
        seen["conversation"] = None if mine is None else [item["id"] for item in mine.conversation]
        seen["other key"] = await store.get("resp_a", "key2")
        seen["anonymous sees its own"] = await store.get("resp_anon", None) is not None
        seen["a key does not see anonymous"] = await store.get("resp_anon", "key1")
        seen["delete by other key"] = await store.delete("resp_a", "key2")
        seen["delete"] = await store.delete("resp_a", "key1")
        seen["after delete"] = await store.get("resp_a", "key1")
        await store.put(response("resp_old", "x"), "key1", [user], [])
        async with engine.begin() as conn:  # a row past its retention
            stale = update(responses).where(responses.c.id == "resp_old")
            await conn.execute(stale.values(expires_at=utcnow() - timedelta(seconds=1)))
        seen["expired is invisible"] = await store.get("resp_old", "key1")
        seen["purged"] = await store.purge_expired()
        seen["anon kept"] = await store.get("resp_anon", None) is not None
    finally:
        await engine.dispose()
    return seen


def test_a_stored_response_is_its_keys_alone_and_goes_when_deleted_or_expired(url: str) -> None:
    seen = asyncio.run(scenario(url, retention=30))
    assert seen == {
        "conversation": ["msg_o", "msg_u", "msg_resp_a"],
        "other key": None,
        "anonymous sees its own": True,
        "a key does not see anonymous": None,
        "delete by other key": False,
        "delete": True,
        "after delete": None,
        "expired is invisible": None,
        "purged": 1,
        "anon kept": True,
    }


def test_without_a_retention_period_rows_do_not_expire(tmp_path: Path) -> None:
    async def kept() -> tuple[Any, int]:
        engine = create_engine(database_url(Settings(database_url=sqlite_url(tmp_path))))
        await upgrade(engine)
        store = ResponseStore(engine, ResponsesSettings(retention_days=None))
        try:
            await store.put(response("resp_k", "x"), "k", [], [])
            return await store.get("resp_k", "k"), await store.purge_expired()
        finally:
            await engine.dispose()

    stored, purged = asyncio.run(kept())
    assert stored is not None and stored.response["id"] == "resp_k" and purged == 0


def test_a_response_a_node_keeps_is_remembered_with_its_node_and_key(url: str) -> None:
    async def kept() -> tuple[Any, Any]:
        engine = create_engine(database_url(Settings(database_url=url)))
        await upgrade(engine)
        store = ResponseStore(engine, ResponsesSettings())
        try:
            await store.put_relayed("resp_n", "key1", "gateway-model", "node-a")
            return await store.get("resp_n", "key1"), await store.get("resp_n", "key2")
        finally:
            await engine.dispose()

    mine, theirs = asyncio.run(kept())
    assert (mine.model, mine.node, mine.input_items, theirs) == ("gateway-model", "node-a", [], None)
