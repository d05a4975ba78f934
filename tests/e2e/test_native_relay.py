"""A gateway in front of another tokenrelay that serves `/v1/responses` and `/v1/messages` itself, declared with
`native_apis`: the requests go to the node as sent and its answers come back as they are, equal to asking the node
directly, with a ledger row at the gateway for each call. The gateway has keys (the node has none): what a node
keeps is the gateway's to guard."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
import yaml
from accounting_support import create_key, ledger_row, sqlite_url
from servers import Server, start_server, wait_ready

CHAT_MODEL = "smollm2-135m-instruct"
MODEL = "native"  # the gateway's id for the node's model


@dataclass
class Pair:
    gateway: Server
    node: Server
    database: str
    keys: dict[str, str]  # the gateway's keys by name

    def key(self, server: Server, name: str) -> str:
        return self.keys[name] if server is self.gateway else "none"

    def openai(self, server: Server, key: str = "alice") -> openai.OpenAI:
        return server.client(api_key=self.key(server, key))

    def anthropic(self, server: Server, key: str = "alice") -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=server.base_url, api_key=self.key(server, key), max_retries=0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("native-relay")
    node = start_server(tmp, "--slots", "2", "--threads", "1", wait=False)
    started = [node]
    try:
        wait_ready(node)
        upstream = {"url": f"{node.base_url}/v1", "model": CHAT_MODEL, "native_apis": ["responses", "messages"]}
        config = {"routing": {"health": {"probe_interval": 0}}, "models": [{"id": MODEL, "upstreams": [upstream]}]}
        path = tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        database = sqlite_url(tmp)
        keys = {name: create_key(database, name) for name in ("alice", "bob")}
        gateway = start_server(tmp, "--config", str(path), "--database-url", database)
        started.append(gateway)
        yield Pair(gateway, node, database, keys)
    finally:
        for server in started:
            server.stop()


def response_body(**extra: Any) -> dict[str, Any]:
    return {
        "input": "Say hello to Ada.",
        "instructions": "Be brief.",
        "temperature": 0,
        "max_output_tokens": 12,
    } | extra


def counts(usage: Any) -> tuple[int, int, int]:
    """A Responses usage's token counts. Not its cached tokens: the second of two equal requests finds the first's
    prompt in the node's cache."""
    return usage.input_tokens, usage.output_tokens, usage.total_tokens


def test_a_response_is_the_nodes_own(pair: Pair) -> None:
    raw = pair.openai(pair.gateway).responses.with_raw_response.create(model=MODEL, **response_body())
    relayed = raw.parse()
    direct = pair.openai(pair.node).responses.create(model=CHAT_MODEL, **response_body())
    assert relayed.output_text and relayed.output_text == direct.output_text
    assert relayed.model == direct.model == CHAT_MODEL  # the node's answer, as the node wrote it
    assert relayed.usage is not None and direct.usage is not None
    assert counts(relayed.usage) == counts(direct.usage)
    row = ledger_row(pair.database, raw.headers["x-request-id"])
    assert (row["endpoint"], row["model"], row["status"], row["streamed"]) == ("responses", MODEL, 200, False)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (relayed.usage.input_tokens, relayed.usage.output_tokens)
    assert not row["usage_estimated"]


def test_a_response_stream_is_the_nodes_own(pair: Pair) -> None:
    with pair.openai(pair.gateway).responses.stream(model=MODEL, **response_body()) as stream:
        relayed = list(stream)
    with pair.openai(pair.node).responses.stream(model=CHAT_MODEL, **response_body()) as stream:
        direct = list(stream)
    assert [e.type for e in relayed] == [e.type for e in direct]
    assert [e.sequence_number for e in relayed] == list(range(len(relayed)))
    deltas = "".join(e.delta for e in relayed if e.type == "response.output_text.delta")
    assert deltas and deltas == relayed[-1].response.output_text == direct[-1].response.output_text
    assert counts(relayed[-1].response.usage) == counts(direct[-1].response.usage)


