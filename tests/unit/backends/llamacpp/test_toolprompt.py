"""Tools in the prompt: the system-turn convention on templates without tool support, the template's own way
otherwise, and earlier calls and results rendered for the next turn."""

from __future__ import annotations

from tokenrelay.backends.llamacpp.prompts import template_messages
from tokenrelay.backends.llamacpp.structured.toolformat import call_text, text_call
from tokenrelay.backends.llamacpp.structured.toolprompt import tool_prompt
from tokenrelay.backends.llamacpp.structured.toolspec import tool_spec
from tokenrelay.backends.llamacpp.templates import ChatTemplate, builtin_template
from tokenrelay.protocol.chat import ChatCompletionRequest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_9", "content": "cloudy"},
]


def gemma() -> ChatTemplate:
    return ChatTemplate(builtin_template("gemma"), "built-in gemma", bos_token="<bos>", eos_token="<eos>")


def render(template: ChatTemplate, **fields: object) -> str:
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": HISTORY} | fields)
    messages, tools = tool_prompt(template_messages(request), tool_spec(request), template.takes_tools)
    return template.render(messages, tools)


def test_convention_lists_tools_and_the_call_syntax_in_the_system_turn() -> None:
    text = render(gemma(), tools=[WEATHER], tool_choice="required")
    system = text[: text.index("Weather in Oslo?")]
    assert "Be brief." in system and '"name": "get_weather"' in system and "Weather now." in system
    assert call_text("function name", "{...}") in system
    assert "You must call at least one function now." in system


def test_a_function_that_follows_a_lark_grammar_is_shown_and_called_as_text() -> None:
    patch = {"type": "function", "function": {"name": "apply_patch", "parameters": {"type": "object"}}}
    sent = {"id": "call_7", "type": "function", "function": {"name": "apply_patch", "arguments": '{"input":"+a\\nb"}'}}
    history = [{"role": "user", "content": "Fix it."}, {"role": "assistant", "content": None, "tool_calls": [sent]}]
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": history, "tools": [patch, WEATHER]})
    [grammar_tool, _] = request.tools or []
    grammar_tool.function.follow_lark('start: "+" /[a-z\\n]+/')
    messages, _ = tool_prompt(template_messages(request), tool_spec(request), False)
    text = gemma().render(messages, None)
    assert text_call("apply_patch", "+a\nb") in text  # the earlier call, as the text it was
    assert "`apply_patch` takes text, not JSON" in text and "`get_weather`" not in text


def test_earlier_calls_and_results_render_in_order_for_the_next_turn() -> None:
    text = render(gemma(), tools=[WEATHER])
    call = call_text("get_weather", '{"city":"Oslo"}')
    turn = text.index("<start_of_turn>model\nChecking.\n" + call + "<end_of_turn>")
    result = text.index("Result of call_9: get_weather: cloudy")
    assert text.index("Weather in Oslo?") < turn < result < text.rindex("<start_of_turn>model\n")


def test_none_leaves_tools_out_but_still_renders_history() -> None:
    text = render(gemma(), tools=[WEATHER], tool_choice="none")
    assert "get_weather" in text and "You can call functions" not in text
    assert call_text("get_weather", '{"city":"Oslo"}') in text


def test_a_template_that_takes_tools_renders_them_itself() -> None:
    source = (
        "{% for t in tools or [] %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %} CALL {{ c.function.name }}{{ c.function.arguments }}{% endfor %}\n"
        "{% endfor %}"
    )
    template = ChatTemplate(source, "test", bos_token="", eos_token="")
    assert template.takes_tools and not gemma().takes_tools
    text = render(template, tools=[WEATHER])
    assert text.startswith("TOOL get_weather\n")
    assert 'assistant: Checking. CALL get_weather{"city":"Oslo"}' in text
    assert "You can call functions" not in text


def test_a_template_that_takes_tools_is_told_how_a_lark_function_is_called_and_sees_its_calls_as_text() -> None:
    source = (
        "{% for t in tools or [] %}TOOL {{ t.function.name }}: {{ t.function.description }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %} CALL {{ c.function.name }}{{ c.function.arguments }}{% endfor %}\n"
        "{% endfor %}"
    )
    template = ChatTemplate(source, "test", bos_token="", eos_token="")
    patch = {"type": "function", "function": {"name": "apply_patch", "description": "Edit files."}}
    sent = {"id": "call_7", "type": "function", "function": {"name": "apply_patch", "arguments": '{"input":"+a"}'}}
    weather = {"id": "call_8", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"X"}'}}
    history = [
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "content": "On it.", "tool_calls": [sent, weather]},
    ]
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": history, "tools": [patch, WEATHER]})
    [grammar_tool, _] = request.tools or []
    grammar_tool.function.follow_lark('start: "+" /[a-z]+/')
    messages, tools = tool_prompt(template_messages(request), tool_spec(request), template.takes_tools)
    text = template.render(messages, tools)
    assert "TOOL apply_patch: Edit files. `apply_patch` takes text, not JSON" in text
    assert "TOOL get_weather: Weather now.\n" in text
    # The text call as the grammar writes it; the JSON call left for the template.
    assert f"assistant: On it.\n{text_call('apply_patch', '+a')} CALL get_weather" in text
    assert "CALL apply_patch" not in text
