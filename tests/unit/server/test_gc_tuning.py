"""The serving process's collector settings: start-up objects frozen, young collections less frequent."""

from __future__ import annotations

import gc

from tokenrelay.server.gc_tuning import YOUNG_THRESHOLD, tune_garbage_collector


def test_tuning_freezes_what_exists_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    survivor = [object() for _ in range(100)]  # alive at start-up, like the app's own structures
    try:
        tune_garbage_collector()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() >= len(survivor)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
