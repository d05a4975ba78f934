"""`X-Request-ID`: taken from the client when sane, generated otherwise, echoed on every response."""

from __future__ import annotations

import re

from starlette.types import Message, Scope, Send

from tokenrelay.store.ids import time_ordered_id

HEADER = b"x-request-id"
_SAFE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_request_id() -> str:
    """A time-ordered UUID (version 7), as 32 hex digits: the ledger indexes request ids (`tokenrelay.store.ids`)."""
    return time_ordered_id()


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == HEADER:  # ASGI header names are lower case
            text = value.decode("latin-1")
            if _SAFE.match(text):
                return text
    return new_request_id()


def request_id_of(scope: Scope) -> str:
    """The id `assign_request_id` gave the request (kept in the scope's state, which `Request.state` wraps)."""
    return scope["state"]["request_id"]


def assign_request_id(scope: Scope) -> str:
    """The request's id, kept in its state for the handlers."""
    request_id = request_id_from(scope.get("headers", []))
    scope.setdefault("state", {})["request_id"] = request_id
    return request_id


def id_header(request_id: str) -> tuple[bytes, bytes]:
    """The response header naming the request."""
    return HEADER, request_id.encode("latin-1")


def sending_id(send: Send, request_id: str) -> Send:
    """`send`, adding the request's id to the headers of a response that some other code builds and starts."""

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), id_header(request_id)]
        await send(message)

    return send_with_id
