"""Time-ordered unique ids (the layout of a version-7 UUID, RFC 9562), as 32 hex digits.

The ledger's rows are keyed by such ids, and indexed by request id. A random key (version 4) lands each
insert on a random page of its index, so a batch of rows dirties a page per row in each of those indexes and
every page goes to SQLite's write-ahead log again, a cost that grows with the table. Ids that start with the
time land next to each other, at the index's end.

Python 3.11 has no `uuid.uuid7`, and the layout is three fields, so it is written here. The random part comes
from `random`: these ids must be unique, not unpredictable; they grant nothing. `random` is reseeded in each
forked or spawned worker, so workers do not repeat each other's ids.
"""

from __future__ import annotations

import random
import time

_VERSION = 0x7 << 76
_VARIANT = 0b10 << 62


def time_ordered_id() -> str:
    """48 bits of Unix time in milliseconds, the version, 12 random bits, the variant, 62 random bits."""
    millis = time.time_ns() // 1_000_000
    rand = random.getrandbits(74)
    value = (millis & 0xFFFF_FFFF_FFFF) << 80 | _VERSION | (rand >> 62) << 64 | _VARIANT | (rand & ((1 << 62) - 1))
    return f"{value:032x}"
