"""Request metrics summed over several worker processes: prometheus_client's multiprocess mode.

The supervisor points `PROMETHEUS_MULTIPROC_DIR` at a fresh directory before any worker starts. prometheus_client
reads it when it is first imported, so every worker's counters and histograms live in files there, and a scrape
on any worker merges the files of all of them (those of exited workers included, so nothing counted is lost).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

ENV = "PROMETHEUS_MULTIPROC_DIR"


def shared_metrics_dir() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


@contextmanager
def metrics_dir_for_workers() -> Iterator[Path]:
    """A new, empty directory for this run's workers (never the files of an earlier run), removed afterwards."""
    with TemporaryDirectory(prefix="tokenrelay-metrics-") as directory:
        os.environ[ENV] = directory  # inherited by the workers, which are started after this
        try:
            yield Path(directory)
        finally:
            os.environ.pop(ENV, None)


def merged_registry(directory: Path) -> CollectorRegistry:
    """A registry whose scrape reads every worker's files."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return registry


def worker_exited(directory: Path) -> None:
    """Drop this process's live-gauge files (counters and histograms stay: they are part of the totals)."""
    mark_process_dead(os.getpid(), str(directory))
