"""The serving protocol's writes: one loop turn's bytes leave together, and nothing waits past its turn."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from event_loops import ON_BOTH_LOOPS
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tokenrelay.server.write_batching import TurnBufferedHttpToolsProtocol, TurnBufferedTransport

pytestmark = ON_BOTH_LOOPS


class FakeTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", b""))
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_one_turns_writes_reach_the_transport_as_one_write_at_the_turns_end() -> None:
    fake = FakeTransport()
    transport = TurnBufferedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"")
    transport.writelines([b"{", b"}"])
    assert fake.calls == [] and transport.get_write_buffer_size() == 7 + 21
    await asyncio.sleep(0)
    assert fake.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}")]
    transport.write(b"next turn")
    await asyncio.sleep(0)
    assert fake.calls[1:] == [("write", b"next turn")]
    assert transport.get_extra_info("peername") == "info:peername"  # the rest is the wrapped transport's


async def test_close_writes_what_is_held_first_and_abort_drops_it() -> None:
    fake = FakeTransport()
    transport = TurnBufferedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"last bytes")
    transport.close()
    assert fake.calls == [("write", b"last bytes"), ("close", b"")]
    await asyncio.sleep(0)  # the turn's own flush finds nothing more to send
    assert len(fake.calls) == 2

    aborted = FakeTransport()
    transport = TurnBufferedTransport(aborted, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"never sent")
    transport.abort()
    await asyncio.sleep(0)
    assert aborted.calls == [("abort", b"")]


async def test_a_connection_closing_under_the_held_bytes_gets_no_write() -> None:
    fake = FakeTransport()
    transport = TurnBufferedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"for a client that left")
    fake.closing = True
    await asyncio.sleep(0)
    assert fake.calls == []


# A real server ----------------------------------------------------------------------------------------------
class CountingTransport:
    """Counts the writes that reach the socket's own transport."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def counted(protocol: type[HttpToolsProtocol], writes: list[bytes]) -> type[HttpToolsProtocol]:
    class Counted(protocol):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(CountingTransport(transport, writes))

    return Counted


class App:
    """Answers `/json` at once, and `/stream` in two parts, the second once `first_read` is set."""

    def __init__(self) -> None:
        self.first_read = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await app(scope, receive, send, self.first_read)


async def app(scope: dict[str, Any], receive: Any, send: Any, first_read: asyncio.Event) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/json":
        body = b'{"ok":true}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    # A stream whose second part is sent only once the client has read the first: were the first held until
    # more came, the exchange would never finish.
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
    await first_read.wait()
    await send({"type": "http.response.body", "body": b"second\n", "more_body": False})


@asynccontextmanager
async def server(protocol: type[HttpToolsProtocol], served: App | None = None) -> AsyncIterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = uvicorn.Config(
        served or App(), host="127.0.0.1", port=port, http=protocol, log_level="warning", lifespan="off"
    )
    instance = uvicorn.Server(config)
    task = asyncio.create_task(instance.serve())
    while not instance.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        instance.should_exit = True
        await task


async def test_a_json_answer_is_one_write_where_uvicorn_alone_makes_two() -> None:
    for protocol, expected in ((HttpToolsProtocol, 2), (TurnBufferedHttpToolsProtocol, 1)):
        writes: list[bytes] = []
        async with server(counted(protocol, writes)) as url, httpx.AsyncClient(base_url=url) as client:
            for _ in range(3):  # one keep-alive connection, three exchanges
                response = await client.get("/json")
                assert (response.status_code, response.json()) == (200, {"ok": True})
        assert len(writes) == 3 * expected, protocol.__name__


async def test_a_streams_parts_leave_in_their_own_turns() -> None:
    writes: list[bytes] = []
    served = App()
    async with (
        server(counted(TurnBufferedHttpToolsProtocol, writes), served) as url,
        httpx.AsyncClient(base_url=url) as client,
        client.stream("GET", "/stream") as response,
    ):
        parts = response.aiter_text()
        # Only a failure waits out this bound: the first part held back until the second would never come.
        assert await asyncio.wait_for(anext(parts), timeout=30) == "first\n"
        served.first_read.set()
        assert "".join([piece async for piece in parts]) == "second\n"
    assert len(writes) == 2  # the head with the first part, then the second part with the body's end
