"""A llama.cpp context with several sequence slots, and the batch that feeds it."""

from __future__ import annotations

import ctypes
from concurrent.futures import Future

import llama_cpp

from tokenrelay.backends.llamacpp.abort_flag import AbortFlag
from tokenrelay.backends.llamacpp.kernels import PassKernels
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.native_thread import native_thread, side_thread
from tokenrelay.config import EngineSettings

State = ctypes.Array[ctypes.c_uint8]  # a sequence's cells, saved
KV_TYPES = {"q8_0": llama_cpp.GGML_TYPE_Q8_0, "f16": llama_cpp.GGML_TYPE_F16}
# Query rows of one sequence from which llama.cpp's CPU flash attention over an F16 cache takes its tiled kernel
# (outside `use_ref`: see `kernels`); fewer take the row-by-row one, which sums in another order.
ATTENTION_TILE = 64


def step_rows(settings: EngineSettings, sequences: int, cells: int, overrun: int = 0) -> int:
    """Rows one step holds: prompt tokens (`prefill_chunk`, and `overrun` more, within what the context holds
    beside a token per sequence: llama.cpp refuses a step larger than its context) plus a token per sequence."""
    return min(settings.prefill_chunk + overrun, cells * sequences - sequences) + sequences


def cells_per_sequence(cells: int) -> int:
    """What llama.cpp makes of a sequence's cells in a cache kept per sequence: a multiple of 256."""
    return -(-cells // 256) * 256


class LlamaContext:
    """One context, `sequences` sequences of `cells` KV cells each. KV is kept per sequence (not unified) so that a
    sequence's attention sums run over its own cells in position order whether it decodes alone or beside others:
    that is what makes greedy output independent of what else is running (see README, "Batch invariance"). In
    llama.cpp's unified cache a sequence's cells land wherever others left holes, and attention sums in cell order.
    """

    def __init__(
        self,
        model: LlamaModel,
        settings: EngineSettings,
        sequences: int,
        cells: int,
        kv_type: str | None = None,
        flash_attention: bool = True,
        v_type: str | None = None,
        swa_full: bool = True,
        overrun: int = 0,
    ) -> None:
        """`overrun`: rows a step may hold beyond its prompt budget (`step_prefill`): where a prompt's last piece
        takes the prompt's rest (`Lane.unit`)."""
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = cells * sequences
        params.n_seq_max = sequences
        # A step is one batch: its prompt tokens plus a token per sequence, all in one call.
        capacity = step_rows(settings, sequences, cells, overrun)
        params.n_batch = params.n_ubatch = capacity
        params.n_threads = settings.threads
        params.n_threads_batch = settings.threads
        # Sliding-window layers keep every cell, so cached prefixes can be reused, unless told (`windows`).
        params.swa_full = swa_full
        params.kv_unified = settings.kv_unified
        # llama.cpp's CPU flash attention has special kernels for F16/F32 caches that it picks by batch shape: a
        # split over the KV length for one query row of one sequence once the cache passes 256 cells, and a
        # tiled kernel for 64 or more query rows of a sequence. Each sums in its own order, so a sequence's
        # logits would depend on what shares its step. With a Q8_0 K cache every row takes the row-by-row kernel.
        kv = kv_type or settings.kv_type
        v = v_type or kv_type or settings.v_type  # a lane that names its cache type names both halves
        if not flash_attention and v != "f16":
            raise ValueError("a quantised V cache needs flash attention")
        enabled, disabled = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.flash_attn_type = enabled if flash_attention else disabled
        params.type_k, params.type_v = KV_TYPES[kv], KV_TYPES[v]
        params.no_perf = True
        self.kv_type, self.v_type = kv, v
        self.threads = settings.threads
        self.abort = AbortFlag()  # the scheduler stops a background step with it (scheduler.py)
        params.abort_callback, params.abort_callback_data = self.abort.callback, self.abort.data
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise RuntimeError("llama.cpp could not create a context (out of memory?)")
        self.model = model
        # The kernels of each pass, chosen by what it computes (`kernels`); None: one choice for every pass.
        self.kernels = PassKernels.of(self.ptr) if settings.batch_invariant else None
        self.memory = llama_cpp.llama_get_memory(self.ptr)
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self.ptr)
        self.step_prefill = step_rows(settings, sequences, cells) - sequences  # a step's budget of prompt tokens
        self.batch = Batch(capacity)

    def close(self) -> None:
        self.batch.close()
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None

    def decode(self, prompt: bool = False) -> int:
        """llama_decode's status: 0 done, 2 aborted (`abort`; the step's cells are already removed), else failed.
        `prompt`: the batch holds prompt pieces only, no decoding sequence's rows (`kernels`)."""
        if self.kernels is not None:
            self.kernels.choose(prompt)
        return native_thread().run(llama_cpp.llama_decode, self.ptr, self.batch.raw)

    def decode_beside(self) -> Future[int]:
        """`decode` of prompt pieces on the side thread, with one thread (`set_threads` first); returns at once."""
        if self.kernels is not None:
            self.kernels.choose(prompt=True)
        return side_thread().submit(llama_cpp.llama_decode, self.ptr, self.batch.raw)

    @property
    def decoded_cells_as_prompted(self) -> bool:
        """Whether a decoding step computes a token's cells as a prompt piece would: not where the two take
        different kernels (`kernels`)."""
        return self.kernels is None

    def set_threads(self, threads: int) -> None:
        """The threads of this context's next decodes."""
        if threads != self.threads:
            llama_cpp.llama_set_n_threads(self.ptr, threads, threads)
            self.threads = threads

    @property
    def thread_invariant_steps(self) -> bool:
        """Whether a one-row step computes the same at any thread count. For one query row over an F16 or F32
        cache, llama.cpp's attention splits the cells among the threads and adds up their parts, so the sum
        depends on how many there are; over a quantised cache each row is one thread's. Steps of several rows,
        and the matrix products, are cut by rows among threads at any cache type. (That split needs K and V of one
        type, and is never taken under `use_ref`: where kernels are chosen pass by pass, decoding passes do not
        split, but a prompt piece of one row may, so this answers for both.)"""
        return self.kv_type not in ("f16", "f32") or self.v_type != self.kv_type

    def run(self, rows: list[tuple[int, int, int, bool]], prompt: bool = False) -> list[int]:
        """One decode over (token, position, sequence, wants logits) rows, outside the scheduler's steps (the
        start-up probes), of prompt pieces or not (`decode`); returns the rows' indices for reading their logits."""
        self.batch.clear()
        indices = [self.batch.add(*row) for row in rows]
        if self.decode(prompt) != 0:
            raise RuntimeError("llama_decode failed")
        return indices

    def keep_prefix(self, seq_id: int, keep: int) -> bool:
        """Drop a sequence's cells from position `keep` on; False when the cache cannot cut there."""
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq_id, keep, -1))

    def clear(self, seq_id: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, -1, -1)

    def reset(self) -> None:
        """Every sequence's cells dropped, and the next ones laid out from the first cell again."""
        llama_cpp.llama_memory_clear(self.memory, True)

    def save(self, seq_id: int, window_only: bool = False) -> State:
        """A sequence's cells, as `load` takes them; with `window_only`, those of the sliding-window layers, as
        `load_window` takes them."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY if window_only else 0
        size = llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq_id, flags)
        state = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(self.ptr, state, size, seq_id, flags) != size:
            raise RuntimeError("llama.cpp could not save a sequence's cells")
        return state

    def load(self, seq_id: int, state: State) -> None:
        """A sequence's cells as `save` had them, laid out from the first cell on: the context is emptied first (it
        must hold this sequence only), so where each cell lands does not depend on what came before."""
        self.reset()
        self._restore(seq_id, state, 0)

    def load_window(self, seq_id: int, state: State) -> None:
        """A sequence's sliding-window cells as `save(window_only=True)` had them, in place of the ones it has;
        they go where llama.cpp's search for free cells starts."""
        self._restore(seq_id, state, llama_cpp.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY)

    def _restore(self, seq_id: int, state: State, flags: int) -> None:
        if llama_cpp.llama_state_seq_set_data_ext(self.ptr, state, len(state), seq_id, flags) != len(state):
            raise RuntimeError("llama.cpp could not restore a sequence's cells")

    def copy(self, src: int, dst: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, dst, -1, -1)
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, -1, -1)


class Batch:
    """A reusable `llama_batch`, filled token by token."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, 1)
        self.size = 0

    def clear(self) -> None:
        self.size = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        i = self.size
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq_id
        raw.logits[i] = logits
        self.size += 1
        raw.n_tokens = self.size
        return i

    def close(self) -> None:
        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None
