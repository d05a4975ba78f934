"""A node's own count of a chat request's prompt, from the tokenizer endpoint at its server's root.

Two shapes are known: vLLM's (also SGLang's and tokenrelay's) `POST /tokenize` with chat `messages`, answering
`count`; and llama.cpp's server, which renders the messages with `POST /apply-template` and tokenizes the text
with `POST /tokenize {"content"}`. The shape a node answers is remembered, as is a node that has neither (it is
not asked again; the caller estimates instead). These paths sit at the server's root, not under its `/v1`, so
they go through a client of their own for the root URL, made when first needed.
"""

from __future__ import annotations

from typing import Any, Literal

from tokenrelay.backends.upstream.client import NodeClient
from tokenrelay.backends.upstream.failures import NodeFailure
from tokenrelay.backends.upstream.http1 import Pool
from tokenrelay.backends.upstream.relay import fetch
from tokenrelay.backends.upstream.transport import TransportFactory
from tokenrelay.config import UpstreamSettings, UpstreamTimeouts
from tokenrelay.jsonbytes import loads

Shape = Literal["vllm", "llama-server", "none"]

# What a server answers for a path it does not serve, or a body of another shape than it reads.
_NOT_THIS_SHAPE = frozenset({400, 404, 405, 422})

# The chat fields that change the rendered prompt, passed to the tokenizer as the node's chat body has them.
_PROMPT_FIELDS = ("messages", "tools", "tool_choice", "continue_final_message")


class NodeTokenizer:
    """Counts prompts with one node's tokenizer endpoint."""

    def __init__(
        self, settings: UpstreamSettings, timeouts: UpstreamTimeouts, transport: TransportFactory = Pool
    ) -> None:
        self.settings = settings
        self.timeouts = timeouts
        self.transport = transport
        self.shape: Shape | None = None  # not known until the node has answered
        self._client: NodeClient | None = None

    async def count(self, chat_body: dict[str, Any], headers: dict[str, str]) -> int | None:
        """The tokens the node's template and tokenizer make of `chat_body`'s prompt; None without an endpoint.
        A node that cannot be reached raises `NodeFailure`, and its shape stays unknown."""
        if self.shape in (None, "vllm"):
            count = await self._vllm(chat_body, headers)
            if count is not None:
                self.shape = "vllm"
                return count
        if self.shape in (None, "llama-server"):
            count = await self._llama_server(chat_body, headers)
            if count is not None:
                self.shape = "llama-server"
                return count
        self.shape = "none"
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def _vllm(self, chat_body: dict[str, Any], headers: dict[str, str]) -> int | None:
        body = {name: chat_body[name] for name in ("model", *_PROMPT_FIELDS) if name in chat_body}
        body["add_generation_prompt"] = not chat_body.get("continue_final_message", False)
        answer = await self._post("/tokenize", body, headers)
        count = answer.get("count") if answer is not None else None
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    async def _llama_server(self, chat_body: dict[str, Any], headers: dict[str, str]) -> int | None:
        template: dict[str, Any] = {name: chat_body[name] for name in ("messages", "tools") if name in chat_body}
        rendered = await self._post("/apply-template", template, headers)
        prompt = rendered.get("prompt") if rendered is not None else None
        if not isinstance(prompt, str):
            return None
        body = {"content": prompt, "add_special": True, "parse_special": True}
        answer = await self._post("/tokenize", body, headers)
        tokens = answer.get("tokens") if answer is not None else None
        return len(tokens) if isinstance(tokens, list) else None

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any] | None:
        """The node's JSON object answer; None when the node has no such endpoint or another shape of it. Any
        other failure (a node still loading, a refused key) is the node's, so no shape is concluded from it."""
        status, content = await fetch(self._root(), "POST", path, headers, self.timeouts, body)
        if status in _NOT_THIS_SHAPE:
            return None
        if not 200 <= status < 300:
            raise NodeFailure(f"the node's tokenizer answered {status}")
        try:
            answer = loads(content)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def _root(self) -> NodeClient:
        if self._client is None:
            settings = self.settings.model_copy(update={"url": self.settings.node_url.server_root})
            self._client = NodeClient(settings, self.timeouts, self.transport)
        return self._client
