"""The hand-written node transport: pooled keep-alive connections on asyncio's `Protocol`, parsed by httptools.

A gateway talking to its own nodes needs none of a general client's cookie handling, header multidicts or
hooks, so this keeps to the pool, the request head and the body as it arrives; the part that must be right
(chunked bodies, keep-alive, malformed answers) is httptools (llhttp, the parser uvicorn serves with).

One exchange per connection at a time; a connection goes back to the pool only when its answer was read to
the end and the node kept it alive, and is closed otherwise (which is also how a node learns that the
client of an abandoned generation has gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import Any, TypeVar, cast

import httptools

from tokenrelay.backends.upstream.transport import (
    KEEPALIVE_SECONDS,
    ConnectFailed,
    ConnectionLost,
    ReadTimeout,
    TransportError,
)
from tokenrelay.loopturn import LoopTurnBatch
from tokenrelay.nodeurl import NodeUrl

# A stream's bytes wait here while the client is slow to take them; past this, the node is asked to pause
# (TCP's own flow control then holds it back) rather than fill our memory.
_HIGH_WATER = 256 * 1024

T = TypeVar("T")


class Reply:
    """A node's answer: status and headers at once, the body as it arrives."""

    __slots__ = ("_connection", "_done", "_error", "_parts", "_size", "_waiter", "headers", "status")

    def __init__(self, connection: _Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}  # names lower-cased; a repeated header keeps its last value
        self._connection = connection
        self._parts: list[bytes] = []
        self._size = 0
        self._done = False
        self._error: TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    async def read(self, deadline: float | None = None) -> bytes:
        """The whole body, by `deadline` (loop time) if one is given."""
        parts = []
        while (piece := await self.next_piece(deadline)) is not None:
            parts.append(piece)
        return b"".join(parts)

    async def next_piece(self, deadline: float | None = None) -> bytes | None:
        """The bytes that arrived since the last call (waiting for some until `deadline`, loop time, if one is
        given), or None at the body's end."""
        while not self._parts:
            if self._error is not None:
                raise self._error
            if self._done:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await until(self._waiter, deadline)
            finally:
                self._waiter = None
        piece = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        self._connection.resume()
        return piece

    def release(self) -> None:
        """Done with the answer: the connection goes back to the pool if it can carry another exchange."""
        self._connection.finish(self, reusable=self._done and self._error is None and not self._parts)

    # Fed by the connection ------------------------------------------------------------------------
    def _body(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)
        if self._size > _HIGH_WATER:
            self._connection.pause()
        self._wake()

    def _end(self, error: TransportError | None = None) -> None:
        if not self._done:
            self._done, self._error = True, error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


# The largest answer head (status line and headers) taken from a node; servers send a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the exchange on it; httptools calls the `on_*` methods."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.reply: Reply | None = None
        self.head: asyncio.Future[Reply] | None = None
        self.keep_alive = False
        self.closed = False
        self.idle_since = 0.0
        self._paused = False
        self._unsent: bytes | None = None  # a request not yet written (see `send`)
        self._head_bytes = 0  # bytes received while the answer's head is incomplete

    # The exchange ---------------------------------------------------------------------------------
    def send(self, data: bytes) -> asyncio.Future[Reply]:
        """Start an exchange: the request is written when this loop turn ends, the answer's head awaited.

        A gateway under load starts many exchanges in one turn; written together, they reach a node together,
        and it takes them in one wake-up rather than one per request."""
        assert self.transport is not None
        self.reply = Reply(self)
        self.head = asyncio.get_running_loop().create_future()
        self.keep_alive = False
        self._unsent = data
        self._head_bytes = 0
        self.pool.writes.add(self)
        return self.head

    def write_unsent(self) -> None:
        data, self._unsent = self._unsent, None
        if data is not None and not self.closed and self.transport is not None:
            self.transport.write(data)

    def finish(self, reply: Reply | None, reusable: bool) -> None:
        if reply is None or reply is not self.reply:
            return  # released already
        self.reply = self.head = None
        if reusable and self.keep_alive and not self.closed:
            self.resume()
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        self.closed = True
        self._unsent = None  # an exchange abandoned before its request went out: the node never sees it
        if self.transport is not None:
            self.transport.close()

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    # asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not a subclass of asyncio.Transport, so no isinstance check).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.reply is None:
            self.close()  # bytes nobody asked for: the connection's framing cannot be trusted any more
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionLost(f"the node's answer is not valid HTTP ({exc})"))
            self.close()
            return
        if self.head is not None and not self.head.done():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:  # llhttp sets no bound on a head: a node could feed one forever
                self._fail(ConnectionLost(f"the node's answer head is over {MAX_HEAD_BYTES // 1024} KiB"))
                self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        reply = self.reply
        if reply is not None and reply.status and self._read_to_close(reply):
            reply._end()  # a body without length or chunking ends when the node closes
        else:
            self._fail(ConnectionLost("the node closed the connection"))

    @staticmethod
    def _read_to_close(reply: Reply) -> bool:
        return "content-length" not in reply.headers and "transfer-encoding" not in reply.headers

    def _fail(self, error: TransportError) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        elif self.reply is not None:
            self.reply._end(error)

    # httptools callbacks ---------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.reply is not None:
            self.reply.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        reply = self.reply
        if reply is None:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (e.g. 100 Continue): the real one follows
            reply.headers = {}
            return
        reply.status = status
        if self.head is not None and not self.head.done():
            self.head.set_result(reply)

    def on_body(self, body: bytes) -> None:
        if self.reply is not None:
            self.reply._body(body)

    def on_message_complete(self) -> None:
        reply = self.reply
        if reply is None or not reply.status:
            return
        self.keep_alive = self.parser.should_keep_alive()
        reply._end()


