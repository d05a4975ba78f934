"""Every `/v1` request (and the tokenizer endpoints) is authenticated here, before any route runs or any body is read.

A plain ASGI middleware, so it covers every `/v1` path (unknown ones too: a caller without a key learns
nothing about which paths exist) and streams pass through untouched. Where the key is read from and how a
refusal is written depend on the API family the path belongs to (`Dialects`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tokenrelay.auth.dialects import Dialects
from tokenrelay.errors import APIError

PROTECTED = "/v1"
# The principal an in-process caller (the batch runner) acts for, in the scope's `extensions`: the key that made
# the batch. uvicorn never sets this extension, so no network client can.
ACTING_FOR = "tokenrelay.acting_for"
# The tokenizer endpoints sit beside /v1 (as in llama.cpp's and vLLM's servers) but expose the models too.
ALSO_PROTECTED = frozenset({"/tokenize", "/detokenize"})


def protected(path: str) -> bool:
    return path == PROTECTED or path.startswith(PROTECTED + "/") or path in ALSO_PROTECTED


class KeyAuthMiddleware:
    """Puts the caller in the request state as its `Principal` (`state["principal"]`), or answers 401 (or 503)."""

    def __init__(self, app: ASGIApp, dialects: Dialects) -> None:
        self.app = app
        self.dialects = dialects

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        principal = (scope.get("extensions") or {}).get(ACTING_FOR)
        if principal is None:
            dialect = self.dialects.of(scope["path"])
            verifier = scope["app"].state.services.verifier
            try:
                principal = await verifier.authenticate(dialect.key(scope))
            except APIError as exc:
                await dialect.error(exc)(scope, receive, send)
                return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)
