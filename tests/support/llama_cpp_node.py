"""`python -m llama_cpp.server` as a third-party node, with llama.cpp's weight repacking turned off.

llama-cpp-python builds llama.cpp with `-march=native`. On a CPU that advertises AMX, that build puts the
weights in the AMX buffer type (one of the "extra" buffer types that repacking uses), and some virtual
machines that advertise AMX fault on the first tile instruction: the node dies on its first decode. The
server has no flag for it, so this launcher makes llama.cpp's model defaults say "no extra buffer types"
and then runs the server module unchanged (its HTTP layer and request handling are the real ones).

The server has no pooling flag either: `--pooling_type N` (llama.cpp's `llama_pooling_type`, taken off the
command line here) becomes the default of its `Llama` objects. An embedding node (`--embedding true`) needs it
for a model that declares no pooling (Gemma), or it answers with one vector per token.

Run as: python tests/llama_cpp_node.py --model FILE --host 127.0.0.1 --port N ...
"""

from __future__ import annotations

import functools
import runpy
import sys
from typing import Any

import llama_cpp.llama as high_level
import llama_cpp.llama_cpp as native

_library_defaults = native.llama_model_default_params


def _defaults_without_repacking() -> native.llama_model_params:
    params = _library_defaults()
    params.use_extra_bufts = False
    return params


def _take_option(name: str) -> str | None:
    if name not in sys.argv:
        return None
    at = sys.argv.index(name)
    value = sys.argv[at + 1]
    del sys.argv[at : at + 2]
    return value


def _pool_by_default(pooling: int) -> None:
    init = high_level.Llama.__init__

    @functools.wraps(init)
    def pooled(self: high_level.Llama, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("pooling_type", pooling)
        init(self, *args, **kwargs)

    high_level.Llama.__init__ = pooled  # type: ignore[method-assign]


if __name__ == "__main__":
    native.llama_model_default_params = _defaults_without_repacking
    pooling = _take_option("--pooling_type")
    if pooling is not None:
        _pool_by_default(int(pooling))
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
