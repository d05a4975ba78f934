"""What the test nodes built on `http.server` share: running one in a thread, and a whole reply."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar


class NodeServer(ThreadingHTTPServer):
    """A test node's server: a thread per connection, and a real node's listen backlog (uvicorn's is 2048)
    rather than socketserver's 5. With a hundred connections opening at once the kernel drops SYNs past
    the backlog, and each retry waits 1, 3, 7, 15... seconds."""

    daemon_threads = True
    request_queue_size = 1024


S = TypeVar("S", bound=ThreadingHTTPServer)


@contextmanager
def running(server: S) -> Iterator[S]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def reply(handler: BaseHTTPRequestHandler, status: int, content_type: str, data: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
