"""The child process of the repacking check (see `cpu`): load a model with repacked weights and decode.

It evaluates a prompt of several rows (the multi-row kernels) and then single tokens, the two shapes a
serving step uses. Dying here, by a signal, is the answer the parent is asking for.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tokenrelay.backends.llamacpp.context import LlamaContext
from tokenrelay.backends.llamacpp.invariance import prefill
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.config import EngineSettings

PROMPT_ROWS = 16
SINGLE_STEPS = 4


def probe(path: Path) -> None:
    model = LlamaModel(path, repack_weights=True)
    context = LlamaContext(model, EngineSettings(prefill_chunk=PROMPT_ROWS, threads=1), sequences=1, cells=128)
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog. " * 4, add_special=True, parse_special=False)
    prefill(context, tokens[:PROMPT_ROWS], 0, PROMPT_ROWS)
    for step in range(SINGLE_STEPS):
        context.run([(tokens[0], PROMPT_ROWS + step, 0, True)])
    context.close()
    model.close()


if __name__ == "__main__":
    probe(Path(sys.argv[1]))
