"""A flag that stops a running `llama_decode`: set from any thread, read by llama.cpp's compute thread.

llama.cpp checks its abort callback between the nodes of a step's graph; when the callback says so, the decode
returns 2 and llama.cpp removes the step's positions from the KV cache, so the step can simply be run again.
The callback is a C function (`abort_flag.c`) reading an int: a Python callback would be called hundreds of
times a step and wait for the interpreter lock each time.
"""

from __future__ import annotations

import ctypes

import llama_cpp

from tokenrelay.backends.llamacpp import _abort_flag


class AbortFlag:
    """One int shared with llama.cpp: non-zero aborts the context's running decode (and the next ones, until
    cleared)."""

    def __init__(self) -> None:
        self._value = ctypes.c_int(0)
        library = ctypes.CDLL(_abort_flag.__file__)
        # Kept on the object: llama.cpp holds the pointers, which must live as long as the context.
        self.callback = llama_cpp.ggml_abort_callback(("tokenrelay_abort_requested", library))
        self.data = ctypes.cast(ctypes.pointer(self._value), ctypes.c_void_p)

    def set(self) -> None:
        self._value.value = 1

    def clear(self) -> None:
        self._value.value = 0
