"""Marks for async tests that must hold on both event loops tokenrelay serves with (asyncio's own, and uvloop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

ON_BOTH_LOOPS = [
    pytest.mark.anyio,
    pytest.mark.parametrize(
        "anyio_backend", [("asyncio", {}), ("asyncio", {"use_uvloop": True})], ids=["asyncio", "uvloop"]
    ),
]


def on_both_loops(test: Callable[..., Any]) -> Callable[..., Any]:
    """`ON_BOTH_LOOPS` for one test, in a module whose other tests are not async."""
    for mark in ON_BOTH_LOOPS:
        test = mark(test)
    return test
