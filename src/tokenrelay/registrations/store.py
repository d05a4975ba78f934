"""Registered nodes in the database: one row per (model id, node name), the node's api_key sealed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Row, Table, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from tokenrelay.config import UpstreamSettings
from tokenrelay.registrations.sealing import KeySeal
from tokenrelay.store.schema import registered_nodes
from tokenrelay.store.timeutil import utcnow

# Each dialect's INSERT, with its ON CONFLICT clauses (the two dialects spell them alike).
_INSERTS: dict[str, Callable[[Table], postgresql.Insert | sqlite.Insert]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}


@dataclass(frozen=True, slots=True)
class StoredNode:
    """A row as read back: `upstream` is None when its settings cannot be used here (see `problem`)."""

    model_id: str
    name: str
    updated_at: datetime
    upstream: UpstreamSettings | None
    problem: str | None = None


class NodeStore:
    def __init__(self, engine: AsyncEngine, seal: KeySeal) -> None:
        self.engine = engine
        self.seal = seal

    async def put(self, model_id: str, upstream: UpstreamSettings) -> bool:
        """Insert or replace the registration of `upstream.label` for `model_id`; True if it replaced one."""
        now = utcnow()
        values = {
            "model_id": model_id,
            "name": upstream.label,
            "settings": upstream.model_dump(mode="json", exclude={"api_key"}),
            "api_key_sealed": self.seal.seal(upstream.api_key) if upstream.api_key is not None else None,
            "created_at": now,
            "updated_at": now,
        }
        async with self.engine.begin() as conn:
            insert = _INSERTS[conn.dialect.name](registered_nodes).values(values)
            changed = {k: insert.excluded[k] for k in ("settings", "api_key_sealed", "updated_at")}
            upsert = insert.on_conflict_do_update(index_elements=["model_id", "name"], set_=changed)
            # created_at keeps the first registration's time, so a differing one means the row existed.
            row = (await conn.execute(upsert.returning(registered_nodes.c.created_at))).one()
        return row.created_at != now

    async def delete(self, name: str, model_id: str | None = None) -> int:
        """Remove `name` from every model, or from `model_id` only; returns how many registrations went."""
        statement = delete(registered_nodes).where(registered_nodes.c.name == name)
        if model_id is not None:
            statement = statement.where(registered_nodes.c.model_id == model_id)
        async with self.engine.begin() as conn:
            return (await conn.execute(statement)).rowcount

    async def load(self) -> list[StoredNode]:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(registered_nodes).order_by(registered_nodes.c.created_at))).all()
        return [self._stored(row) for row in rows]

    def _stored(self, row: Row) -> StoredNode:
        settings: dict[str, Any] = dict(row.settings)
        if row.api_key_sealed is not None:
            opened = self.seal.open(row.api_key_sealed)
            if opened is None:
                return StoredNode(row.model_id, row.name, row.updated_at, None, "its api_key cannot be decrypted")
            settings["api_key"] = opened
        try:
            upstream = UpstreamSettings.model_validate(settings)
        except ValidationError as exc:  # written by another version of tokenrelay
            first = exc.errors(include_url=False, include_input=False)[0]
            problem = f"its settings are invalid here ({'.'.join(map(str, first['loc']))}: {first['msg']})"
            return StoredNode(row.model_id, row.name, row.updated_at, None, problem)
        return StoredNode(row.model_id, row.name, row.updated_at, upstream)
