"""`python -m llama_cpp.server` as a third-party node, with llama.cpp's weight repacking turned off.

llama-cpp-python builds llama.cpp with `-march=native`. On a CPU that advertises AMX, that build puts the
weights in the AMX buffer type (one of the "extra" buffer types that repacking uses), and some virtual
machines that advertise AMX fault on the first tile instruction: the node dies on its first decode. The
server has no flag for it, so this launcher makes llama.cpp's model defaults say "no extra buffer types"
and then runs the server module unchanged (its HTTP layer and request handling are the real ones).

Run as: python tests/llama_cpp_node.py --model FILE --host 127.0.0.1 --port N ...
"""

from __future__ import annotations

import runpy

import llama_cpp.llama_cpp as native

_library_defaults = native.llama_model_default_params


def _defaults_without_repacking() -> native.llama_model_params:
    params = _library_defaults()
    params.use_extra_bufts = False
    return params


if __name__ == "__main__":
    native.llama_model_default_params = _defaults_without_repacking
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
