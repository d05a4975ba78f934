"""The prompt side of a request's reservation: what the template renders bounds it, not the request's other
fields (whose names, defaults and nulls no template reads)."""

from __future__ import annotations

from tokenrelay.limits.cost import prompt_bound
from tokenrelay.protocol.chat import ChatCompletionRequest

ASK = [{"role": "user", "content": "Say hi in one word."}]  # 19 bytes


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": ASK} | fields)


def test_sampling_fields_and_their_defaults_add_nothing_to_the_bound() -> None:
    plain = prompt_bound(chat())
    tuned = prompt_bound(chat(temperature=0.2, top_p=0.9, max_tokens=5, seed=7, stop=["\n"], logprobs=True, user="u"))
    assert plain == tuned
    assert plain < 4 * len(ASK[0]["content"]) + 200  # the text, role markers and template, not a whole request dump


def test_what_a_template_renders_grows_the_bound() -> None:
    plain = prompt_bound(chat())
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {
        "type": "function",
        "function": {"name": "weather", "description": "A city's weather.", "parameters": parameters},
    }
    assert prompt_bound(chat(tools=[tool])) > plain + len(str(parameters))
    assert (
        prompt_bound(chat(chat_template_kwargs={"documents": ["x" * 500]})) > plain + 500
    )  # a node's template reads it
    longer = [ASK[0], {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again."}]
    assert prompt_bound(chat(messages=longer)) > plain