@pytest.mark.parametrize("stream", [False, True])
def test_stored_responses_are_read_at_the_node_by_their_key_only(pair: Pair, stream: bool) -> None:
    alice, bob, node = pair.openai(pair.gateway), pair.openai(pair.gateway, "bob"), pair.openai(pair.node)
    if stream:
        with alice.responses.stream(model=MODEL, **response_body()) as events:
            first = list(events)[-1].response  # type: ignore[union-attr]  # completed or incomplete
    else:
        first = alice.responses.create(model=MODEL, **response_body())
    # The node made and keeps it; through the gateway its key reads it as the node has it.
    kept = node.responses.retrieve(first.id)
    assert alice.responses.retrieve(first.id).model_dump() == kept.model_dump()
    items, kept_items = alice.responses.input_items.list(first.id), node.responses.input_items.list(first.id)
    assert [item.model_dump() for item in items.data] == [item.model_dump() for item in kept_items.data]
    assert items.data and items.data[0].content[0].text == "Say hello to Ada."  # type: ignore[union-attr]
    follow = alice.responses.create(model=MODEL, **response_body(input="And to Bob?", previous_response_id=first.id))
    assert follow.previous_response_id == first.id and follow.output_text
    # Another key knows none of it: not to read, list, continue or delete.
    for attempt in (
        lambda: bob.responses.retrieve(first.id),
        lambda: bob.responses.input_items.list(first.id),
        lambda: bob.responses.create(model=MODEL, **response_body(previous_response_id=first.id)),
        lambda: bob.responses.delete(first.id),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    # Deleted through the gateway: gone at the node too, and a second delete is a 404.
    alice.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        node.responses.retrieve(first.id)
    for attempt in (lambda: alice.responses.retrieve(first.id), lambda: alice.responses.delete(first.id)):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert alice.responses.retrieve(follow.id).id == follow.id  # the continuation is kept on its own


def test_unknown_previous_response_ids_are_a_404(pair: Pair) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        pair.openai(pair.gateway).responses.create(model=MODEL, **response_body(previous_response_id="resp_nowhere"))
    assert missing.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_an_unstored_response_is_not_kept(pair: Pair) -> None:
    alice = pair.openai(pair.gateway)
    first = alice.responses.create(model=MODEL, **response_body(store=False))
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(first.id)


ASK = [{"role": "user", "content": "Name three colours."}]


def message_counts(usage: Any) -> tuple[int, int]:
    """A Messages usage's prompt (read from the cache or not) and output tokens: the second of two equal requests
    reads the first's prompt from the node's cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0), usage.output_tokens


def test_a_message_is_the_nodes_own(pair: Pair) -> None:
    body: dict[str, Any] = {"max_tokens": 12, "messages": ASK, "extra_body": {"temperature": 0}}
    raw = pair.anthropic(pair.gateway).messages.with_raw_response.create(model=MODEL, **body)
    relayed = raw.parse()
    direct = pair.anthropic(pair.node).messages.create(model=CHAT_MODEL, **body)
    assert relayed.content and relayed.content == direct.content
    assert (relayed.stop_reason, message_counts(relayed.usage)) == (direct.stop_reason, message_counts(direct.usage))
    row = ledger_row(pair.database, raw.headers["x-request-id"])
    assert (row["endpoint"], row["model"], row["status"]) == ("messages", MODEL, 200)
    usage = relayed.usage
    prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (prompt, usage.output_tokens)
    assert not row["usage_estimated"]


def test_a_message_stream_is_the_nodes_own(pair: Pair) -> None:
    body: dict[str, Any] = {"max_tokens": 12, "messages": ASK, "extra_body": {"temperature": 0}}
    with pair.anthropic(pair.gateway).messages.stream(model=MODEL, **body) as stream:
        deltas = list(stream.text_stream)
        relayed = stream.get_final_message()
    with pair.anthropic(pair.node).messages.stream(model=CHAT_MODEL, **body) as stream:
        direct = stream.get_final_message()
    assert len(deltas) > 1 and "".join(deltas) == relayed.content[0].text  # type: ignore[union-attr]
    assert relayed.content == direct.content
    assert (relayed.stop_reason, message_counts(relayed.usage)) == (direct.stop_reason, message_counts(direct.usage))


def test_a_nodes_400_reaches_the_client_in_the_apis_shape(pair: Pair) -> None:
    # More output than the node's context holds: the gateway (which knows no context length for the node's
    # model) admits it, the node refuses it, and the client gets the node's own answer.
    with pytest.raises(anthropic.BadRequestError) as relayed:
        pair.anthropic(pair.gateway).messages.create(model=MODEL, max_tokens=20_000, messages=ASK)
    with pytest.raises(anthropic.BadRequestError) as direct:
        pair.anthropic(pair.node).messages.create(model=CHAT_MODEL, max_tokens=20_000, messages=ASK)
    assert relayed.value.body == direct.value.body
    assert relayed.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_count_tokens_is_the_nodes_own(pair: Pair, system: str | None) -> None:
    conversation = [
        *ASK,
        {"role": "assistant", "content": "Red, green and blue."},
        {"role": "user", "content": "More?"},
    ]
    body: dict[str, Any] = {"messages": conversation} | ({"system": system} if system else {})
    counted = pair.anthropic(pair.gateway).messages.count_tokens(model=MODEL, **body)
    assert (
        counted.input_tokens == pair.anthropic(pair.node).messages.count_tokens(model=CHAT_MODEL, **body).input_tokens
    )
    usage = pair.anthropic(pair.gateway).messages.create(model=MODEL, max_tokens=1, **body).usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
