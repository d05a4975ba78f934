"""SQLite ledger batches written on the event loop, through a connection of the ledger's own.

Through the engine (aiosqlite) a batch goes to the driver's thread: the rows are prepared on the loop by
SQLAlchemy, then bound and stepped one by one in the thread, which takes the interpreter's lock back from the
busy loop for every row (dearer than SQLite's own work for the row). Here the same statements run in the
loop's thread with the standard library's driver: no hand-over, no per-row lock traffic.

What keeps the loop from waiting on the database:
- The lock is never waited for: `busy_timeout` is 0 and each transaction starts with `BEGIN IMMEDIATE`, so a
  batch that finds the write lock taken (another worker, a `tokenrelay keys` command, a key's admission) is
  refused at once, and the ledger sends that batch the usual way, through the engine, whose thread waits.
- No checkpoint runs here (`wal_autocheckpoint=0`): moving the WAL's pages into the database file, with its
  fsync, is left to the ledger, which checkpoints through the engine's thread every `CHECKPOINT_ROWS` rows.
- Transactions are small (`MAX_ROWS`) and the ledger yields to the loop between them.
- Only rows written for the first time that settle nothing: settlement, batch lines (whose rows replace
  their earlier runs') and rows that may exist already (a retry, a spill replay) keep to `write_batch`.

The SQL is SQLAlchemy's own, compiled for SQLite from the schema, and values are converted by the column
types' own bind processors, so a row reads back through the engine exactly as if the engine had written it.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import DateTime, bindparam, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Dialect

from tokenrelay.store.schema import api_keys, usage
from tokenrelay.usage.rows import LedgerEntry, last_use

MAX_ROWS = 500
CHECKPOINT_ROWS = 5000
_LOCKED = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def inline_path(url: URL) -> str | None:
    """The database file an inline writer may open, or None (not SQLite, or an in-memory database)."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return url.database


class InlineWriter:
    def __init__(self, path: str) -> None:
        dialect = sqlite.dialect()
        insert = sqlite.insert(usage).on_conflict_do_nothing(index_elements=["id"]).compile(dialect=dialect)
        self._insert = str(insert)
        self._columns: tuple[str, ...] = tuple(insert.positiontup or ())
        self._values = operator.itemgetter(*self._columns)  # a row's values in the statement's order, in C
        self._convert = _converters(dialect, self._columns)
        touch = _touch_statement().compile(dialect=dialect)
        self._touch = str(touch)
        self._touch_params: tuple[str, ...] = tuple(touch.positiontup or ())
        self._to_text = _processor(dialect, "ended_at") or str
        self.since_checkpoint = 0
        self._conn = sqlite3.connect(path, timeout=0, isolation_level=None)
        for pragma in ("busy_timeout=0", "synchronous=NORMAL", "wal_autocheckpoint=0"):
            self._conn.execute(f"PRAGMA {pragma}")

    @staticmethod
    def takes(entries: Sequence[LedgerEntry]) -> bool:
        return all(entry.reservation is None and not entry.batch_line for entry in entries)

    def write(self, entries: Sequence[LedgerEntry]) -> bool:
        """Insert the rows and note the keys' last use in one transaction. False, with nothing written, when
        another connection holds the write lock."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode in _LOCKED:
                return False
            raise
        try:
            self._conn.executemany(self._insert, [self._row(entry) for entry in entries])
            self._conn.executemany(self._touch, self._touches(entries))
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        self.since_checkpoint += len(entries)
        return True

    def _row(self, entry: LedgerEntry) -> list[Any]:
        row = list(self._values(entry.values))
        for position, convert in self._convert:
            row[position] = convert(row[position])
        return row

    def _touches(self, entries: Sequence[LedgerEntry]) -> list[tuple[Any, ...]]:
        params = []
        for key_id, when in last_use(entries).items():
            given = {"key_id": key_id, "when": self._to_text(when)}
            params.append(tuple(given[name] for name in self._touch_params))
        return params

    def close(self) -> None:
        self._conn.close()


def _touch_statement() -> Any:
    c = api_keys.c
    stale = c.last_used_at.is_(None) | (c.last_used_at < bindparam("when"))
    return update(api_keys).where(c.id == bindparam("key_id"), stale).values(last_used_at=bindparam("when"))


def _converters(dialect: Dialect, columns: Sequence[str]) -> list[tuple[int, Callable[[Any], Any]]]:
    """The columns that have a bind processor (SQLite keeps datetimes as text in SQLAlchemy's format), by position."""
    converters = []
    for position, name in enumerate(columns):
        process = _processor(dialect, name)
        if process is not None:
            converters.append((position, process))
    return converters


def _processor(dialect: Dialect, column: str) -> Callable[[Any], Any] | None:
    # The dialect's own type (SQLite's DATETIME writes text in SQLAlchemy's format); the generic type has none.
    process = usage.c[column].type.dialect_impl(dialect).bind_processor(dialect)
    if process is None or not isinstance(usage.c[column].type, DateTime):
        return process
    return partial(_datetime_text, process)


def _datetime_text(process: Callable[[Any], Any], value: Any) -> Any:
    """SQLite's DATETIME text of a naive datetime, "YYYY-MM-DD HH:MM:SS.ffffff", as `process` (SQLAlchemy's)
    writes it, in a third of the time (one C call instead of a Python `%` format); anything else as `process`
    has it. `test_inline_rows_are_stored_exactly_as_the_engine_stores_them` compares the two."""
    if type(value) is datetime and value.tzinfo is None:
        return value.isoformat(" ", "microseconds")
    return process(value)
