"""Rows the database would not take at shutdown go to a JSON-lines file in the data dir, replayed at the next
start. Replaying is safe to repeat: rows carry their ledger id, so a row already written is skipped.

Each process spills to a file of its own (its pid in the name), since several workers share a data dir and
may shut down together. A starting process replays the files of processes that have exited, taking each by
renaming it to its own name first, so two workers starting together never replay the same file twice.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenrelay.limits.limiter import Reservation
from tokenrelay.usage.rows import LedgerEntry

log = logging.getLogger(__name__)

_DATES = ("started_at", "ended_at")
# Columns a spill file written by an earlier version lacks, with what such a row means.
_ADDED_LATER = {"batch_id": None, "cost": 0, "priced": False, "served_model": None}


def _line(entry: LedgerEntry) -> str:
    values = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in entry.values.items()}
    reservation = asdict(entry.reservation) if entry.reservation is not None else None
    return json.dumps({"values": values, "reservation": reservation})


def _entry(line: str) -> LedgerEntry:
    data: dict[str, Any] = json.loads(line)
    values = data["values"]
    for name in _DATES:
        values[name] = datetime.fromisoformat(values[name])
    values.update({name: values.get(name, default) for name, default in _ADDED_LATER.items()})
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


@dataclass(frozen=True)
class SpillFiles:
    """The spill files of one database in one directory: this process's own, and those left by others."""

    directory: Path
    tag: str  # one per database, so rows never replay into another database sharing the data dir
    pid: int = field(default_factory=os.getpid)

    @property
    def own(self) -> Path:
        return self.directory / f"ledger-spill-{self.tag}-{self.pid}.jsonl"

    def left_over(self) -> list[Path]:
        """This process's file (a reused pid's) first, then those of processes no longer running."""
        found = sorted(self.directory.glob(f"ledger-spill-{self.tag}*.jsonl"))
        others = [path for path in found if path != self.own and not _running(self._writer(path))]
        return [self.own, *others] if self.own in found else others

    def claim(self, path: Path) -> bool:
        """Take a left-over file by renaming it to this process's name; False if another process took it."""
        if path == self.own:
            return path.exists()
        try:
            path.rename(self.own)
        except FileNotFoundError:
            return False
        return True

    def _writer(self, path: Path) -> int | None:
        """The pid in a spill file's name; None for the one-file-per-database name of earlier versions."""
        suffix = path.stem.removeprefix(f"ledger-spill-{self.tag}").removeprefix("-")
        return int(suffix) if suffix.isdigit() else None


def _running(pid: int | None) -> bool:
    """Whether a process that may still be writing its spill file runs."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        return True
    return True
