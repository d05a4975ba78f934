"""Fallback ids in the settings: an unknown id or a cycle is refused, and `tokenrelay serve` says so in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tokenrelay.cli.main import main
from tokenrelay.config import Settings, fallback_chain


def node(port: int) -> list[dict[str, Any]]:
    return [{"url": f"http://127.0.0.1:{port}/v1"}]


def models(**fallbacks: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Models served by nodes, each with its `fallbacks` and `context_fallbacks` lists as given."""
    return [{"id": name, "upstreams": node(i + 1), **lists} for i, (name, lists) in enumerate(fallbacks.items())]


CYCLE = models(a={"fallbacks": ["b"]}, b={"context_fallbacks": ["c"]}, c={"fallbacks": ["a"]})
UNKNOWN = models(a={"fallbacks": ["b", "nope"]}, b={})


def test_known_acyclic_fallbacks_are_accepted_and_chained() -> None:
    settings = Settings(models=models(a={"fallbacks": ["b"], "context_fallbacks": ["c"]}, b={"fallbacks": ["c"]}, c={}))
    assert fallback_chain("a", settings.served_models()) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("configured", "message"),
    [
        (UNKNOWN, "model 'a': fallback 'nope' is not a configured model"),
        (CYCLE, "fallbacks form a cycle: a -> b -> c -> a"),
        (models(a={"context_fallbacks": ["a"]}), "fallbacks form a cycle: a -> a"),
    ],
)
def test_unknown_ids_and_cycles_are_refused(configured: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(models=configured)


@pytest.mark.parametrize(
    ("configured", "line"),
    [
        (UNKNOWN, "tokenrelay: invalid settings: model 'a': fallback 'nope' is not a configured model"),
        (CYCLE, "tokenrelay: invalid settings: fallbacks form a cycle: a -> b -> c -> a"),
        (
            [{"id": "a", "upstreams": node(1), "pricing": {"input": -1, "output": 1}}],
            "tokenrelay: invalid settings: models.0.pricing.input: Input should be greater than or equal to 0",
        ),
    ],
)
def test_serve_names_the_problem_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], configured: list[dict[str, Any]], line: str
) -> None:
    config = tmp_path / "tokenrelay.yaml"
    config.write_text(yaml.safe_dump({"models": configured}))
    assert main(["serve", "--config", str(config), "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == line + "\n"  # no pydantic dump of the whole input, no links
