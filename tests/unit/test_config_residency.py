"""Settings of many models: a folder of GGUFs, residency limits and Ollama's keep_alive durations."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tokenrelay.cli.main import main
from tokenrelay.config import DEFAULT_MODEL_IDS, load_settings


def test_models_dir_serves_each_gguf_once_under_its_stem(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    names = ["Qwen-0.5B-Q4_K_M.gguf", "mmproj-F16.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "a.gguf"]
    for name in names:
        (folder / name).write_bytes(b"GGUF")
    (folder / "notes.txt").write_text("not a model")
    configured = [{"id": "mine", "path": str(folder / "a.gguf")}]
    settings = load_settings(None, {"models_dir": str(folder), "models": configured})
    served = {model.id: model for model in settings.served_models()}
    assert list(served) == ["mine", "qwen-0.5b-q4_k_m", "big"]  # in file name order
    assert served["qwen-0.5b-q4_k_m"].on_demand and not served["mine"].on_demand


def test_a_models_dir_alone_replaces_the_default_models_and_an_empty_config_keeps_them(tmp_path: Path) -> None:
    (tmp_path / "only.gguf").write_bytes(b"GGUF")
    assert [m.id for m in load_settings(None, {"models_dir": str(tmp_path)}).served_models()] == ["only"]
    assert tuple(m.id for m in load_settings(None, {}).served_models()) == DEFAULT_MODEL_IDS
    with pytest.raises(ValidationError, match="not a folder"):
        load_settings(None, {"models_dir": str(tmp_path / "missing")})


@pytest.mark.parametrize(("written", "seconds"), [("5m", 300.0), ("30s", 30.0), ("1h", 3600.0), (0, 0.0), ("-1", -1.0)])
def test_keep_alive_reads_seconds_and_durations(written: object, seconds: float) -> None:
    settings = load_settings(
        None, {"engine": {"keep_alive": written}, "models": [{"id": "m", "path": "m.gguf", "keep_alive": written}]}
    )
    assert settings.engine.keep_alive == seconds == settings.models[0].keep_alive


def test_residency_limits_are_checked() -> None:
    settings = load_settings(None, {"engine": {"max_loaded_models": 2, "max_memory": "1.5GiB"}})
    assert (settings.engine.max_loaded_models, settings.engine.max_memory) == (2, 1610612736)
    for wrong in ({"max_loaded_models": 0}, {"keep_alive": "soon"}, {"max_memory": "lots"}):
        with pytest.raises(ValidationError):
            load_settings(None, {"engine": wrong})


def test_serve_names_a_missing_gguf_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.gguf"
    assert main(["serve", "--model", str(missing), "--model-id", "m", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"tokenrelay: model 'm': no GGUF file at {missing}\n"
