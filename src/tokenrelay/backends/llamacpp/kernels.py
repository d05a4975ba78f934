"""Which kernels llama.cpp multiplies K-quant weights with, chosen pass by pass for batch invariance.

llama.cpp's CPU backend has two ways to multiply K-quant weights (Q4_K, Q6_K, ...): row-by-row `vec_dot` kernels,
whose cost per row is about that of one decoded token, and a tiled kernel (ggml-cpu/tiled) that evaluates a
prompt about a fifth faster but a few rows slower. Left to itself it picks by the number of rows in the pass (8 or
more: tiled), and the two sum in different orders, so a sequence's logits would depend on what shares its step.

Batch-invariant serving fixes the kernel by what a pass computes, never by its size:
- a pass that holds decoding sequences (their next token, their guesses) takes the row-by-row kernels at any row
  count: the CPU backend's own `use_ref` switch, which also leaves out llama.cpp's fusion of two small operations;
- a pass of prompt pieces only takes the tiled kernel at any row count (`GGML_CPU_TILED_MM_FORCE=1`).
Each kernel computes a row the same however many rows share its pass and however many threads run it, so a token's
cells and logits depend only on whether a prompt piece or a decoding step computed them. The scheduler keeps those
apart (`Scheduler._pass`) and reuses only cells a prompt piece computed (`Scheduler._reusable`).

Under `use_ref` llama.cpp also computes the Hadamard rotation it applies to the keys of a quantised cache
(`attn_rot_k`) as a plain matrix product, whose kernel it picks by shape: decoding sequences then changed each
other's logits (measured). So the rotation is turned off (`LLAMA_ATTN_ROT_DISABLE=1`, read when a cache is made). It
buys little for a Q8_0 K cache: next-token KL divergence from an F16 cache's logits 2.44e-3 with it and 2.63e-3
without on Gemma 3 270M, 1.88e-3 and 2.30e-3 on SmolLM2 135M, the same top-1 agreement (`benchmarks/kv_rotation.py`).

`use_ref` belongs to a context's CPU backend, which llama.cpp's C API does not hand out; it is reached through
`llama_context::get_sched`, a C++ method libllama exports, and ggml's public scheduler API. Where that method is
missing, every pass takes the row-by-row kernels (`GGML_CPU_TILED_MM=0`), invariant too, with prompts slower.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp

from tokenrelay.backends.llamacpp.ggml_library import ggml_base

TILED_KERNEL_SWITCH = "GGML_CPU_TILED_MM"  # 0: the row-by-row kernels at every row count
TILED_KERNEL_FORCE = "GGML_CPU_TILED_MM_FORCE"  # 1: the tiled kernel at every row count
ROTATION_SWITCH = "LLAMA_ATTN_ROT_DISABLE"  # 1: no Hadamard rotation of a quantised cache's keys
# The Itanium C++ ABI's name of `ggml_backend_sched_t llama_context::get_sched() const` (Linux, macOS).
_GET_SCHED = "_ZNK13llama_context9get_schedEv"
_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU
_SetUseRef = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_bool)


def choose_kernels(batch_invariant: bool) -> None:
    """Before llama.cpp's first multiplication, which reads these switches once for the process: for batch
    invariance, the tiled kernel at every row count where passes can be switched to the row-by-row ones
    (`PassKernels`, with the keys' rotation off), else the row-by-row kernels everywhere; without it, llama.cpp's
    pick by shape. An operator's own setting of a kernel switch wins; the start-up probe reports the outcome."""
    if batch_invariant and TILED_KERNEL_SWITCH not in os.environ and TILED_KERNEL_FORCE not in os.environ:
        for name, value in invariant_switches().items():
            os.environ.setdefault(name, value)


def invariant_switches() -> dict[str, str]:
    """The switches batch invariance sets: the tiled kernel at every row count and no rotation where a pass can
    take the row-by-row ones instead, else the row-by-row ones everywhere."""
    if _ggml() is None:
        return {TILED_KERNEL_SWITCH: "0"}
    return {TILED_KERNEL_FORCE: "1", ROTATION_SWITCH: "1"}


@dataclass
class _Ggml:
    get_sched: Callable[[int], int]
    base: ctypes.CDLL


@functools.cache
def _ggml() -> _Ggml | None:
    """libllama's `get_sched` and ggml's base library, typed; None where this build lacks either."""
    base = ggml_base()
    try:
        get_sched = llama_cpp.llama_cpp._lib[_GET_SCHED]
    except AttributeError:
        return None
    if base is None:
        return None
    get_sched.restype, get_sched.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    return _Ggml(get_sched, base)


class PassKernels:
    """A context's choice of kernels for its next pass: row-by-row for decoding steps, tiled for prompt pieces."""

    def __init__(self, backend: int, set_use_ref: Callable[[int, bool], None]) -> None:
        self._backend = backend
        self._set_use_ref = set_use_ref
        self._row_by_row: bool | None = None

    @classmethod
    def of(cls, context: int) -> PassKernels | None:
        """The switch of a context's CPU backend, where the process runs the tiled kernel at every row count
        without the keys' rotation (`choose_kernels`) and this build exposes the switch; else None (one kernel for
        every pass)."""
        ggml = _ggml()
        switches = {name: os.environ.get(name) for name in (TILED_KERNEL_SWITCH, TILED_KERNEL_FORCE, ROTATION_SWITCH)}
        if ggml is None or switches != {TILED_KERNEL_SWITCH: None, TILED_KERNEL_FORCE: "1", ROTATION_SWITCH: "1"}:
            return None
        base = ggml.base
        sched = ggml.get_sched(context)
        for index in range(base.ggml_backend_sched_get_n_backends(sched)):
            backend = base.ggml_backend_sched_get_backend(sched, index)
            device = base.ggml_backend_get_device(backend)
            if base.ggml_backend_dev_type(device) != _CPU_DEVICE:
                continue
            registry = base.ggml_backend_dev_backend_reg(device)
            address = base.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_cpu_set_use_ref")
            return cls(backend, _SetUseRef(address)) if address else None
        return None

    def choose(self, prompt: bool) -> None:
        """Tiled kernels for a pass of prompt pieces only, row-by-row ones for a pass with decoding rows."""
        row_by_row = not prompt
        if row_by_row != self._row_by_row:
            self._set_use_ref(self._backend, row_by_row)
            self._row_by_row = row_by_row
