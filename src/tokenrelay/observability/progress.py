"""Progress of a long startup step (assembling or loading a model).

On an interactive terminal it is one line redrawn in place; otherwise (a log file, a container, JSON logs)
it is a log line now and then and one at the end, so logs stay readable and machine-parsable.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenrelay.observability.logs import json_logging


def interactive() -> bool:
    return sys.stderr.isatty() and not json_logging()


@dataclass
class Progress:
    label: str
    logger: logging.Logger
    live: bool = field(default_factory=interactive)
    interval: float = 5.0  # seconds between log lines when not live
    clock: Callable[[], float] = time.monotonic
    _percent: int = -1
    _logged_at: float | None = None

    def update(self, fraction: float, detail: str = "") -> None:
        percent = int(100 * min(max(fraction, 0.0), 1.0))
        if percent == self._percent:
            return
        self._percent = percent
        if self.live:
            self._draw(percent, detail)
        elif percent == 100 or self._due():
            self._log(percent, detail)

    def _draw(self, percent: int, detail: str) -> None:
        end = "\n" if percent == 100 else ""
        print(f"\r{self.label}: {percent:3d}% {detail}".rstrip(), end=end, file=sys.stderr, flush=True)

    def _due(self) -> bool:
        now = self.clock()
        if self._logged_at is None:
            self._logged_at = now  # the first update starts the clock; nothing worth saying yet
            return False
        return now - self._logged_at >= self.interval

    def _log(self, percent: int, detail: str) -> None:
        self._logged_at = self.clock()
        self.logger.info(f"{self.label}: {percent}% {detail}".rstrip())
