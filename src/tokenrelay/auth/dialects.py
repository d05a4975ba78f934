"""How an API family takes its key and writes its errors: OpenAI's way by default, Anthropic's under the paths
of its Messages API (`x-api-key`, `{"type": "error", ...}` bodies). The key middleware and the app's error
handlers both ask `Dialects.of(path)`, so a path's refusals and failures always come in one shape."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import Scope

from tokenrelay.auth.bearer import scope_bearer_token
from tokenrelay.calls.request_ids import id_header
from tokenrelay.errors import APIError, error_response


def request_id_headers(request_id: str) -> list[tuple[bytes, bytes]]:
    return [id_header(request_id)]


@dataclass(frozen=True, slots=True)
class Dialect:
    key: Callable[[Scope], str | None] = scope_bearer_token
    error: Callable[[APIError], Response] = error_response
    # The headers naming the request on a response the gate sends (Anthropic's clients read `request-id`).
    id_headers: Callable[[str], list[tuple[bytes, bytes]]] = request_id_headers


OPENAI = Dialect()


class Dialects:
    """Dialects by path prefix; paths under none of them speak OpenAI's."""

    def __init__(self, by_prefix: Mapping[str, Dialect]) -> None:
        self.by_prefix = dict(by_prefix)

    def of(self, path: str) -> Dialect:
        for prefix, dialect in self.by_prefix.items():
            if path == prefix or path.startswith(prefix + "/"):
                return dialect
        return OPENAI

    def error(self, path: str, exc: APIError) -> Response:
        return self.of(path).error(exc)
