"""A long slot's copy of the weights in llama.cpp's repacked CPU layouts (`engine.long_repack`).

llama.cpp multiplies Q4_0, Q4_K and IQ4_NL weights on x86 with AVX2 faster than its row-by-row kernels once their
rows are interleaved in groups of eight (its `CPU_REPACK` buffer type, ggml-cpu/repack.cpp): a long prompt evaluates
8-11% faster with Gemma 3's Q4_K layers where prompt pieces take the row-by-row kernels, and no faster than with the
tiled kernel they take where passes choose their kernels (`kernels`; docs/benchmarks.md), hence off by default.
Those kernels take activation rows four at a time, so a row's sum depends on how many rows share its step, which
the short slots' mixed steps cannot allow; a long slot's steps are a function of its one sequence
(`scheduler.open_lanes`), so there it stays invariant. The long slot therefore gets a second load of the model file
with just those weights placed in `CPU_REPACK` (the other weights stay mapped from the file, shared with the first
load through the page cache).

Placed by name (llama.cpp's tensor buffer-type overrides) rather than with llama.cpp's own choice of extra buffer
types, which takes the AMX type first on CPUs that advertise it, and some virtual machines fault on AMX
(`cpu.py`). llama.cpp does not say which weights a buffer type takes, so the rule of its x86 code is written here,
and other CPUs get no copy.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp

from tokenrelay.backends.llamacpp.cpu import build_features
from tokenrelay.backends.llamacpp.ggml_library import ggml_base, library_dir
from tokenrelay.models.gguf_header import NotGguf, read_tensors

REPACK_BUFFER = b"CPU_REPACK"
# ggml-cpu/repack.cpp, x86 with AVX2: these types, for matrices whose rows come in groups of eight.
X86_TYPES = {llama_cpp.GGML_TYPE_Q4_0, llama_cpp.GGML_TYPE_Q4_K, llama_cpp.GGML_TYPE_IQ4_NL}
ROW_GROUP = 8
_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


class _Override(ctypes.Structure):
    """llama.h's `llama_model_tensor_buft_override`: a regex over tensor names, and the buffer type they go to."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class Overrides:
    """A null-terminated override list for `llama_model_params.tensor_buft_overrides`; kept alive while loading."""

    pattern: bytes
    buffer_type: int
    entries: ctypes.Array[_Override] = field(init=False)

    def __post_init__(self) -> None:
        self.entries = (_Override * 2)(_Override(self.pattern, self.buffer_type), _Override(None, None))

    @property
    def pointer(self) -> int | None:
        return ctypes.cast(self.entries, ctypes.c_void_p).value


def repack_overrides(path: Path) -> Overrides | None:
    """Where the long slot's repacked weights go, or None when this CPU, build or file has none to repack."""
    if platform.machine().lower() not in ("x86_64", "amd64") or "AVX2 = 1" not in build_features():
        return None
    buffer_type = _repack_buffer_type()
    if buffer_type is None:
        return None
    try:
        names = [t.name for t in read_tensors(path) if t.ggml_type in X86_TYPES and _interleaves(t.shape)]
    except (OSError, NotGguf):
        return None
    if not names:
        return None
    return Overrides(("^(" + "|".join(re.escape(name) for name in names) + ")$").encode(), buffer_type)


def _interleaves(shape: tuple[int, ...]) -> bool:
    """A matrix whose rows come in groups of eight; a stack of experts' matrices is left to llama.cpp's own choice."""
    return len(shape) == 2 and shape[1] % ROW_GROUP == 0


@functools.cache
def _repack_buffer_type() -> int | None:
    """llama.cpp's `CPU_REPACK` buffer type, found through ggml's backend registry (None where it has none)."""
    base = ggml_base()
    try:
        ggml = ctypes.CDLL(str(library_dir() / "libggml.so"))
    except OSError:
        return None
    if base is None:
        return None
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    device = ggml.ggml_backend_dev_by_type(_CPU_DEVICE)
    if not device:
        return None
    registry = base.ggml_backend_dev_backend_reg(device)
    address = base.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return None
    extra_types = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
    index = 0
    while extra_types[index]:
        if base.ggml_backend_buft_name(extra_types[index]) == REPACK_BUFFER:
            return int(extra_types[index])
        index += 1
    return None
