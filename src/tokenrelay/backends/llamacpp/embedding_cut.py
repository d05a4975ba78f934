"""Ending an embedding decode at the embedding: the output head's logits are never computed.

A llama.cpp context with embeddings on still evaluates its whole graph, a decoder model's output head included:
every token's logits over the vocabulary, which embeddings never read. With Gemma's 262,144-token vocabulary
that head is more than half of a decode's work. llama.cpp's public evaluation callback (`cb_eval`) lets a caller
ask to look at one node and stop the graph after it: asking for the node embeddings are read from, and stopping
there, leaves the head out. The context checks once that the cut changes no vector (`EmbeddingContext`).
"""

from __future__ import annotations

from collections.abc import Callable

import llama_cpp

from tokenrelay.backends.llamacpp.ggml_library import ggml_base, library_dir

# llama.cpp's name for the tensor `llama_get_embeddings` and `llama_get_embeddings_seq` read (pooled or not).
EMBEDDING_NODE = b"result_embd_pooled"


def _node_name() -> Callable[[int], bytes | None]:
    """ggml's `ggml_get_name`, from the library llama-cpp-python ships (`ggml_library`)."""
    base = ggml_base()
    if base is None:
        raise RuntimeError(f"ggml's base library is not in {library_dir()}")
    function: Callable[[int], bytes | None] = base.ggml_get_name
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
