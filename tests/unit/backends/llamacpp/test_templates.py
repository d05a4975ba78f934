"""Chat templates render as Hugging Face's `apply_chat_template` does, and the built-in Gemma template."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrelay.backends.llamacpp.templates import ChatTemplate, builtin_template, template_for
from tokenrelay.errors import InvalidRequest

# A template in the style GGUF files carry: whitespace control via trim_blocks/lstrip_blocks, raise_exception.
HF_STYLE = """{% for message in messages %}
{% if message['role'] == 'system' and not loop.first %}{{ raise_exception('system must come first') }}{% endif %}
<|{{ message['role'] }}|>
{{ message['content'] }}</s>
{% endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""


def render(source: str, messages: list[dict]) -> str:
    return ChatTemplate(source, "test", bos_token="<bos>", eos_token="</s>").render(messages)


def test_hf_style_template_uses_trim_and_lstrip_blocks() -> None:
    out = render(HF_STYLE, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert out == "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"


def test_template_exceptions_become_400_naming_messages() -> None:
    with pytest.raises(InvalidRequest) as info:
        render(HF_STYLE, [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}])
    assert info.value.param == "messages" and "system must come first" in info.value.message


def test_gemma_builtin_merges_system_into_the_first_user_turn_and_names_speakers() -> None:
    out = render(
        builtin_template("gemma"),
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi", "name": "ann"},
            {"role": "assistant", "content": "Hello."},
            {"role": "tool", "content": "42", "tool_call_id": "call_7"},
        ],
    )
    assert out == (
        "<bos><start_of_turn>user\nBe brief.\n\nann: Hi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nResult of call_7: 42<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def continued(source: str, messages: list[dict]) -> str:
    return ChatTemplate(source, "test", bos_token="<bos>", eos_token="</s>").render(messages, continued=True)


def test_a_continued_assistant_message_is_left_open() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]
    assert continued(HF_STYLE, messages) == "<|user|>\nHi</s>\n<|assistant|>\nHello, I am"
    gemma = continued(builtin_template("gemma"), messages)
    assert gemma == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello, I am"


def test_the_continued_text_is_found_by_its_place_not_by_its_words() -> None:
    # "end" also appears in the closing tag after it: the prompt still ends with the message as written.
    tags = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}</end>{% endfor %}"
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The end "}]
    assert continued(tags, messages) == "<user>Hi</end><assistant>The end "


def test_an_empty_message_to_continue_opens_the_turn_as_usual() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]
    assert continued(HF_STYLE, messages) == render(HF_STYLE, messages[:1])


def test_a_template_that_hides_the_message_cannot_continue_it() -> None:
    hides = "{% for m in messages %}{{ m['role'] }};{% endfor %}"
    with pytest.raises(InvalidRequest) as info:
        continued(hides, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}])
    assert info.value.param == "continue_final_message"


def test_template_choice_order(tmp_path: Path) -> None:
    custom = tmp_path / "t.jinja"
    custom.write_text("X")
    assert template_for("gemma3", "EMBEDDED", custom) == ("X", f"file {custom}")
    assert template_for("gemma3", "EMBEDDED", None) == ("EMBEDDED", "gguf")
    assert template_for("gemma3", None, None)[1] == "built-in gemma"
    assert template_for("mystery", None, None)[1] == "built-in chatml"


def test_the_model_repositorys_template_is_asked_for_only_when_the_gguf_has_none() -> None:
    asked: list[str] = []

    def from_repo() -> str | None:
        asked.append("asked")
        return "REPO"

    assert template_for("gemma3", "EMBEDDED", None, from_repo) == ("EMBEDDED", "gguf")
    assert asked == []
    assert template_for("gemma3", None, None, from_repo) == ("REPO", "repository tokenizer_config.json")
    assert template_for("gemma3", None, None, lambda: None)[1] == "built-in gemma"