class Pool:
    """A node's connections (a `transport.NodeTransport`): reused most recent first, each dropped after
    `keepalive` seconds idle."""

    def __init__(
        self, url: str, headers: dict[str, str], connect_timeout: float, keepalive: float = KEEPALIVE_SECONDS
    ) -> None:
        self.origin = NodeUrl.parse(url)
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._head_lines = _header_lines(_fixed_headers(self.origin, headers))
        self._idle: deque[_Connection] = deque()
        self._ssl = ssl.create_default_context() if self.origin.tls else None
        self._closed = False
        self.writes: LoopTurnBatch[_Connection] = LoopTurnBatch(_write_requests)  # see `_Connection.send`

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> Reply:
        """Send a request; returns once the node's status line and headers are in, by `deadline` (loop time)
        if one is given: connecting counts too.

        A caller that got a `Reply` must `release()` it (in a `finally`), whether or not it read the body."""
        head = f"{method} {self.origin.base_path}{path} HTTP/1.1\r\n{self._head_lines}"
        if headers:
            head += _header_lines(headers)
        head += f"Content-Length: {len(body)}\r\n\r\n" if method != "GET" else "\r\n"
        connection = self._idle_connection() or await self._connect(deadline)
        try:
            return await until(connection.send(head.encode("latin-1") + body), deadline)
        except BaseException:
            connection.finish(connection.reply, reusable=False)
            raise

    def put(self, connection: _Connection) -> None:
        if self._closed:
            connection.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        self._idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(connection)

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    def _idle_connection(self) -> _Connection | None:
        oldest = asyncio.get_running_loop().time() - self.keepalive
        while self._idle:
            connection = self._idle.pop()
            # `closed` comes with connection_lost; a transport the node has begun to close may precede it.
            transport = connection.transport
            if not connection.closed and connection.idle_since > oldest and transport and not transport.is_closing():
                return connection
            connection.close()
        return None

    async def _connect(self, deadline: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        origin = self.origin
        limit = loop.time() + self.connect_timeout
        try:
            async with asyncio.timeout_at(limit if deadline is None else min(limit, deadline)):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self),
                    origin.host,
                    origin.port,
                    ssl=self._ssl,
                    server_hostname=origin.host if self._ssl is not None else None,
                )
        except TimeoutError:
            if deadline is not None and deadline < limit:
                raise ReadTimeout("the deadline passed while connecting") from None
            raise ConnectFailed("connection timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"connection failed ({type(exc).__name__})") from None
        return connection


def _fixed_headers(origin: NodeUrl, headers: dict[str, str]) -> dict[str, str]:
    """The headers of every request to the node: its host, no compressed bodies (the relay reads them as they
    come), the caller's `headers`, and the URL's credentials unless the caller gave its own."""
    fixed = {"Host": origin.host_header, "Accept-Encoding": "identity", **headers}
    if origin.basic_auth is not None:
        fixed.setdefault("Authorization", origin.basic_auth)
    return fixed


async def until(future: asyncio.Future[T], deadline: float | None) -> T:
    """Await `future`, failing it with `ReadTimeout` at `deadline` (loop time).

    The deadline fails the future rather than cancelling the task (as `asyncio.timeout` would), so there is
    no cancellation to tell apart from a real one."""
    if deadline is None:
        return await future
    alarm = asyncio.get_running_loop().call_at(deadline, _expire, future)
    try:
        return await future
    finally:
        alarm.cancel()


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(ReadTimeout("the deadline passed"))


def _header_lines(headers: dict[str, str]) -> str:
    text = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    # A line break inside a name or value would smuggle in another header: one in the text beyond the
    # line ends we wrote, or a NUL, means some name or value holds one.
    if text.count("\n") != len(headers) or text.count("\r") != len(headers) or "\0" in text:
        raise ValueError("a header holds a line break")
    return text


def _write_requests(connections: list[_Connection]) -> None:
    for connection in connections:
        connection.write_unsent()
