"""Every `/v1` request (and the tokenizer endpoints) is authenticated here, before any route runs or any body is read.

A plain ASGI middleware, so it covers every `/v1` path (unknown ones too: a caller without a key learns
nothing about which paths exist) and streams pass through untouched.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tokenrelay.auth.bearer import scope_bearer_token
from tokenrelay.errors import APIError, error_response

PROTECTED = "/v1"
# The tokenizer endpoints sit beside /v1 (as in llama.cpp's and vLLM's servers) but expose the models too.
ALSO_PROTECTED = frozenset({"/tokenize", "/detokenize"})


def protected(path: str) -> bool:
    return path == PROTECTED or path.startswith(PROTECTED + "/") or path in ALSO_PROTECTED


async def authenticate(scope: Scope, token: str | None) -> None:
    """Put the caller of `token` (read from the request) in the request state as its `Principal`; `APIError`
    (401, or 503) when there is none. Shared by this middleware and the generation lane (`tokenrelay.openai.lane`)."""
    verifier = scope["app"].state.services.verifier
    principal = await verifier.authenticate(token)
    scope.setdefault("state", {})["principal"] = principal


class KeyAuthMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            await authenticate(scope, scope_bearer_token(scope))
        except APIError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)
