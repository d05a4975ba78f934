"""One node's answer → events: SSE framing edge cases, usage, unknown fields, what the node is sent."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from upstream_fakes import (
    ON_ASYNCIO,
    FakeNodes,
    Stream,
    answer,
    chat,
    chat_body,
    chunk,
    completion,
    drain,
    event_stream,
    nodes_fixture,
    sse,
    text_of,
    usage_chunk,
)

from tokenrelay.api.collect import collect
from tokenrelay.backends.base import DeltaFields, Finish, Served, TextDelta, Ticket, ToolCallDelta, Usage
from tokenrelay.errors import UpstreamError
from tokenrelay.openai.chat.render import ChatChunker, chat_response
from tokenrelay.openai.render import ResponseMeta
from tokenrelay.protocol.chat import ChatCompletionRequest

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

STREAM = sse(
    chunk("", role="assistant"),
    ": keep-alive comment\n\n",
    chunk("Hé"),
    chunk("llo wörld"),
    chunk(finish="stop"),
    usage_chunk(7, 3),
)


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def events_for(nodes: FakeNodes, body: bytes | Stream, **request: object) -> list[object]:
    nodes.on("a", answer(lambda: event_stream(body)) if isinstance(body, bytes) else body.respond)
    return await drain(nodes.backend("a").chat(chat(stream=True, **request), Ticket("rid")))


def texts(events: list[object]) -> str:
    return text_of(events)


@pytest.mark.parametrize("size", [1, 3, 7, 64])
async def test_partial_lines_and_multibyte_characters_split_anywhere(nodes: FakeNodes, size: int) -> None:
    events = await events_for(nodes, Stream(split_every(STREAM, size)))
    assert texts(events) == "Héllo wörld"
    assert events[0] == Served("a", "upstream")
    assert [e for e in events if isinstance(e, Finish)] == [Finish(0, "stop")]
    assert events[-1] == Usage(7, 3, 0, estimated=False)


async def test_crlf_framing_comments_and_keepalives_between_chunks(nodes: FakeNodes) -> None:
    body = STREAM.replace(b"\n", b"\r\n").replace(b"data: {", b": ping\r\n\r\ndata: {", 2)
    events = await events_for(nodes, body)
    assert texts(events) == "Héllo wörld"
    assert events[-1] == Usage(7, 3, 0)


async def test_role_only_chunk_yields_nothing_so_the_client_sees_our_own(nodes: FakeNodes) -> None:
    events = await events_for(nodes, sse(chunk("", role="assistant"), chunk("x", finish="stop"), usage_chunk(1, 1)))
    assert [type(e).__name__ for e in events] == ["Served", "TextDelta", "Finish", "Usage"]


async def test_node_that_ends_without_done_still_ends_the_stream_with_its_usage(nodes: FakeNodes) -> None:
    events = await events_for(nodes, sse(chunk("ok", finish="stop"), usage_chunk(2, 1), done=False))
    assert texts(events) == "ok"
    assert events[-1] == Usage(2, 1, 0)


async def test_after_done_the_rest_is_neither_awaited_nor_judged(nodes: FakeNodes) -> None:
    async def done_then_hang_and_break(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk("all", finish="stop"), usage_chunk(1, 1)))
        await asyncio.sleep(2)  # a node that keeps the connection open after [DONE] ...
        request.transport.close()  # ... and then drops it without ending the body
        return response

    nodes.on("a", done_then_hang_and_break)
    started = asyncio.get_running_loop().time()
    events = await drain(nodes.backend("a").chat(chat(stream=True), Ticket("rid")))
    assert asyncio.get_running_loop().time() - started < 1.5
    assert texts(events) == "all" and events[-1] == Usage(1, 1, 0)


async def test_usage_is_held_back_to_the_end_even_when_the_node_sends_it_with_the_finish(nodes: FakeNodes) -> None:
    last = chunk(finish="length") | {"usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    events = await events_for(nodes, sse(chunk("ab"), last, chunk("c")))
    assert isinstance(events[-1], Usage) and events[-1].completion_tokens == 2
    assert sum(isinstance(e, Usage) for e in events) == 1


async def test_no_usage_from_the_node_is_estimated_locally_and_marked(nodes: FakeNodes) -> None:
    events = await events_for(nodes, sse(chunk("twelve chars"), chunk(finish="stop")))
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.estimated
    assert usage.completion_tokens == 3  # 12 bytes at about four per token
    assert usage.prompt_tokens > 0


async def test_fields_the_event_model_lacks_are_relayed_and_collected(nodes: FakeNodes) -> None:
    stream = sse(
        chunk(reasoning_content="Let me "),
        chunk(reasoning_content="think."),
        chunk("Four.", finish="stop"),
        usage_chunk(5, 4),
    )
    events = await events_for(nodes, stream)
    assert [e for e in events if isinstance(e, DeltaFields)] == [
        DeltaFields(0, {"reasoning_content": "Let me "}),
        DeltaFields(0, {"reasoning_content": "think."}),
    ]
    meta = ResponseMeta(id="chatcmpl-x", created=1, model="m", system_fingerprint="fp", choices=1)
    chunks = [c async for piece in ChatChunker(meta, want_logprobs=False).chunks(_replay(events)) for c in piece]
    assert {"reasoning_content": "Let me "} in [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    body = chat_response(await collect(_replay(events)), meta, want_logprobs=False)
    assert body["choices"][0]["message"]["reasoning_content"] == "Let me think."
    assert body["choices"][0]["message"]["content"] == "Four."


async def test_bytes_that_are_not_utf8_and_blank_data_lines_are_read_as_before(nodes: FakeNodes) -> None:
    # A byte that is not UTF-8 becomes U+FFFD, and a data line of blanks is no chunk at all.
    text = b'{"choices": [{"index": 0, "delta": {"content": "a\xffb"}}]}'
    stream = b"data: " + text + b"\n\ndata:  \n\n" + sse(chunk(finish="stop"), usage_chunk(2, 1))
    events = await events_for(nodes, stream)
    assert texts(events) == "a\ufffdb"
    assert [e.reason for e in events if isinstance(e, Finish)] == ["stop"]


@pytest.mark.parametrize("size", [7, 4096])
async def test_integers_past_64_bits_from_a_node_stay_exact(nodes: FakeNodes, size: int) -> None:
    # orjson would read them as floats; whole reads and reads split inside the digits alike
    big = 2**70 + 1
    stream = sse(chunk(seed=big), chunk(seed=-big), chunk("ok", finish="stop"), usage_chunk(2, 1))
    events = await events_for(nodes, Stream(split_every(stream, size)))
    seeds = [e.fields["seed"] for e in events if isinstance(e, DeltaFields)]
    assert seeds == [big, -big] and all(type(s) is int for s in seeds)


async def test_tool_call_deltas_and_logprobs_are_read_from_chunks(nodes: FakeNodes) -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a"'}}
    more = {"index": 0, "function": {"arguments": ": 1}"}}
    logprobs = {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}]}
    text = chunk("x") | {"choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": logprobs}]}
    events = await events_for(nodes, sse(text, chunk(tool_calls=[call]), chunk(tool_calls=[more], finish="tool_calls")))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls == [ToolCallDelta(0, 0, "call_1", "f", '{"a"'), ToolCallDelta(0, 0, None, None, ": 1}")]
    first = next(e for e in events if isinstance(e, TextDelta))
    assert first.logprobs[0].token == "x" and first.logprobs[0].logprob == -0.5


async def test_a_continuation_asks_the_node_for_no_new_turn(nodes: FakeNodes) -> None:
    # vLLM takes `continue_final_message` only with `add_generation_prompt: false`.
    nodes.on("a", answer(lambda: event_stream(sse(chunk("lo", finish="stop")))))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": messages, "stream": True, "continue_final_message": True}
    )
    await drain(nodes.backend("a").chat(request, Ticket("rid")))
    (body,) = nodes.bodies("a")
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "Hel"}


async def test_body_sent_to_the_node_keeps_every_field_and_rewrites_only_the_model(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: event_stream(sse(chunk("x", finish="stop")))))
    backend = nodes.backend("a", model="node-name", api_key="node-secret")
    request = chat(
        stream=True,
        temperature=0.5,
        stream_options={"include_usage": False, "vendor_flag": 1},
        top_k=5,
        guided_json={"type": "object"},
    )
    await drain(backend.chat(request, Ticket("0f0e6a2c5b5d4b7c9a3e8d1f2c4b6a80")))
    (body,) = nodes.bodies("a")
    assert body["model"] == "node-name"
    assert body["top_k"] == 5 and body["guided_json"] == {"type": "object"} and body["temperature"] == 0.5
    assert body["stream_options"] == {"include_usage": True, "vendor_flag": 1}
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    sent = nodes.seen[0]
    assert sent.headers["Authorization"] == "Bearer node-secret"
    assert sent.headers["X-Request-ID"] == "0f0e6a2c5b5d4b7c9a3e8d1f2c4b6a80"
    assert sent.path == "/a/v1/chat/completions"


async def test_a_free_form_client_request_id_is_not_sent_to_nodes(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: event_stream(sse(chunk("x", finish="stop")))))
    backend = nodes.backend("a")
    await drain(backend.chat(chat(stream=True), Ticket("my-trace-7")))
    assert "X-Request-ID" not in nodes.seen[0].headers
    assert "Authorization" not in nodes.seen[0].headers  # no node key configured, and never the client's


async def test_non_streamed_answer_with_usage_and_unknown_message_fields(nodes: FakeNodes) -> None:
    usage = {
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    nodes.on("a", answer(lambda: web.json_response(chat_body("Hi!", usage, reasoning_content="r"))))
    backend = nodes.backend("a")
    events = await drain(backend.chat(chat(), Ticket("rid")))
    assert "stream_options" not in nodes.bodies("a")[0]
    assert texts(events) == "Hi!"
    assert DeltaFields(0, {"reasoning_content": "r"}) in events
    assert events[-1] == Usage(9, 2, 8, reasoning_tokens=1)


async def test_a_json_answer_to_a_stream_request_is_relayed_too(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: web.json_response(chat_body("whole"))))
    backend = nodes.backend("a")
    events = await drain(backend.chat(chat(stream=True), Ticket("rid")))
    assert texts(events) == "whole"
    assert isinstance(events[-1], Usage) and events[-1].estimated


async def test_error_event_after_the_first_chunk_ends_with_estimated_usage_then_an_error(nodes: FakeNodes) -> None:
    stream = sse(chunk("partial "), chunk("answer"), {"error": {"message": "KV cache exhausted"}}, done=False)
    nodes.on("a", answer(lambda: event_stream(stream)))
    nodes.on("b", answer(lambda: event_stream(sse(chunk("never")))))
    backend = nodes.backend("a", "b")
    seen: list[object] = []
    with pytest.raises(UpstreamError, match="KV cache exhausted"):
        async for events in backend.chat(chat(stream=True), Ticket("rid")):
            seen.extend(events)
    assert texts(seen) == "partial answer"
    assert isinstance(seen[-1], Usage) and seen[-1].estimated and seen[-1].completion_tokens > 0
    assert nodes.hits("b") == 0  # the client had bytes already: no failover


async def test_completions_through_a_chat_only_node(nodes: FakeNodes) -> None:
    logprobs = {
        "content": [
            {"token": "ab", "logprob": -0.1, "bytes": None, "top_logprobs": [{"token": "ab", "logprob": -0.1}]},
            {"token": "c", "logprob": -0.2, "bytes": None, "top_logprobs": []},
        ]
    }
    first = {"choices": [{"index": 0, "delta": {"content": "abc"}, "logprobs": logprobs, "finish_reason": None}]}
    nodes.on("a", answer(lambda: event_stream(sse(first, chunk(finish="stop"), usage_chunk(3, 2)))))
    backend = nodes.backend("a", completions_via_chat=True)
    events = await drain(backend.complete(completion("Say abc", logprobs=1, stream=True, max_tokens=5), Ticket("r")))
    (body,) = nodes.bodies("a")
    assert nodes.seen[0].path == "/a/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "Say abc"}]
    assert "prompt" not in body and body["logprobs"] is True and body["top_logprobs"] == 1
    assert body["max_tokens"] == 5
    delta = next(e for e in events if isinstance(e, TextDelta))
    assert [lp.text_offset for lp in delta.logprobs] == [0, 2]
    assert events[-1] == Usage(3, 2, 0)


async def test_completions_reach_the_completions_endpoint_with_token_prompts(nodes: FakeNodes) -> None:
    body = {"choices": [{"index": 0, "text": " there", "finish_reason": "length"}], "usage": None}
    nodes.on("a", answer(lambda: web.json_response(body)))
    backend = nodes.backend("a")
    events = await drain(backend.complete(completion([1, 2, 3], max_tokens=2, echo=False), Ticket("r")))
    assert nodes.seen[0].path == "/a/v1/completions"
    assert nodes.bodies("a")[0]["prompt"] == [1, 2, 3]
    assert texts(events) == " there"
    assert events[-1] == Usage(3, 2, estimated=True)  # three prompt token ids; " there" is six bytes


async def _replay(events: list[object]):
    yield events
