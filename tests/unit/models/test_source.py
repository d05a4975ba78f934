"""Hub sources (`hf:org/repo[:TAG|:FILE]`) as written in the settings and on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tokenrelay.cli.main import build_parser, main, overrides_from
from tokenrelay.config import ModelSettings, load_settings
from tokenrelay.models.source import HubSource, parse_source

NODE = {"url": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("hf:org/repo", HubSource("hf:org/repo", "org/repo")),
        ("hf:Org/Smol.v2-GGUF:q4_k_m", HubSource("hf:Org/Smol.v2-GGUF:q4_k_m", "Org/Smol.v2-GGUF", tag="q4_k_m")),
        ("hf:org/repo:Q8_0/m.GGUF", HubSource("hf:org/repo:Q8_0/m.GGUF", "org/repo", file="Q8_0/m.GGUF")),
    ],
)
def test_sources_parse(text: str, parsed: HubSource) -> None:
    assert parse_source(text) == parsed


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("org/repo", "does not start with 'hf:'"),
        ("hf:repo", "'repo' is not a Hub repository id (org/repo)"),
        ("hf:a/b/c", "'a/b/c' is not a Hub repository id"),
        ("hf:org/re--po", "'org/re--po' is not a Hub repository id"),
        ("hf:org/repo:", "ends with ':' but names no quantisation or file"),
        ("hf:org/repo:Q4 K", "'Q4 K' is neither a quantisation tag nor a .gguf file name"),
        ("hf:org/repo:../m.gguf", "'../m.gguf' is not a file path inside the repository"),
    ],
)
def test_bad_sources_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_source(text)
    assert problem in str(raised.value) and str(raised.value).startswith(f"model source {text!r}")


def test_a_model_with_a_source_runs_on_the_engine_and_a_bad_source_is_a_settings_error() -> None:
    assert ModelSettings(id="m", source="hf:org/repo:Q8_0", upstreams=[NODE]).embedded
    with pytest.raises(ValidationError, match="source 'hf:nope': 'nope' is not a Hub repository id"):
        ModelSettings(id="m", source="hf:nope")
    with pytest.raises(ValidationError, match="has both a GGUF `path` and a `source`; keep one"):
        ModelSettings(id="m", path=Path("/m.gguf"), source="hf:org/repo")
    with pytest.raises(ValidationError, match="needs a GGUF `path`, a Hub `source` or at least one upstream"):
        ModelSettings(id="m")


def test_model_flags_take_a_source_named_after_the_repo_unless_an_id_follows() -> None:
    flags = ["serve", "--model", "hf:test-org/Smol-GGUF:Q8_0", "--model", "hf:test-org/other", "--model-id", "b"]
    flags += ["--model", "/models/Plain.gguf"]
    settings = load_settings(None, overrides_from(build_parser().parse_args(flags), load_settings(None)))
    served = [(m.id, m.source, m.path) for m in settings.served_models()]
    assert served == [
        ("smol-gguf", "hf:test-org/Smol-GGUF:Q8_0", None),
        ("b", "hf:test-org/other", None),
        ("Plain", None, Path("/models/Plain.gguf")),
    ]


def test_a_bad_source_flag_is_an_invalid_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "hf:no-slash"]) == 2
    assert "'no-slash' is not a Hub repository id" in capsys.readouterr().err
