"""Answer bodies: base64 is the float list's little-endian float32 bytes; `dimensions` truncates and renormalises."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tokenrelay.errors import InvalidRequest
from tokenrelay.openai.embeddings.render import body, encoded, truncated


def unit(values: list[float]) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float64)
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def test_base64_decodes_to_exactly_the_floats() -> None:
    vector = unit([0.1, -2.5, 3.3333, 1e-7, 42.0])
    floats = encoded(vector, as_base64=False)
    packed = encoded(vector, as_base64=True)
    assert isinstance(floats, list) and isinstance(packed, str)
    decoded = np.frombuffer(base64.b64decode(packed), dtype="<f4")
    assert decoded.tolist() == floats  # the same float32 values, bit for bit
    assert len(base64.b64decode(packed)) == 4 * len(vector)


def test_floats_are_the_float32_values_written_exactly() -> None:
    vector = unit([1.0, 2.0, 3.0])
    assert np.asarray(encoded(vector, as_base64=False), dtype=np.float32).tobytes() == vector.tobytes()


def test_truncation_keeps_the_head_and_restores_unit_length() -> None:
    vector = unit([3.0, 4.0, 12.0, 84.0])
    short = truncated(vector, 2)
    assert short.dtype == np.float32 and len(short) == 2
    assert np.isclose(np.linalg.norm(short.astype(np.float64)), 1.0, atol=1e-6)
    assert np.allclose(short, [0.6, 0.8], atol=1e-6)  # the direction of the first two components


def test_truncation_to_the_full_length_changes_nothing_but_rounding() -> None:
    vector = unit([1.0, -1.0, 2.0])
    assert np.allclose(truncated(vector, 3), vector, atol=1e-7)


def test_more_dimensions_than_the_model_has_is_a_400() -> None:
    with pytest.raises(InvalidRequest) as caught:
        truncated(unit([1.0, 2.0]), 3)
    assert caught.value.param == "dimensions"


def test_the_body_lists_every_vector_in_order() -> None:
    vectors = [unit([1.0, 0.0]), unit([0.0, 1.0]), unit([1.0, 1.0])]
    answer = body("m", vectors, prompt_tokens=9, as_base64=False)
    assert answer["object"] == "list" and answer["model"] == "m"
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    assert {d["object"] for d in answer["data"]} == {"embedding"}
    assert answer["data"][1]["embedding"] == vectors[1].tolist()
    assert answer["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
