"""What llama.cpp's Hadamard rotation of a Q8_0 cache's keys buys: the figure behind turning it off for invariance.

For each default model, three texts are read in one pass each with an F16 cache (the reference), a Q8_0 K cache with
the rotation and a Q8_0 K cache without it (`LLAMA_ATTN_ROT_DISABLE=1`, read when a cache is made); printed: the mean
and largest next-token KL divergence from the reference over every position, and how often the likeliest token agrees.
Row-by-row kernels throughout (`GGML_CPU_TILED_MM=0`), so only the cache differs.

    python benchmarks/kv_rotation.py [--tokens 400]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from servers import shared_data_dir  # noqa: E402

from tokenrelay.backends.llamacpp.context import LlamaContext  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import ensure_default_model, smollm2_path  # noqa: E402
from tokenrelay.backends.llamacpp.kernels import ROTATION_SWITCH, TILED_KERNEL_SWITCH  # noqa: E402
from tokenrelay.backends.llamacpp.model import LlamaModel  # noqa: E402
from tokenrelay.backends.llamacpp.sampling import logits_row  # noqa: E402
from tokenrelay.config import EngineSettings  # noqa: E402

MODELS = {"gemma-3-270m": ensure_default_model, "smollm2-135m-instruct": smollm2_path}
TEXTS = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a notebook. " * 8,
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n" * 6,
    "In 1969 the first people to walk on the Moon were Neil Armstrong and Buzz Aldrin, while Michael Collins " * 5,
)


def log_probs(model: LlamaModel, kv_type: str, rotated: bool, tokens: int) -> np.ndarray:
    """Next-token log-probabilities at every position of every text, read with the given K cache."""
    if rotated:
        os.environ.pop(ROTATION_SWITCH, None)
    else:
        os.environ[ROTATION_SWITCH] = "1"
    context = LlamaContext(model, EngineSettings(threads=2), 1, 1024, kv_type=kv_type)
    rows = []
    try:
        for text in TEXTS:
            ids = model.tokenize(text, add_special=True, parse_special=False)[:tokens]
            context.reset()
            indices = context.run([(token, i, 0, True) for i, token in enumerate(ids)])
            logits = np.stack([logits_row(context.ptr, i, model.n_vocab).copy() for i in indices])
            rows.append(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
    finally:
        context.close()
    return np.concatenate(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    os.environ[TILED_KERNEL_SWITCH] = "0"
    for name, locate in MODELS.items():
        model = LlamaModel(locate(shared_data_dir()))
        reference = log_probs(model, "f16", rotated=True, tokens=args.tokens)
        for label, rotated in (("Q8_0 K, rotated", True), ("Q8_0 K, not rotated", False)):
            got = log_probs(model, "q8_0", rotated, args.tokens)
            kl = np.sum(np.exp(reference) * (reference - got), axis=1)
            agree = np.mean(np.argmax(reference, axis=1) == np.argmax(got, axis=1))
            print(f"{name:22} {label:20} KL from F16 mean {kl.mean():.2e} max {kl.max():.2e}  top-1 agree {agree:.1%}")
        model.close()


if __name__ == "__main__":
    main()
