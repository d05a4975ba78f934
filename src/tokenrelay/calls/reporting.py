"""Finished calls, handed to their observers (request log, metrics, ledger) once per loop turn.

Reported when the turn that finished them ends, a call's observers run after the response's last bytes
were handed to the transport (that flush was queued first), and the calls that ended in one turn go through
each observer in one pass. Outside a running loop a call is reported at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tokenrelay.calls.record import Call
from tokenrelay.loopturn import LoopTurnBatch

log = logging.getLogger(__name__)

Observer = Callable[[Call], None]


class FinishedCalls:
    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = tuple(observers)
        self._batch = LoopTurnBatch(self._report)

    def add(self, call: Call) -> None:
        self._batch.add(call)

    def flush(self) -> None:
        """Report every call gathered so far (also called at shutdown, before the ledger closes)."""
        self._batch.flush()

    def _report(self, calls: list[Call]) -> None:
        for observe in self.observers:
            for call in calls:
                try:
                    observe(call)
                except Exception:  # one observer's failure must not cost the other calls their records
                    log.exception("reporting a finished call failed")
