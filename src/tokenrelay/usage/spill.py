"""Rows the database would not take at shutdown go to a JSON-lines file in the data dir, replayed at the next
start. Replaying is safe to repeat: rows carry their ledger id, so a row already written is skipped."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenrelay.limits.limiter import Reservation
from tokenrelay.usage.rows import LedgerEntry

log = logging.getLogger(__name__)

_DATES = ("started_at", "ended_at")


def _line(entry: LedgerEntry) -> str:
    values = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in entry.values.items()}
    reservation = asdict(entry.reservation) if entry.reservation is not None else None
    return json.dumps({"values": values, "reservation": reservation})


def _entry(line: str) -> LedgerEntry:
    data: dict[str, Any] = json.loads(line)
    values = data["values"]
    for name in _DATES:
        values[name] = datetime.fromisoformat(values[name])
    reservation = Reservation(**data["reservation"]) if data["reservation"] else None
    return LedgerEntry(values, reservation)


def spill(path: Path, entries: list[LedgerEntry]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.writelines(_line(e) + "\n" for e in entries)
        out.flush()
        os.fsync(out.fileno())
    log.error("ledger: the database did not take %d row(s); kept in %s for the next start", len(entries), path)


def read_spill(path: Path) -> list[LedgerEntry]:
    if not path.exists():
        return []
    return [_entry(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
