"""Files in the database (`files` table): every replica reads the same bytes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import ColumnElement, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tokenrelay.principal import Principal
from tokenrelay.store.ids import time_ordered_id
from tokenrelay.store.ownership import visible_to
from tokenrelay.store.schema import files
from tokenrelay.store.timeutil import utcnow

_META = [c for c in files.c if c.name != "content"]


@dataclass(frozen=True, slots=True)
class StoredFile:
    id: str
    key_id: str | None
    filename: str
    purpose: str
    bytes: int
    created_at: datetime
    expires_at: datetime | None

    def body(self) -> dict[str, object]:
        """The file object of OpenAI's Files API."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": epoch(self.created_at),
            "expires_at": None if self.expires_at is None else epoch(self.expires_at),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def epoch(when: datetime) -> int:
    return int((when - datetime(1970, 1, 1)).total_seconds())


def new_file_values(
    key_id: str | None, filename: str, purpose: str, content: bytes, retention_days: float | None = None
) -> dict[str, object]:
    now = utcnow()
    expires = None if retention_days is None else now + timedelta(days=retention_days)
    return {
        "id": f"file-{time_ordered_id()}",
        "key_id": key_id,
        "filename": filename,
        "purpose": purpose,
        "bytes": len(content),
        "created_at": now,
        "expires_at": expires,
        "content": content,
    }


async def add_file(conn: AsyncConnection, values: dict[str, object]) -> None:
    await conn.execute(insert(files).values(values))


class FileStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def create(self, principal: Principal, filename: str, purpose: str, content: bytes) -> StoredFile:
        values = new_file_values(principal.key_id, filename, purpose, content)
        async with self.engine.begin() as conn:
            await add_file(conn, values)
        # new_file_values gives each field a value of its StoredFile type, in a dict of objects.
        return StoredFile(**{k: v for k, v in values.items() if k != "content"})  # type: ignore[arg-type]

    async def get(self, principal: Principal, file_id: str) -> StoredFile | None:
        query = select(*_META).where(files.c.id == file_id, visible_to(files, principal), _unexpired())
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else StoredFile(**row._asdict())

    async def content(self, principal: Principal, file_id: str) -> bytes | None:
        query = select(files.c.content).where(files.c.id == file_id, visible_to(files, principal), _unexpired())
        async with self.engine.connect() as conn:
            return (await conn.execute(query)).scalar()

    async def list(
        self, principal: Principal, purpose: str | None, limit: int, after: str | None, order: Literal["asc", "desc"]
    ) -> list[StoredFile]:
        """Files in `order` of creation (ids are time-ordered), those after the file `after` in that order."""
        query = select(*_META).where(visible_to(files, principal), _unexpired())
        if purpose is not None:
            query = query.where(files.c.purpose == purpose)
        if after is not None:
            query = query.where(files.c.id > after if order == "asc" else files.c.id < after)
        query = query.order_by(files.c.id.asc() if order == "asc" else files.c.id.desc()).limit(limit)
        async with self.engine.connect() as conn:
            return [StoredFile(**row._asdict()) for row in await conn.execute(query)]

    async def delete(self, principal: Principal, file_id: str) -> bool:
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(files).where(files.c.id == file_id, visible_to(files, principal)))
        return result.rowcount > 0


def _unexpired() -> ColumnElement[bool]:
    return files.c.expires_at.is_(None) | (files.c.expires_at > utcnow())
