"""A wall clock the test moves for the servers it starts: libfaketime, preloaded, reads an offset from a file.

Only the wall clock moves (budget periods, timestamps); the monotonic clock that event loops and timeouts use
keeps running as it does. The offset file is read again at most once a second (reading it on every clock
reading slows a server down): a server may read the old time for a second or two after `set`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

CACHE_SECONDS = 1
LIBRARIES = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"),
)


class MovableClock:
    def __init__(self, directory: Path) -> None:
        library = next((path for path in LIBRARIES if path.exists()), None)
        if library is None:
            pytest.skip("libfaketime is not installed (Debian package `faketime`; .ci/run installs it)")
        self.library = library
        self.offset_file = directory / "faketime-offset"
        self.offset_file.write_text("+0\n")

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(self.library),
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_CACHE_DURATION": str(CACHE_SECONDS),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def set(self, when: datetime) -> None:
        """From now on the servers' wall clock reads `when` (naive UTC), and runs on from there."""
        offset = when.replace(tzinfo=UTC) - datetime.now(UTC)
        self.offset_file.write_text(f"{offset.total_seconds():+.3f}\n")
