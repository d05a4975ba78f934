"""Marks for async tests that must hold on both event loops tokenrelay serves with (asyncio's own, and uvloop)."""

from __future__ import annotations

import pytest

ON_BOTH_LOOPS = [
    pytest.mark.anyio,
    pytest.mark.parametrize(
        "anyio_backend", [("asyncio", {}), ("asyncio", {"use_uvloop": True})], ids=["asyncio", "uvloop"]
    ),
]
