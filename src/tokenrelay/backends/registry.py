"""Model id → backend."""

from __future__ import annotations

from tokenrelay.backends.base import Backend
from tokenrelay.errors import ModelNotFound


class Registry:
    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}

    def add(self, backend: Backend) -> None:
        if backend.card.id in self._backends:
            raise ValueError(f"model id {backend.card.id!r} is configured twice")
        self._backends[backend.card.id] = backend

    def put(self, backend: Backend) -> None:
        """Add, or replace the backend serving the same id (nodes registered at run time)."""
        self._backends[backend.card.id] = backend

    def remove(self, model: str) -> Backend | None:
        return self._backends.pop(model, None)

    def find(self, model: str) -> Backend | None:
        return self._backends.get(model)

    def get(self, model: str) -> Backend:
        backend = self._backends.get(model)
        if backend is None:
            raise ModelNotFound(model)
        return backend

    def all(self) -> list[Backend]:
        return list(self._backends.values())
