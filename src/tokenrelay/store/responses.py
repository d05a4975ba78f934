"""Stored responses (`store: true`): one row per response in the ledger's database, visible to its key only.

A row holds the response object as `GET /v1/responses/{id}` returns it, the request's own input items (for
`/input_items`) and the conversation before them (`context`), so that `previous_response_id` continues from one
row: its context, its input and its output are the next request's prefix.

A response that a node made and keeps (a native relay, `api/relayed.py`) has a row of its own naming the node
and the gateway's model id, and nothing of the response itself: reads of it are forwarded to that node.

Rows expire after `responses.retention_days`: an expired row is invisible at once (every read asks for an
unexpired one), and a sweeper removes expired rows every `responses.sweep_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, delete, insert, or_, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from tokenrelay.config import ResponsesSettings
from tokenrelay.store.schema import responses
from tokenrelay.store.timeutil import utcnow

log = logging.getLogger(__name__)

Item = dict[str, Any]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A stored response as read back; `node` names the node that holds a relayed one (then the rest is empty)."""

    response: dict[str, Any]
    input_items: list[Item]
    context: list[Item]
    model: str = ""
    node: str | None = None

    @property
    def conversation(self) -> list[Item]:
        """What a request continuing from this response starts with (its instructions are not carried over)."""
        return [*self.context, *self.input_items, *self.response["output"]]


class ResponseStore:
    """Reads and writes the `responses` table; `start` runs the sweeper of expired rows."""

    def __init__(self, engine: AsyncEngine, settings: ResponsesSettings) -> None:
        self.engine = engine
        self.settings = settings
        self._sweeper: asyncio.Task[None] | None = None

    async def put(
        self,
        response: dict[str, Any],
        key_id: str | None,
        input_items: list[Item],
        context: list[Item],
        *,
        node: str | None = None,
    ) -> None:
        now = utcnow()
        days = self.settings.retention_days
        values = {
            "id": response["id"],
            "key_id": key_id,
            "model": response["model"],
            "created_at": now,
            "expires_at": None if days is None else now + timedelta(days=days),
            "response": response,
            "input_items": input_items,
            "context": context,
            "node": node,
        }
        async with self.engine.begin() as conn:
            await conn.execute(insert(responses).values(values))

    async def put_relayed(self, response_id: str, key_id: str | None, model: str, node: str) -> None:
        """Remember that `node` keeps the response `response_id` of `key_id`, made through the gateway's `model`."""
        await self.put({"id": response_id, "model": model}, key_id, [], [], node=node)

    async def get(self, response_id: str, key_id: str | None) -> StoredResponse | None:
        """The response if it exists, has not expired and was made by `key_id`; else None."""
        c = responses.c
        statement = select(c.response, c.input_items, c.context, c.model, c.node).where(*_visible(response_id, key_id))
        async with self.engine.connect() as conn:
            row = (await conn.execute(statement)).first()
        if row is None:
            return None
        return StoredResponse(row.response, row.input_items, row.context, row.model, row.node)

    async def delete(self, response_id: str, key_id: str | None) -> bool:
        async with self.engine.begin() as conn:
            return (await conn.execute(delete(responses).where(*_visible(response_id, key_id)))).rowcount > 0

    async def purge_expired(self) -> int:
        statement = delete(responses).where(responses.c.expires_at <= utcnow())
        async with self.engine.begin() as conn:
            return (await conn.execute(statement)).rowcount

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="responses-sweeper")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    async def _sweep(self) -> None:
        while True:
            try:
                removed = await self.purge_expired()
            except (SQLAlchemyError, OSError):
                log.exception("removing expired stored responses failed; trying again later")
            else:
                if removed:
                    log.info("removed %d expired stored response(s)", removed)
            await asyncio.sleep(self.settings.sweep_seconds)


def _visible(response_id: str, key_id: str | None) -> list[ColumnElement[bool]]:
    c = responses.c
    unexpired = or_(c.expires_at.is_(None), c.expires_at > utcnow())
    return [c.id == response_id, c.key_id.is_not_distinct_from(key_id), unexpired]
