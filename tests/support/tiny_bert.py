"""A tiny BERT-architecture GGUF with seeded random weights: an encoder embedding model for the tests.

No embedding GGUF ships in a package, so this writes one (with the `gguf` package) that llama.cpp loads as it
loads bge or e5: non-causal attention, a WordPiece vocabulary, mean pooling declared. Its vectors mean nothing;
what it exercises is the path (an encoder model, llama.cpp's own pooling, no generation).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_EMBD, N_FF, N_LAYER, N_HEAD, N_CTX = 64, 128, 2, 2, 128
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "paris",
    "is",
    "capital",
    "of",
    "france",
    "hello",
    "embeddings",
    "map",
    "text",
    "to",
    "vectors",
    "a",
    "an",
    "and",
]


def vocabulary() -> list[str]:
    """WordPiece as llama.cpp keeps it: a word-initial piece starts with U+2581, a continuation ("##x") is bare."""
    words = [f"\u2581{w}" for w in [*WORDS, *"abcdefghijklmnopqrstuvwxyz", ".", ","]]
    return list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *"abcdefghijklmnopqrstuvwxyz"]))


def write_tiny_bert(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tokens = vocabulary()
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_LAYER)
    writer.add_head_count(N_HEAD)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t.startswith("[") else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_type_count(2)
    writer.add_unk_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_bos_token_id(2)  # [CLS]
    writer.add_sep_token_id(3)
    writer.add_mask_token_id(4)

    def tensor(name: str, *shape: int, scale: float = 0.1) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name: str) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(N_EMBD, dtype=np.float32))

    tensor("token_embd.weight", len(tokens), N_EMBD)
    tensor("token_types.weight", 2, N_EMBD)
    tensor("position_embd.weight", N_CTX, N_EMBD)
    norm("token_embd_norm")
    for layer in range(N_LAYER):
        block = f"blk.{layer}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"{block}.{part}.weight", N_EMBD, N_EMBD)
            tensor(f"{block}.{part}.bias", N_EMBD)
        norm(f"{block}.attn_output_norm")
        tensor(f"{block}.ffn_up.weight", N_FF, N_EMBD)
        tensor(f"{block}.ffn_up.bias", N_FF)
        tensor(f"{block}.ffn_down.weight", N_EMBD, N_FF)
        tensor(f"{block}.ffn_down.bias", N_EMBD)
        norm(f"{block}.layer_output_norm")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
