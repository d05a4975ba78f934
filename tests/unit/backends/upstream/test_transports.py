"""The node transports against raw loopback servers: framing, keep-alive, failures, flow control.

The tests take the transport as a factory (`make`), so a second implementation of `transport.NodeTransport`
would be checked by the same tests.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tokenrelay.backends.upstream import http1
from tokenrelay.backends.upstream.http1 import Pool
from tokenrelay.backends.upstream.transport import ConnectFailed, ConnectionLost, NodeTransport, ReadTimeout
from tokenrelay.nodeurl import NodeUrl

# Both loops: uvicorn serves on uvloop when it is installed (it is a dependency), whose transports differ.
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize(
        "anyio_backend", [("asyncio", {}), ("asyncio", {"use_uvloop": True})], ids=["asyncio", "uvloop"]
    ),
]

Make = Callable[..., NodeTransport]  # (url, headers, connect_timeout, keepalive=...) → a transport


@pytest.fixture
def make() -> Make:
    return Pool


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ServerHandler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A raw TCP server on loopback: each connection runs `handler`; heads of requests are recorded."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
        )
        return await reader.readexactly(length)


@asynccontextmanager
async def serving(handler: ServerHandler) -> AsyncIterator[tuple[Server, str]]:
    server = Server(lambda r, w: handler(server, r, w))
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}/v1"
    finally:
        listener.close()


async def keep_alive_json(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            body = await server.read_request(reader)
        except asyncio.IncompleteReadError:
            return
        answer = b'{"echo":' + str(len(body)).encode() + b"}"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer)
        )
        await writer.drain()


def answering(*pieces: bytes, hold_open: bool = False) -> ServerHandler:
    """A node that reads one request, writes `pieces` (each sent on its own), then closes the connection, or
    with `hold_open` waits for the client to close it."""

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        if hold_open:
            await reader.read()

    return handler


async def exchange(pool: NodeTransport, body: bytes = b"{}") -> tuple[int, bytes]:
    reply = await pool.request("POST", "/chat/completions", body, {"X-Request-ID": "r1"})
    try:
        return reply.status, await reply.read()
    finally:
        reply.release()


async def test_keep_alive_connection_is_reused_and_the_head_is_complete(make: Make) -> None:
    async with serving(keep_alive_json) as (server, url):
        pool = make(url, {"Authorization": "Bearer node-key"}, connect_timeout=2)
        for size in (2, 10, 0):
            assert await exchange(pool, b"x" * size) == (200, b'{"echo":%d}' % size)
        await pool.close()
    assert server.connections == 1
    head = server.heads[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    for line in (
        f"Host: {url.split('/')[2]}",
        "Authorization: Bearer node-key",
        "X-Request-ID: r1",
        "Content-Length: 2",
    ):
        assert line + "\r\n" in head


async def test_credentials_in_the_url_are_sent_as_basic_auth_and_not_in_the_request_line(make: Make) -> None:
    async with serving(keep_alive_json) as (server, url):
        pool = make(url.replace("http://", "http://user:p%40ss@"), {}, connect_timeout=2)
        assert await exchange(pool) == (200, b'{"echo":2}')
        await pool.close()
    head = server.heads[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert "Authorization: Basic " + base64.b64encode(b"user:p@ss").decode() + "\r\n" in head


async def test_concurrent_exchanges_use_separate_connections_then_share_the_pool(make: Make) -> None:
    async with serving(keep_alive_json) as (server, url):
        pool = make(url, {}, connect_timeout=2)
        results = await asyncio.gather(*(exchange(pool) for _ in range(5)))
        assert results == [(200, b'{"echo":2}')] * 5
        await asyncio.gather(*(exchange(pool) for _ in range(5)))
        await pool.close()
    assert server.connections == 5


async def test_chunked_answer_arrives_piece_by_piece(make: Make) -> None:
    gate = asyncio.Event()

    async def chunked(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(b"6\r\ndata: \r\n")
        await writer.drain()
        await gate.wait()  # the client must see the first piece before the rest exists
        writer.write(b"3\r\nab\n\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with serving(chunked) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        reply = await pool.request("POST", "/x", b"{}")
        assert reply.content_type == "text/event-stream"
        assert await reply.next_piece() == b"data: "
        gate.set()
        assert await reply.next_piece() == b"ab\n"
        assert await reply.next_piece() is None
        reply.release()
        await pool.close()


async def test_body_read_until_the_node_closes(make: Make) -> None:
    http10 = answering(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"a":', b"1}")
    async with serving(http10) as (server, url):
        pool = make(url, {}, connect_timeout=2)
        assert await exchange(pool) == (200, b'{"a":1}')
        assert await exchange(pool) == (200, b'{"a":1}')  # not kept: a new connection
        await pool.close()
    assert server.connections == 2


async def test_connection_close_answer_is_not_reused(make: Make) -> None:
    closing = answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", hold_open=True)
    async with serving(closing) as (server, url):
        pool = make(url, {}, connect_timeout=2)
        assert await exchange(pool) == (200, b"ok")
        assert await exchange(pool) == (200, b"ok")
        await pool.close()
    assert server.connections == 2


async def test_node_dropping_the_connection_mid_body_is_a_lost_connection(make: Make) -> None:
    truncated = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
    async with serving(truncated) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        with pytest.raises(ConnectionLost):
            await exchange(pool)
        await pool.close()


async def test_node_closing_before_answering_is_a_lost_connection(make: Make) -> None:
    hang_up = answering()
    async with serving(hang_up) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        with pytest.raises(ConnectionLost):
            await pool.request("POST", "/x", b"{}")
        await pool.close()


async def test_bytes_that_are_not_http_are_refused(make: Make) -> None:
    garbage = answering(b"SSH-2.0-OpenSSH_9.2\r\n\r\n", hold_open=True)
    async with serving(garbage) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        with pytest.raises(ConnectionLost, match="not valid HTTP"):
            await pool.request("POST", "/x", b"{}")
        await pool.close()


async def test_refused_connection_fails_to_connect(make: Make) -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    pool = make(f"http://127.0.0.1:{port}", {}, connect_timeout=2)
    with pytest.raises(ConnectFailed):
        await pool.request("POST", "/x", b"{}")


async def test_releasing_mid_body_closes_the_connection_so_the_node_sees_the_client_go(make: Make) -> None:
    node_saw_close = asyncio.Event()

    async def endless(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"5\r\ntoken\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)
        except (ConnectionError, OSError):
            node_saw_close.set()

    async with serving(endless) as (server, url):
        pool = make(url, {}, connect_timeout=2)
        reply = await pool.request("POST", "/x", b"{}")
        assert (await reply.next_piece()).startswith(b"token")
        reply.release()
        await asyncio.wait_for(node_saw_close.wait(), 5)
        await exchange_fails_over_to_a_new_connection(pool, server)
        await pool.close()


async def exchange_fails_over_to_a_new_connection(pool: NodeTransport, server: Server) -> None:
    before = server.connections
    reply = await pool.request("POST", "/x", b"{}")
    reply.release()
    assert server.connections == before + 1


async def test_slow_reader_pauses_the_node_instead_of_buffering_everything(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http1, "_HIGH_WATER", 1024)  # pause early: a small limit makes the test quick
    piece = b"z" * 65536
    total = 512  # 32 MiB: more than loopback's socket buffers hold
    sent = 0

    async def firehose(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(piece) * total))
        for _ in range(total):
            writer.write(piece)
            await writer.drain()
            sent += 1

    async with serving(firehose) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        reply = await pool.request("POST", "/x", b"{}")
        await asyncio.sleep(0.5)  # a reader that does not read: the node must be held back by TCP
        assert sent < total
        received = len(await reply.read())
        reply.release()
        await pool.close()
    assert received == len(piece) * total


async def test_idle_connections_expire(make: Make) -> None:
    async with serving(keep_alive_json) as (server, url):
        pool = make(url, {}, connect_timeout=2, keepalive=0.05)
        await exchange(pool)
        await asyncio.sleep(0.1)
        await exchange(pool)
        await pool.close()
    assert server.connections == 2


async def test_node_closing_an_idle_connection_takes_it_out_of_the_pool(make: Make) -> None:
    one_exchange = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # then close, though kept alive
    async with serving(one_exchange) as (server, url):
        pool = make(url, {}, connect_timeout=2)
        assert await exchange(pool) == (200, b"ok")
        await asyncio.sleep(0.1)
        assert await exchange(pool) == (200, b"ok")
        await pool.close()
    assert server.connections == 2


async def test_origin_of_urls() -> None:
    origin = NodeUrl.parse("https://user:p%40ss@example.com/v1/")
    assert (origin.host, origin.port, origin.tls, origin.base_path, origin.host_header) == (
        "example.com",
        443,
        True,
        "/v1",
        "example.com",
    )
    assert origin.basic_auth == "Basic " + base64.b64encode(b"user:p@ss").decode()
    v6 = NodeUrl.parse("http://[::1]:8080")
    assert (v6.host, v6.host_header, v6.base_path, v6.basic_auth) == ("::1", "[::1]:8080", "", None)
    with pytest.raises(ValueError):
        NodeUrl.parse("ftp://example.com")


async def test_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="line break"):
        Pool("http://127.0.0.1:1", {"Authorization": "Bearer a\r\nX-Evil: 1"}, connect_timeout=1)


async def test_deadlines_fail_the_wait_and_close_the_connection(make: Make) -> None:
    async def slow(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        await asyncio.sleep(0.3)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()  # then nothing more, until the client hangs up

    async with serving(slow) as (server, url):
        pool = make(url, {}, connect_timeout=2)
        now = asyncio.get_running_loop().time
        with pytest.raises(ReadTimeout):
            await pool.request("POST", "/x", b"{}", deadline=now() + 0.05)
        reply = await pool.request("POST", "/x", b"{}", deadline=now() + 2)
        started = now()
        with pytest.raises(ReadTimeout):
            await reply.next_piece(now() + 0.1)
        assert 0.09 < now() - started < 1
        reply.release()
        await pool.close()
    assert server.connections == 2  # the timed-out connection was not reused


def self_signed(directory: Path) -> Path:
    """A certificate for 127.0.0.1 that no CA signed, and its key, in one PEM file."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tokenrelay test node")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / "node.pem"
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM) + key_pem)
    return path


