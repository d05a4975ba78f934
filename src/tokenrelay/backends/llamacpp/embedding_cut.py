"""Ending an embedding decode at the embedding: the output head's logits are never computed.

A llama.cpp context with embeddings on still evaluates its whole graph, a decoder model's output head included:
every token's logits over the vocabulary, which embeddings never read. With Gemma's 262,144-token vocabulary
that head is more than half of a decode's work. llama.cpp's public evaluation callback (`cb_eval`) lets a caller
ask to look at one node and stop the graph after it: asking for the node embeddings are read from, and stopping
there, leaves the head out. The context checks once that the cut changes no vector (`EmbeddingContext`).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import llama_cpp

# llama.cpp's name for the tensor `llama_get_embeddings` and `llama_get_embeddings_seq` read (pooled or not).
EMBEDDING_NODE = b"result_embd_pooled"
GGML_BASE_NAMES = ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll")


@functools.cache
def _node_name() -> Callable[[int], bytes | None]:
    """ggml's `ggml_get_name`, from the library llama-cpp-python ships (loaded once, on first use)."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    path = next((lib_dir / name for name in GGML_BASE_NAMES if (lib_dir / name).exists()), None)
    if path is None:
        raise RuntimeError(f"ggml's base library is not in {lib_dir}")
    function = ctypes.CDLL(str(path)).ggml_get_name
    function.restype = ctypes.c_char_p
    function.argtypes = [ctypes.c_void_p]
    return function


class EmbeddingCut:
    """The callback a context is made with; it stops the graph after the embedding node while `enabled`.

    llama.cpp calls it for each node (`ask` true: does the caller want this node?); for the node it asked for,
    it calls again once computed (`ask` false), and a False answer ends the graph there.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.seen = False  # whether a decode has passed the embedding node since `seen` was last cleared
        self._name = _node_name()
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)  # kept alive with the cut

    def _on_node(self, tensor: int, ask: bool, _user: int) -> bool:
        if not ask:
            return False  # only the embedding node is ever asked for: the graph ends after it
        if self._name(tensor) != EMBEDDING_NODE:
            return False
        self.seen = True
        return self.enabled
