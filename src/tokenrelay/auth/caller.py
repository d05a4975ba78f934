"""Who is calling: every `/v1` request (and the tokenizer endpoints) is authenticated before any route runs or any
body is read.

`server/gate.py` asks for every path, unknown ones too, so a caller without a key learns nothing about which paths
exist. Where the key is read from depends on the API family the path belongs to (`Dialects`).
"""

from __future__ import annotations

from starlette.types import Scope

from tokenrelay.auth.dialects import Dialects
from tokenrelay.auth.verifier import KeyVerifier

PROTECTED = "/v1"
# The principal an in-process caller (the batch runner) acts for, in the scope's `extensions`: the key that made
# the batch. uvicorn never sets this extension, so no network client can.
ACTING_FOR = "tokenrelay.acting_for"
# The tokenizer endpoints sit beside /v1 (as in llama.cpp's and vLLM's servers) but expose the models too.
ALSO_PROTECTED = frozenset({"/tokenize", "/detokenize"})


def protected(path: str) -> bool:
    return path == PROTECTED or path.startswith(PROTECTED + "/") or path in ALSO_PROTECTED


async def authenticate(scope: Scope, dialects: Dialects, verifier: KeyVerifier) -> None:
    """Puts the caller of a request to a protected path in its state as its `Principal` (`state["principal"]`):
    the principal an in-process caller acts for, or else the owner of the key the request carries. Raises the
    `APIError` that refuses the request (401, or 503 while keys cannot be checked). The gate asks only for paths
    that are `protected`."""
    principal = (scope.get("extensions") or {}).get(ACTING_FOR)
    if principal is None:
        principal = await verifier.authenticate(dialects.of(scope["path"]).key(scope))
    scope.setdefault("state", {})["principal"] = principal
