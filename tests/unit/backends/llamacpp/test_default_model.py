"""The default model's first assembly reports progress; later starts reuse the file silently."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tokenrelay.backends.llamacpp.default_model import ensure_default_model

LOGGER = "tokenrelay.backends.llamacpp.default_model"


def test_first_assembly_shows_progress_then_is_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        path = ensure_default_model(tmp_path)
    try:
        progress = [r.getMessage() for r in caplog.records if "%" in r.getMessage()]
        size_mib = path.stat().st_size >> 20
        assert progress[-1] == f"assembling default model {path.name}: 100% ({size_mib}/{size_mib} MiB)"
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert ensure_default_model(tmp_path) == path
        assert not caplog.records
    finally:
        path.unlink()  # 250 MB: not worth keeping in pytest's temporary directories
