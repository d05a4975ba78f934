"""Kernels chosen pass by pass: a prompt piece computes a token the same whatever shares its pass, however the
prompt is cut and on any thread count, and otherwise than a decoding step does."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from tokenrelay.backends.llamacpp.context import ATTENTION_TILE, LlamaContext
from tokenrelay.backends.llamacpp.cpu import build_features
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.sampling import logits_row
from tokenrelay.config import EngineSettings

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or "AVX2 = 1" not in build_features(),
    reason="llama.cpp's tiled K-quant kernel is built for x86 with AVX2",
)
SENTENCE = "The ferry left the harbour at noon with forty passengers, two cars and a crate of oranges. "
OTHER = "A recipe for bread needs flour, water, salt and patience, and the oven must be hot. "


def evaluate(
    context: LlamaContext, model: LlamaModel, pieces: list[int], beside: int = 0, prompt: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """A prompt read in passes of `pieces` tokens (the first beside `beside` tokens of another sequence), then one
    decoding step: the logits after the prompt's last token and after the step (which read the prompt's cells)."""
    tokens = model.tokenize(SENTENCE * 30, add_special=True, parse_special=False)[: sum(pieces)]
    other = model.tokenize(OTHER * 10, add_special=True, parse_special=False)[:beside]
    context.reset()
    start, last = 0, 0
    for index, size in enumerate(pieces):
        rows = [(t, start + i, 0, start + i == len(tokens) - 1) for i, t in enumerate(tokens[start : start + size])]
        if index == 0:
            rows += [(t, i, 1, False) for i, t in enumerate(other)]
        indices = context.run(rows, prompt=prompt)
        last = indices[[wants for *_, wants in rows].index(True)] if index == len(pieces) - 1 else last
        start += size
    after_prompt = logits_row(context.ptr, last, model.n_vocab).copy()
    row = context.run([(tokens[0], len(tokens), 0, True)])[0]
    return after_prompt, logits_row(context.ptr, row, model.n_vocab).copy()


def test_a_prompt_piece_computes_a_token_the_same_however_the_prompt_is_cut_and_whatever_shares_its_pass(
    model: LlamaModel,
) -> None:
    # Over a Q8_0 K cache attention is row by row at any cut: what differs here is the matrix kernel.
    context = LlamaContext(model, EngineSettings(threads=2, kv_type="q8_0"), 4, 1024)
    try:
        assert context.kernels is not None and not context.decoded_cells_as_prompted
        reference = evaluate(context, model, [512, 88])
        cuts = (([300, 300], 0, 2), ([5, 507, 88], 0, 2), ([400, 200], 100, 2), ([512, 88], 0, 1))
        for pieces, beside, threads in cuts:
            context.set_threads(threads)
            again = evaluate(context, model, pieces, beside)
            assert all(np.array_equal(a, b) for a, b in zip(again, reference, strict=True)), (pieces, beside, threads)
        # The same tokens read as decoding rows take the row-by-row kernels: close, but not the same sums.
        context.set_threads(2)
        as_decoded, _ = evaluate(context, model, [512, 88], prompt=False)
        assert not np.array_equal(as_decoded, reference[0])
        decoded, prompted = (row - np.logaddexp.reduce(row) for row in (as_decoded, reference[0]))
        assert float(np.sum(np.exp(prompted) * (prompted - decoded))) < 0.1  # KL of the next-token distributions
    finally:
        context.close()


def test_over_an_f16_cache_a_prompt_piece_computes_a_token_the_same_in_any_piece_of_a_tile_of_rows_or_more(
    model: LlamaModel,
) -> None:
    # Attention takes its tiled kernel from a tile of rows per sequence, and computes each row alone in it: the cuts
    # may fall anywhere (`Lane.unit`), as long as each piece, and each sequence's share of a pass, has a tile.
    tile = ATTENTION_TILE
    context = LlamaContext(model, EngineSettings(threads=2, kv_type="f16"), 4, 1024, overrun=tile - 1)
    try:
        assert context.kernels is not None
        reference = evaluate(context, model, [575])
        cuts = (([tile, 511], 0, 2), ([2 * tile, 447], tile, 2), ([320, 255], 0, 2), ([575], 0, 1))
        for pieces, beside, threads in cuts:
            context.set_threads(threads)
            again = evaluate(context, model, pieces, beside)
            assert all(np.array_equal(a, b) for a, b in zip(again, reference, strict=True)), (pieces, beside, threads)
        # A piece under a tile takes the row-by-row attention: its last tokens' cells, and the logits, differ.
        context.set_threads(2)
        assert not np.array_equal(evaluate(context, model, [535, 40])[0], reference[0])
    finally:
        context.close()
