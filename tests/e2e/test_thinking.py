"""A model whose chat template has a thinking section: what it writes inside comes back as reasoning, in chat
completions (`reasoning_content`, streamed too) and in the Messages API (a `thinking` block)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from batch_support import chat_line, file_lines, submit, wait_ended
from servers import Server, start_server

from tokenrelay.backends.llamacpp.default_model import smollm2_path

MODEL = "thinker"
# SmolLM2's ChatML, with the generation prompt opening the thinking section and earlier answers shown without
# theirs, as Qwen3's and DeepSeek-R1's templates do.
TEMPLATE = """{% for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'].split('</think>')[-1] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
<think>
{% endif %}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("thinking")
    (tmp / "template.jinja").write_text(TEMPLATE)
    args = ["--model", str(smollm2_path(Path())), "--model-id", MODEL, "--chat-template", str(tmp / "template.jinja")]
    server = start_server(tmp, *args, "--slots", "2", "--ctx-size", "512", "--long-slots", "0")
    try:
        yield server
    finally:
        server.stop()


ASK = [{"role": "user", "content": "What is two plus two?"}]


def test_the_thinking_section_is_reasoning_not_content(server: Server) -> None:
    client = server.client()
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0)
    message = reply.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content") or ""
    # The model never closes the section within 12 tokens: all it wrote is reasoning.
    assert reasoning.strip() and not message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    details = reply.usage.completion_tokens_details
    # Counted by the tokenizer from the reasoning's text: within a token or two of the 12 generated.
    assert details is not None and 10 <= (details.reasoning_tokens or 0) <= 12
    streamed = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0, stream=True)
    deltas = [chunk.choices[0].delta.model_extra or {} for chunk in streamed if chunk.choices]
    assert "".join(delta.get("reasoning_content") or "" for delta in deltas) == reasoning


def test_the_messages_api_answers_with_a_thinking_block(server: Server) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0)
    message = client.messages.create(model=MODEL, max_tokens=12, messages=ASK, extra_body={"temperature": 0})  # type: ignore[arg-type]
    kinds = [block.type for block in message.content]
    assert kinds[0] == "thinking" and "text" not in kinds


def test_a_response_counts_its_reasoning_tokens(server: Server) -> None:
    response = server.client().responses.create(
        model=MODEL, input="What is two plus two?", max_output_tokens=12, temperature=0
    )
    assert response.output[0].type == "reasoning"
    assert response.usage is not None and response.usage.output_tokens == 12
    assert 10 <= response.usage.output_tokens_details.reasoning_tokens <= 12


def test_a_batch_counts_the_reasoning_tokens_of_its_answers(server: Server) -> None:
    client = server.client()
    lines = [chat_line(f"t{i}", f"What is {i} plus {i}?", model=MODEL, max_tokens=8, temperature=0) for i in range(2)]
    batch = wait_ended(client, submit(client, lines))
    assert batch.status == "completed" and batch.usage is not None
    answers = [row["response"]["body"]["usage"] for row in file_lines(client, batch.output_file_id)]
    reasoning = sum(usage["completion_tokens_details"]["reasoning_tokens"] for usage in answers)
    assert batch.usage.output_tokens_details.reasoning_tokens == reasoning > 0
