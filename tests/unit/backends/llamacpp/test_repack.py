"""A long slot's copy of the weights in llama.cpp's repacked layouts: which weights, and that the copy computes
the model."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from tokenrelay.backends.llamacpp.context import LlamaContext
from tokenrelay.backends.llamacpp.cpu import build_features
from tokenrelay.backends.llamacpp.invariance import prefill
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.repack import repack_overrides
from tokenrelay.backends.llamacpp.sampling import logits_row
from tokenrelay.config import EngineSettings

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or "AVX2 = 1" not in build_features(), reason="llama.cpp repacks on x86 with AVX2"
)
PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a small notebook. "
    "He wrote down the colour of the sky, the direction of the wind and the ships he could see on the horizon. "
    "After forty years the notebooks filled three shelves, and a historian from the university came to read them. "
    "She found that the keeper had recorded"
)
REPACKED = {GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_K, GGMLQuantizationType.IQ4_NL}


def test_the_copy_repacks_the_weights_llama_cpp_repacks_on_this_cpu_and_no_others(model: LlamaModel) -> None:
    overrides = repack_overrides(model.path)
    assert overrides is not None
    # The gguf package's reader is the independent account of each weight's type and shape (ne[1]: its rows).
    tensors = GGUFReader(model.path).tensors
    expected = {t.name for t in tensors if t.tensor_type in REPACKED and len(t.shape) == 2 and t.shape[1] % 8 == 0}
    named = overrides.pattern.decode().removeprefix("^(").removesuffix(")$").replace("\\.", ".").split("|")
    assert set(named) == expected and len(expected) > 0


def test_the_repacked_copy_computes_what_the_model_does(model: LlamaModel) -> None:
    copy = model.repacked_copy()
    assert copy is not None and copy.repacked and not model.repacked
    tokens = model.tokenize(PARAGRAPH, add_special=True, parse_special=False)
    settings = EngineSettings(threads=2)
    logits = []
    try:
        for weights in (model, copy):
            context = LlamaContext(weights, settings, 1, 1024, kv_type="f16", swa_full=False)
            row = prefill(context, tokens, 0, 128)
            logits.append(logits_row(context.ptr, row, model.n_vocab).copy())
            context.close()
    finally:
        copy.close()
    plain, repacked = (log_softmax(row) for row in logits)
    # Another summation order: close, not equal (row-by-row against tiled kernels differ as much).
    assert not np.array_equal(plain, repacked)
    assert np.argmax(plain) == np.argmax(repacked)
    assert float(np.sum(np.exp(plain) * (plain - repacked))) < 0.05  # KL divergence of the next-token distributions


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - np.max(logits)
    return shifted - np.log(np.sum(np.exp(shifted)))
