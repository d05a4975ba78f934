"""Pooling and normalisation of token embeddings, and what a GGUF's metadata says of its pooling."""

from __future__ import annotations

import numpy as np
import pytest

from tokenrelay.backends.llamacpp.pooling import Pooling, declared_pooling, is_encoder_only, l2_normalised, mean_pool


class FakeModel:
    """Stands for `LlamaModel`'s metadata reads."""

    def __init__(self, architecture: str, meta: dict[str, str]) -> None:
        self.architecture = architecture
        self._meta = meta

    def meta(self, key: str) -> str | None:
        return self._meta.get(key)


def test_mean_pool_averages_the_rows() -> None:
    rows = np.array([[1.0, 2.0, -3.0], [3.0, 0.0, 1.0]], dtype=np.float32)
    assert mean_pool(rows).tolist() == [2.0, 1.0, -1.0]


def test_mean_pool_of_the_same_rows_is_the_same_wherever_they_sat() -> None:
    rng = np.random.default_rng(7)
    mine = rng.standard_normal((13, 64)).astype(np.float32)
    batch = np.concatenate([rng.standard_normal((5, 64)), mine, rng.standard_normal((9, 64))]).astype(np.float32)
    assert mean_pool(batch[5:18]).tobytes() == mean_pool(mine).tobytes()


def test_l2_normalised_has_unit_length_and_keeps_direction() -> None:
    vector = l2_normalised(np.array([3.0, 4.0], dtype=np.float64))
    assert vector.dtype == np.float32
    assert vector.tolist() == pytest.approx([0.6, 0.8], abs=1e-7)
    long = l2_normalised(np.random.default_rng(1).standard_normal(640))
    assert float(np.linalg.norm(long.astype(np.float64))) == pytest.approx(1.0, abs=1e-6)


def test_a_zero_vector_stays_zero() -> None:
    assert l2_normalised(np.zeros(4)).tolist() == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("meta", "pooling"),
    [
        ({}, Pooling.NONE),
        ({"bert.pooling_type": "1"}, Pooling.MEAN),
        ({"bert.pooling_type": "2"}, Pooling.CLS),
        ({"bert.pooling_type": "3"}, Pooling.LAST),
        ({"bert.pooling_type": "4"}, Pooling.RANK),
        ({"bert.pooling_type": "0"}, Pooling.NONE),
        ({"bert.pooling_type": "-1"}, Pooling.NONE),
        ({"gemma3.pooling_type": "1"}, Pooling.NONE),  # another architecture's key
    ],
)
def test_declared_pooling_reads_the_architectures_key(meta: dict[str, str], pooling: Pooling) -> None:
    assert declared_pooling(FakeModel("bert", meta)) is pooling  # type: ignore[arg-type]


def test_encoder_models_are_those_without_causal_attention() -> None:
    assert is_encoder_only(FakeModel("bert", {"bert.attention.causal": "false"}))  # type: ignore[arg-type]
    assert not is_encoder_only(FakeModel("gemma3", {}))  # type: ignore[arg-type]
