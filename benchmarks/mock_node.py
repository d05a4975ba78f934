"""A fast OpenAI-compatible mock node for the gateway benchmark: canned answers, no model, no validation.

Run: `python benchmarks/mock_node.py --port 9000`. It serves `POST /v1/chat/completions` (JSON, or a short
SSE stream with a usage chunk when `"stream": true`) and `GET /v1/models`, from a bare ASGI app on uvicorn,
so the figures measure the gateways rather than the node.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import uvicorn

WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."]
USAGE = {"prompt_tokens": 12, "completion_tokens": len(WORDS), "total_tokens": 12 + len(WORDS)}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "mock",
        "choices": [choice],
    }


def _frames() -> bytes:
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": word}) for word in WORDS]
    chunks.append(_chunk({}, "stop"))
    usage = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": "mock"}
    chunks.append(usage | {"choices": [], "usage": USAGE})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


COMPLETION = json.dumps(
    {
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 0,
        "model": "mock",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(WORDS)},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
    }
).encode()
STREAM = _frames()
MODELS = json.dumps({"object": "list", "data": [{"id": "mock", "object": "model", "owned_by": "mock"}]}).encode()


async def _body(receive: Any) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":
        await _send(send, 200, b"application/json", MODELS)
        return
    await _send(send, 200, *answer(await _body(receive)))


def answer(body: bytes) -> tuple[bytes, bytes]:
    """The content type and bytes of the answer to a request `body`: a stream when it asks for one."""
    if b'"stream":true' in body.replace(b" ", b""):
        return b"text/event-stream", STREAM
    return b"application/json", COMPLETION


async def _send(send: Any, status: int, content_type: str | bytes, data: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
