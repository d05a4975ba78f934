"""A node's connections come from the transport factory its routed backend was given (the server's, through
`Services`), so a fake node can stand in without sockets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from upstream_fakes import ON_ASYNCIO, chat, chat_body, drain, text_of

from tokenrelay.backends.base import Ticket, Usage
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.config import RoutingSettings, Settings, UpstreamSettings
from tokenrelay.server.services import Services

pytestmark = ON_ASYNCIO


@dataclass
class CannedReply:
    body: bytes
    status: int = 200
    content_type: str = "application/json"

    async def read(self, deadline: float | None = None) -> bytes:
        return self.body

    async def next_piece(self, deadline: float | None = None) -> bytes | None:
        body, self.body = self.body, b""
        return body or None

    def release(self) -> None:
        pass


@dataclass
class InProcessNodes:
    """A transport factory whose nodes answer every request with `answer`; what they were asked is noted."""

    answer: dict[str, object]
    made: list[str] = field(default_factory=list)  # the URL of each transport made
    asked: list[tuple[str, str, str]] = field(default_factory=list)  # (URL, method, path)

    def __call__(self, url: str, headers: dict[str, str], connect_timeout: float) -> InProcessNode:
        self.made.append(url)
        return InProcessNode(self, url)


@dataclass
class InProcessNode:
    nodes: InProcessNodes
    url: str

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> CannedReply:
        self.nodes.asked.append((self.url, method, path))
        return CannedReply(json.dumps(self.nodes.answer).encode())

    async def close(self) -> None:
        pass


NODE = UpstreamSettings(url="http://node.invalid:8000/v1", name="n")


async def test_a_routed_backend_reaches_its_nodes_through_the_transport_it_was_given() -> None:
    fake = InProcessNodes(chat_body("canned", usage={"prompt_tokens": 3, "completion_tokens": 1}))
    backend = RoutedBackend("m", RoutingSettings(), [NODE], transport=fake)
    events = await drain(backend.chat(chat(), Ticket("r")))
    assert text_of(events) == "canned" and events[-1] == Usage(3, 1)
    assert fake.asked == [("http://node.invalid:8000/v1", "POST", "/chat/completions")]
    await backend.close()


async def test_a_nodes_tokenizer_uses_the_same_transport_at_the_servers_root() -> None:
    fake = InProcessNodes({"count": 7})
    backend = RoutedBackend("m", RoutingSettings(), [NODE], transport=fake)
    count = await backend.count_chat_prompt(chat())
    assert (count.tokens, count.estimated) == (7, False)
    assert fake.asked == [("http://node.invalid:8000", "POST", "/tokenize")]
    await backend.close()


async def test_the_servers_services_give_their_transport_to_the_models_they_build(tmp_path: Path) -> None:
    fake = InProcessNodes(chat_body("canned"))
    services = Services(Settings(data_dir=tmp_path), transport=fake)
    backend = await services.routed_backend("registered")  # a node registers for a model of its own
    await backend.add_node(NODE)
    assert text_of(await drain(backend.chat(chat(), Ticket("r")))) == "canned"
    assert fake.made == ["http://node.invalid:8000/v1"]
    await services.close()
