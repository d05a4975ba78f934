"""One batch line as an in-process request to this server's own app.

The line takes the path of an interactive request (request id, the endpoint's validation and 400s, the key's
models, limits and budget, the backends with their failover, one ledger row, the request log line) because it
is one: an ASGI request handed to the app, acting for the batch's key (`ACTING_FOR`) and marked as batch work
(`BATCH_EXTENSION`: background priority on the engine, the batch id on its ledger row).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import ASGIApp, Message

from tokenrelay.auth.caller import ACTING_FOR
from tokenrelay.calls.batch_line import BATCH_EXTENSION
from tokenrelay.principal import Principal


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes


async def dispatch(
    app: ASGIApp, path: str, body: bytes, principal: Principal, batch_id: str, request_id: str
) -> Answer:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
        ],
        "client": None,
        "server": None,
        "state": {},
        "extensions": {ACTING_FOR: principal, BATCH_EXTENSION: batch_id},
    }
    sent = False
    never = asyncio.Event()  # nobody disconnects: the body is all, then the request waits as a client would

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    status, parts = 500, []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope, receive, send)
    return Answer(status, b"".join(parts))
