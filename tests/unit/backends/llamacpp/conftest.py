"""The default Gemma model loaded in process, for the tests that drive llama.cpp directly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import shared_data_dir

from tokenrelay.backends.llamacpp.default_model import ensure_default_model
from tokenrelay.backends.llamacpp.model import LlamaModel


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaModel]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GGML_CPU_TILED_MM", "0")  # what the server sets (batch-invariant kernels); gone after the module
        loaded = LlamaModel(ensure_default_model(shared_data_dir()))
        yield loaded
        loaded.close()
