"""A fast OpenAI-compatible chat node in a thread on loopback: JSON or streamed answers, optionally behind a key.

A streamed answer sends one chunk per `max_tokens` (3 by default), `pause` seconds apart, so a test can keep
streams in flight; a node with `api_key` refuses requests without it (401), as a hosted API would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from threaded_http import NodeServer, reply, running


class LoopbackNode(NodeServer):
    def __init__(self, api_key: str | None = None, pause: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api_key = api_key
        self.pause = pause
        self.answered = 0  # generations answered
        self.refused = 0  # generations refused for a missing or wrong key
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def count(self, refused: bool) -> None:
        with self._lock:
            if refused:
                self.refused += 1
            else:
                self.answered += 1


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "node",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens}


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackNode
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once: no 40 ms delayed-ACK stalls

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": "node-model", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        refused = (
            self.server.api_key is not None and self.headers.get("authorization") != f"Bearer {self.server.api_key}"
        )
        self.server.count(refused)
        if refused:
            self._send(401, {"error": {"message": "wrong key", "type": "invalid_request_error"}})
            return
        tokens = int(body.get("max_tokens") or 3)
        if body.get("stream"):
            self._stream(tokens)
            return
        message = {"role": "assistant", "content": "word " * tokens}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        self._send(200, {"id": "node", "object": "chat.completion", "choices": [choice], "usage": _usage(tokens)})

    def _stream(self, tokens: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")  # the end of the stream is the end of the connection
        self.end_headers()
        self.close_connection = True
        frames = [_chunk({"content": f"w{i} "}) for i in range(tokens)]
        frames += [_chunk({}, "stop"), {"id": "node", "choices": [], "usage": _usage(tokens)}]
        try:
            for frame in frames:
                self.wfile.write(f"data: {json.dumps(frame)}\n\n".encode())
                time.sleep(self.server.pause)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway went away (its client left, or it shut down): a real node stops generating too

    def _send(self, status: int, body: dict[str, Any]) -> None:
        reply(self, status, "application/json", json.dumps(body).encode())


@contextmanager
def loopback_node(api_key: str | None = None, pause: float = 0.0) -> Iterator[LoopbackNode]:
    with running(LoopbackNode(api_key, pause)) as node:
        yield node
