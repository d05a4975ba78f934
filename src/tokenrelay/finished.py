"""Finished calls, handed to their observers (request log, metrics, ledger) together, once per loop turn.

Reporting each call as it ends ran the three observers' code once per request, between the request's other
work; at 64 concurrent clients that code was cold in the CPU's caches every time. Gathered for the turn and
reported observer by observer, the calls that ended in one turn share one warm pass through each: about 7% of
a relayed stream's CPU in `benchmarks/breakdown.py` (the app driven in-process against the mock node). A call
is reported at the latest in the next turn of the loop; outside a running loop it is reported at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from tokenrelay.calls import Call

log = logging.getLogger(__name__)

Observer = Callable[[Call], None]


class FinishedCalls:
    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = tuple(observers)
        self._calls: list[Call] = []

    def add(self, call: Call) -> None:
        if not self._calls:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop to come back on: reported now
                self._report([call])
                return
        self._calls.append(call)

    def flush(self) -> None:
        """Report every call gathered so far (also called at shutdown, before the ledger closes)."""
        calls, self._calls = self._calls, []
        if calls:
            self._report(calls)

    def _report(self, calls: list[Call]) -> None:
        for observe in self.observers:
            for call in calls:
                try:
                    observe(call)
                except Exception:  # one observer's failure must not cost the other calls their records
                    log.exception("reporting a finished call failed")
