"""ggml's base library as llama-cpp-python ships it, loaded once on first use, with the functions tokenrelay calls
typed: the backend registry and scheduler (`kernels`, `repack`) and tensor names (`embedding_cut`)."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import llama_cpp

GGML_BASE_NAMES = ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll")
_SIGNATURES = {
    "ggml_backend_sched_get_n_backends": (ctypes.c_int, [ctypes.c_void_p]),
    "ggml_backend_sched_get_backend": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int]),
    "ggml_backend_get_device": (ctypes.c_void_p, [ctypes.c_void_p]),
    "ggml_backend_dev_type": (ctypes.c_int, [ctypes.c_void_p]),
    "ggml_backend_dev_backend_reg": (ctypes.c_void_p, [ctypes.c_void_p]),
    "ggml_backend_reg_get_proc_address": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "ggml_backend_buft_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_get_name": (ctypes.c_char_p, [ctypes.c_void_p]),
}


def library_dir() -> Path:
    return Path(llama_cpp.__file__).parent / "lib"


@functools.cache
def ggml_base() -> ctypes.CDLL | None:
    """The library with `_SIGNATURES` typed; None where llama-cpp-python ships none that loads."""
    path = next((library_dir() / name for name in GGML_BASE_NAMES if (library_dir() / name).exists()), None)
    if path is None:
        return None
    try:
        base = ctypes.CDLL(str(path))
    except OSError:
        return None
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(base, name)
        function.restype, function.argtypes = restype, argtypes
    return base
