"""The default Gemma model loaded in process, for the tests that drive llama.cpp directly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import shared_data_dir

from tokenrelay.backends.llamacpp.default_model import ensure_default_model
from tokenrelay.backends.llamacpp.kernels import invariant_switches
from tokenrelay.backends.llamacpp.model import LlamaModel


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaModel]:
    with pytest.MonkeyPatch.context() as env:
        # What the server sets for batch-invariant kernels (`kernels`), read by llama.cpp once per process; the
        # environment is restored after the module, so that servers started by later tests set their own.
        for name, value in invariant_switches().items():
            env.setenv(name, value)
        loaded = LlamaModel(ensure_default_model(shared_data_dir()))
        yield loaded
        loaded.close()