@asynccontextmanager
async def serving_tls(pem: Path) -> AsyncIterator[str]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pem)
    server = Server(lambda r, w: keep_alive_json(server, r, w))
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=context)
    try:
        yield f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}/v1"
    finally:
        listener.close()


async def test_https_nodes_are_verified_against_the_systems_cas(make: Make, tmp_path: Path) -> None:
    pem = self_signed(tmp_path)
    async with serving_tls(pem) as url:
        pool = make(url, {}, connect_timeout=2)
        with pytest.raises(ConnectFailed):  # a certificate no trusted CA signed
            await pool.request("POST", "/chat/completions", b"{}")
        await pool.close()


async def test_an_https_node_whose_ca_the_system_trusts_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pem = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))  # OpenSSL's system store, as an operator would extend it
    async with serving_tls(pem) as url:
        pool = Pool(url, {}, connect_timeout=2)
        assert await exchange(pool, b"{}") == (200, b'{"echo":2}')
        await pool.close()


# Malformed answers a node might send (a bug, a proxy, a port that is not HTTP): each is refused as a lost
# connection, promptly, and never read as a complete answer. The style of h11's own tests: raw bytes in, a
# verdict out.
MALFORMED = {
    "bad chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    "chunk size line without end": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 70_000,
    "chunk longer than announced": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n",
    "close before the last chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    "huge header": b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * 200_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    "conflicting content lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\n{}",
    "status line that is not HTTP": b"HTTP/9 OK\r\nContent-Length: 2\r\n\r\n{}",
    "header without a colon": b"HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\n{}",
}


@pytest.mark.parametrize("answer", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_answer_is_a_lost_connection_never_a_short_body(make: Make, answer: bytes) -> None:
    async with serving(answering(answer)) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        try:
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(exchange(pool), 10)
        finally:
            await pool.close()


async def test_an_informational_answer_before_the_real_one_is_skipped(make: Make) -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    async with serving(answering(answer)) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        try:
            assert await asyncio.wait_for(exchange(pool), 10) == (200, b"{}")
        finally:
            await pool.close()


async def test_a_folded_header_is_refused_or_unfolded_never_misread(make: Make) -> None:
    """A header continued on the next line (obs-fold, RFC 9112 5.2): a client must refuse it or read it as one
    value; a folded line must never be taken for a header of its own (here it would end the body early)."""
    answer = b"HTTP/1.1 200 OK\r\nX-Note: one\r\n Content-Length: 1\r\nContent-Length: 2\r\n\r\n{}"
    async with serving(answering(answer)) as (_, url):
        pool = make(url, {}, connect_timeout=2)
        try:
            try:
                outcome = await asyncio.wait_for(exchange(pool), 10)
            except ConnectionLost:
                return
            assert outcome == (200, b"{}")
        finally:
            await pool.close()
