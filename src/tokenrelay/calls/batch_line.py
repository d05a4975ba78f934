"""A batch line dispatched in-process (`openai/batches/dispatch.py`) carries its batch in the ASGI scope's
`extensions`: the call is background work, and its ledger row names the batch. uvicorn never sets this
extension, so no network client can."""

from __future__ import annotations

from starlette.types import Scope

BATCH_EXTENSION = "tokenrelay.batch"


def batch_of(scope: Scope) -> str | None:
    extensions = scope.get("extensions")
    return None if not extensions else extensions.get(BATCH_EXTENSION)
