"""A loaded GGUF model and its vocabulary, over llama-cpp-python's low-level (ctypes) API."""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from pathlib import Path

import llama_cpp

from tokenrelay.backends.llamacpp.kernels import choose_kernels
from tokenrelay.backends.llamacpp.repack import Overrides, repack_overrides

log = logging.getLogger(__name__)


_LLAMA_WARN, _LLAMA_ERROR = 3, 4  # ggml_log_level values (5 is CONT: a continuation, e.g. progress dots)
_native_log = logging.getLogger("tokenrelay.llama_cpp")
# What llama.cpp warns of when a decode is aborted, once per sequence: the scheduler aborts steps on purpose
# (abort_flag.py), so this is routine.
_ABORT_CLEANUP = "removing memory module entries"


def _forward_log(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
    """llama.cpp's own chatter goes to Python logging: warnings and errors by default, the rest at debug."""
    if not text:
        return
    message = text.decode("utf-8", errors="replace").rstrip()
    if not message:
        return
    if level == _LLAMA_ERROR:
        _native_log.error(message)
    elif level == _LLAMA_WARN and _ABORT_CLEANUP not in message:
        _native_log.warning(message)
    else:
        _native_log.debug(message)


@functools.cache
def init_backend() -> Callable[[int, bytes | None, ctypes.c_void_p], None]:
    """llama.cpp's process-wide initialisation, done once on first model load (never at import)."""
    callback = llama_cpp.llama_log_callback(_forward_log)  # returned (and cached) so it is never collected
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return callback


def _progress_callback(on_progress: Callable[[float], None] | None) -> Callable[[float, ctypes.c_void_p], bool] | None:
    if on_progress is None:
        return None

    def report(fraction: float, _user: ctypes.c_void_p) -> bool:
        on_progress(fraction)
        return True  # False would abort the load

    return llama_cpp.llama_progress_callback(report)


class LlamaModel:
    """Model weights plus tokenizer; shared by every context that serves it."""

    def __init__(
        self,
        path: Path,
        repack_weights: bool = False,
        on_progress: Callable[[float], None] | None = None,
        batch_invariant: bool = True,
        overrides: Overrides | None = None,
    ) -> None:
        """`overrides`: weights placed in other buffer types by name (`repack`)."""
        choose_kernels(batch_invariant)
        init_backend()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0
        # Repacked layouts compute rows in groups of four with a different summation order than one row
        # alone, so a sequence's logits would depend on how many others share its step.
        params.use_extra_bufts = repack_weights
        if overrides is not None:
            params.tensor_buft_overrides = overrides.pointer  # `overrides` stays referenced until loading returns
        self.repacked = repack_weights or overrides is not None
        callback = _progress_callback(on_progress)
        if callback is not None:
            params.progress_callback = callback  # `callback` stays referenced until loading returns
        self.path = path
        self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp could not load the model file {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.ptr)
        self._pieces: dict[tuple[int, bool], bytes] = {}

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None

    def repacked_copy(self) -> LlamaModel | None:
        """The same file loaded again with the weights this CPU repacks in their repacked layouts (`repack`), for
        a long slot; None when there are none, or these weights are repacked already."""
        overrides = None if self.repacked else repack_overrides(self.path)
        if overrides is None:
            return None
        return LlamaModel(self.path, overrides=overrides)

    # Metadata ---------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        size = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if size < 0:
            return None
        if size >= len(buf):  # chat templates can be large
            buf = ctypes.create_string_buffer(size + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def head_dim(self) -> int:
        """The width of an attention head's keys (the GGUF's key length, else the embedding split over heads)."""
        key_length = self.meta(f"{self.architecture}.attention.key_length")
        if key_length is not None and key_length.isdigit():
            return int(key_length)
        return llama_cpp.llama_model_n_embd(self.ptr) // max(1, llama_cpp.llama_model_n_head(self.ptr))

    @property
    def sliding_window(self) -> int:
        """Tokens the model's sliding-window layers attend over (0: it has none)."""
        return int(llama_cpp.llama_model_n_swa(self.ptr))

    @property
    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    # Special tokens ---------------------------------------------------------------------------------
    def special(self, name: str) -> int | None:
        """A special token id by llama.cpp's accessor name (`bos`, `eos`, `fim_pre`, ...), or None."""
        token = getattr(llama_cpp, f"llama_vocab_{name}")(self.vocab)
        return token if token >= 0 else None

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    @property
    def recurrent(self) -> bool:
        """The model keeps a running state rather than per-token cells (Mamba, RWKV, hybrids): its cache cannot
        be cut back to an earlier position."""
        return bool(llama_cpp.llama_model_is_recurrent(self.ptr) or llama_cpp.llama_model_is_hybrid(self.ptr))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    # Text <-> tokens --------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode()
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if count < 0:
            tokens = (llama_cpp.llama_token * -count)()
            count = llama_cpp.llama_tokenize(self.vocab, data, len(data), tokens, -count, add_special, parse_special)
        return list(tokens[:count])

    def count(self, text: str) -> int:
        """The tokens a piece of text (within a prompt or an answer: no special tokens added or read) makes."""
        return len(self.tokenize(text, add_special=False, parse_special=False)) if text else 0

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for (cached: detokenising is on every step's path)."""
        key = (token, special)
        cached = self._pieces.get(key)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            size = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if size < 0:
                buf = ctypes.create_string_buffer(-size)
                size = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            cached = self._pieces[key] = buf.raw[:size]
        return cached

    def token_text(self, token: int) -> str:
        """Display text of one token for logprobs (special tokens shown by name)."""
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")
