"""How the garbage collector runs in a serving process, set once the server has started."""

from __future__ import annotations

import gc

# Container allocations (net of frees) between two young-generation collections; CPython's default is 700.
# Requests in flight keep a few thousand objects alive, so at 700 the collector ran every few requests,
# walked those survivors and promoted them for the older generations to walk again: about 8% of a relayed
# request's CPU at 64 concurrent clients (gc callbacks timed over a `benchmarks/gateway.py`-style run), and
# under 1% at 10,000. Request handling makes almost no reference cycles (see `tokenrelay.disconnect`), so
# collecting less often keeps little garbage around for longer.
YOUNG_THRESHOLD = 10_000


def tune_garbage_collector() -> None:
    """Collect young objects less often, and never walk what the start-up built.

    A started server holds about 140,000 objects (FastAPI's and SQLAlchemy's structures, pydantic schemas,
    the engine's Python side) that live as long as the process. Every full collection walked all of them:
    tens of milliseconds each under load, a stall for every request in flight. `gc.freeze()` moves them to
    the permanent generation, which is never walked (the approach CPython documents for servers that fork
    workers; Instagram's is the well-known use of it)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
