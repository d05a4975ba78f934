"""A model's settings decide whether it embeds and whether `dimensions` may shorten its vectors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenrelay.config import ModelSettings
from tokenrelay.errors import InvalidRequest
from tokenrelay.openai.embeddings.serving import check_settings
from tokenrelay.protocol.embeddings import EmbeddingRequest


def request(**fields: Any) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate_json(json.dumps({"model": "m", "input": "x", **fields}), strict=True)


def settings(**fields: Any) -> ModelSettings:
    return ModelSettings(id="m", path="/models/m.gguf", **fields)


def test_embeddings_are_on_by_default() -> None:
    check_settings(request(), settings())
    check_settings(request(), None)  # a model that registered nodes brought


def test_a_model_with_embeddings_off_is_a_400_naming_model() -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_settings(request(), settings(embeddings=False))
    assert caught.value.param == "model"


@pytest.mark.parametrize("configured", [settings(), None])
def test_dimensions_needs_a_truncatable_model(configured: ModelSettings | None) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_settings(request(dimensions=8), configured)
    assert caught.value.param == "dimensions"


def test_dimensions_on_a_truncatable_model_is_accepted() -> None:
    check_settings(request(dimensions=8), settings(embeddings_truncatable=True))
