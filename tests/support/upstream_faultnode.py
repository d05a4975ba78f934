"""A scripted OpenAI-compatible node on loopback: answers with a chosen error status, or a short reply, or a
stream cut off after its first chunk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from threaded_http import NodeServer, reply, running


class FaultNode(NodeServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status = 200
        self.cut = False  # streams lose their connection after the first chunk
        self.generations = 0  # POSTs received

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: FaultNode
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._send(200, "application/json", json.dumps({"object": "list", "data": [{"id": "fault"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        self.server.generations += 1
        status = self.server.status
        if status != 200:
            error = {"error": {"message": f"scripted {status}", "type": "server_error"}}
            self._send(status, "application/json", json.dumps(error).encode())
        elif body.get("stream") and self.server.cut:
            self._cut()
        elif body.get("stream"):
            chunk = {"choices": [{"index": 0, "delta": {"content": "from fault node"}, "finish_reason": "stop"}]}
            usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}
            frames = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n"
            self._send(200, "text/event-stream", frames.encode())
        else:
            message = {"role": "assistant", "content": "from fault node"}
            reply = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
            self._send(200, "application/json", json.dumps(reply).encode())

    def _cut(self) -> None:
        """One chunk of a chunked body, then the connection closes without the body's last chunk: an answer
        broken off, where a body that simply ended would be one that was over."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": "half"}, "finish_reason": None}]}
        frame = f"data: {json.dumps(chunk)}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        self.wfile.flush()
        self.close_connection = True

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        reply(self, status, content_type, data)


@contextmanager
def fault_node() -> Iterator[FaultNode]:
    with running(FaultNode()) as node:
        yield node
