"""Settings layering: YAML file < TOKENRELAY_* environment < command-line flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrelay.cli import build_parser, overrides_from
from tokenrelay.config import DEFAULT_MODEL_ID, load_settings


def test_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "port: 9000\nhost: 127.0.0.2\nengine:\n  slots: 3\nmodels:\n  - id: a\n    path: ${MODEL_DIR}/a.gguf\n"
    )
    monkeypatch.setenv("MODEL_DIR", "/models")
    monkeypatch.setenv("TOKENRELAY_PORT", "9100")
    base = load_settings(config)
    assert (base.port, base.host, base.engine.slots) == (9100, "127.0.0.2", 3)
    assert base.models[0].path == Path("/models/a.gguf")
    flags = ["serve", "--port", "9200", "--slots", "5", "--model", "b.gguf", "--model-id", "b"]
    args = build_parser().parse_args(flags)
    settings = load_settings(config, overrides_from(args, base))
    assert (settings.port, settings.engine.slots) == (9200, 5)
    assert [m.id for m in settings.served_models()] == ["a", "b"]


def test_default_model_when_none_configured() -> None:
    assert [m.id for m in load_settings(None).served_models()] == [DEFAULT_MODEL_ID]


def test_model_id_must_follow_a_model() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-id", "x"])
