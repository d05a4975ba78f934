"""How the garbage collector runs in a serving process, set once the server has started."""

from __future__ import annotations

import gc

# Container allocations (net of frees) between two young-generation collections; CPython's default is 700.
# Requests in flight keep a few thousand objects alive, which at 700 the collector walks and promotes every
# few requests; request handling makes almost no reference cycles (see `tokenrelay.api.disconnect`), so
# collecting less often keeps little garbage around for longer.
YOUNG_THRESHOLD = 10_000


def tune_garbage_collector() -> None:
    """Collect young objects less often, and never walk what the start-up built.

    A started server holds many objects (FastAPI's and SQLAlchemy's structures, pydantic schemas, the
    engine's Python side) that live as long as the process, and a full collection that walks them all stalls
    every request in flight. `gc.freeze()` moves them to the permanent generation, which is never walked
    (what CPython's documentation suggests for long-lived servers)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
