"""Stored responses (`store: true`): one row per response in the ledger's database, visible to its key only.

A row holds the response object as `GET /v1/responses/{id}` returns it, the request's own input items (for
`/input_items`) and the conversation before them (`context`), so that `previous_response_id` continues from one
row: its context, its input and its output are the next request's prefix.

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
    """A stored response as read back."""

    response: dict[str, Any]
    input_items: list[Item]
    context: list[Item]

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
        self, response: dict[str, Any], key_id: str | None, input_items: list[Item], context: list[Item]
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
        }
        async with self.engine.begin() as conn:
            await conn.execute(insert(responses).values(values))

    async def get(self, response_id: str, key_id: str | None) -> StoredResponse | None:
        """The response if it exists, has not expired and was made by `key_id`; else None."""
        statement = select(responses.c.response, responses.c.input_items, responses.c.context).where(
            *_visible(response_id, key_id)
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(statement)).first()
        if row is None:
            return None
        return StoredResponse(row.response, row.input_items, row.context)

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
