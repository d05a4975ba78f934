"""How token embeddings become one vector per input: the pooling a GGUF declares, and L2 normalisation."""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import numpy.typing as npt

from tokenrelay.backends.llamacpp.model import LlamaModel


class Pooling(IntEnum):
    """llama.cpp's `llama_pooling_type` values."""

    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4


def declared_pooling(model: LlamaModel) -> Pooling:
    """What the GGUF declares (`<arch>.pooling_type`); none declared reads as NONE."""
    value = model.meta(f"{model.architecture}.pooling_type")
    if value is None or not value.lstrip("-").isdigit():
        return Pooling.NONE
    number = int(value)
    return Pooling(number) if number in Pooling._value2member_map_ else Pooling.NONE


def is_encoder_only(model: LlamaModel) -> bool:
    """A GGUF whose attention is not causal (BERT, nomic-bert, ...): it embeds and cannot generate."""
    return model.meta(f"{model.architecture}.attention.causal") == "false"


def mean_pool(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """The mean of one input's token embeddings (rows), summed in float64 in position order: the same rows
    give the same mean whatever else shared their decode."""
    return rows.astype(np.float64).mean(axis=0)


def l2_normalised(vector: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """The vector scaled to unit length (a zero vector stays zero), as float32."""
    as_double = vector.astype(np.float64)
    norm = float(np.linalg.norm(as_double))
    if norm > 0.0:
        as_double = as_double / norm
    return as_double.astype(np.float32)
