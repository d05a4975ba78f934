"""The one thread that runs llama.cpp's compute for every model of the process.

llama.cpp's CPU backend parallelises with OpenMP, which keeps a team of worker threads per calling thread.
Two models decoding from two scheduler threads would leave two teams on the machine's cores, and libgomp
throttles the spin-waiting of every team once it manages more threads than there are cores: each step
then runs much slower, even while the other model is idle. So every `llama_decode` of every context (the
start-up probes' included) runs here, and the schedulers only plan steps and sample.

The one exception is the side thread: a long prompt's piece may run there with a single thread while the
compute thread decodes the short slots with the rest (`scheduler`). A single-threaded computation never starts
an OpenMP team, so the two never fight over the cores.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class NativeThread:
    """A single worker thread; `run` calls a function on it and waits for the result."""

    def __init__(self, name: str = "llama-compute") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, function: Callable[..., T], *args: object) -> T:
        return self.submit(function, *args).result()

    def submit(self, function: Callable[..., T], *args: object) -> Future[T]:
        return self._executor.submit(function, *args)


@functools.cache
def native_thread() -> NativeThread:
    """The process's compute thread, made on first use (never at import)."""
    return NativeThread()


@functools.cache
def side_thread() -> NativeThread:
    """The thread of single-threaded prompt pieces beside the compute thread, made on first use."""
    return NativeThread("llama-side")
