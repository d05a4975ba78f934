"""Counting a chat prompt for a model served by nodes: the node's own tokenizer endpoint in either known shape,
remembered per node, or an estimate that learns what the node's template adds; a native node's own count."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from upstream_fakes import ON_ASYNCIO, REFUSE, FakeNodes, answer, chat, chat_body, drain, nodes_fixture

from tokenrelay.backends.base import NativeRequest, PromptCount, Ticket

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()


def root_paths(nodes: FakeNodes, name: str) -> list[str]:
    return [seen.path for seen in nodes.seen if seen.node == name and "/v1/" not in seen.path]


async def test_a_vllm_shaped_tokenizer_counts_the_messages(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: web.json_response({"count": 42, "tokens": [], "max_model_len": 4096})))
    backend = nodes.backend("a", model="node-model")
    request = chat("Hello", continue_final_message=False)
    assert await backend.count_chat_prompt(request) == PromptCount(42)
    [body] = nodes.bodies("a")
    assert body == {
        "model": "node-model",
        "messages": [{"role": "user", "content": "Hello"}],
        "continue_final_message": False,
        "add_generation_prompt": True,
    }
    assert root_paths(nodes, "a") == ["/a/tokenize"]


async def test_llama_servers_shape_renders_then_tokenizes_and_is_remembered(nodes: FakeNodes) -> None:
    async def llama_server(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        if request.path.endswith("/apply-template"):
            return web.json_response({"prompt": "<|user|>Hello<|assistant|>"})
        return web.json_response({"tokens": [1, 2, 3, 4, 5] if "content" in body else []})

    nodes.on("a", llama_server)
    backend = nodes.backend("a")
    for _ in range(2):
        assert await backend.count_chat_prompt(chat("Hello")) == PromptCount(5)
    both_shapes_tried = ["/a/tokenize", "/a/apply-template", "/a/tokenize"]
    remembered = ["/a/apply-template", "/a/tokenize"]
    assert root_paths(nodes, "a") == [*both_shapes_tried, *remembered]


async def test_without_a_tokenizer_the_estimate_learns_the_templates_tokens(nodes: FakeNodes) -> None:
    async def chat_only(request: web.Request) -> web.Response:
        if request.path.endswith("/chat/completions"):
            usage = {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}
            return web.json_response(chat_body("Hi", usage))
        return web.json_response({"error": {"message": "Not Found"}}, status=404)

    nodes.on("a", chat_only)
    backend = nodes.backend("a")
    before = await backend.count_chat_prompt(chat("Hello there"))
    assert before.estimated and before.tokens < 20
    await drain(backend.chat(chat("Hello there"), Ticket("rid")))  # the node says what this prompt cost: 40
    assert await backend.count_chat_prompt(chat("Hello there")) == PromptCount(40, estimated=True)
    longer = await backend.count_chat_prompt(chat("Hello there, and a few more words"))
    assert longer.estimated and longer.tokens > 40
    assert len(root_paths(nodes, "a")) == 2  # both shapes tried once, then the node is not asked again


async def test_a_native_count_is_the_nodes_and_fails_over(nodes: FakeNodes) -> None:
    nodes.on("a", REFUSE)
    nodes.on("b", answer(lambda: web.json_response({"input_tokens": 17})))
    backend = nodes.backend("a", "b", model="node-model", native_apis=["messages"])
    body = {"model": "m", "messages": [{"role": "user", "content": "Hello"}]}
    native = NativeRequest("messages", body, chat("Hello"), {"anthropic-version": "2023-06-01"})
    assert await backend.count_natively(native, "rid") == 17
    [seen] = [seen for seen in nodes.seen if seen.node == "b"]
    assert seen.path == "/b/v1/messages/count_tokens" and seen.json() == body | {"model": "node-model"}
    assert seen.headers["anthropic-version"] == "2023-06-01"


async def test_a_node_that_fails_is_not_taken_for_one_without_a_tokenizer(nodes: FakeNodes) -> None:
    statuses = iter([503, 200])

    async def loading(request: web.Request) -> web.Response:
        status = next(statuses)
        return web.json_response({"count": 9} if status == 200 else {"error": {"message": "loading"}}, status=status)

    nodes.on("a", loading)
    backend = nodes.backend("a")
    first = await backend.count_chat_prompt(chat("Hello"))
    assert first.estimated  # the node failed: an estimate this time
    assert await backend.count_chat_prompt(chat("Hello")) == PromptCount(9)  # and its tokenizer the next
