"""`/v1/completions` on the embedded engine with the default model, through the official client."""

from __future__ import annotations

import pytest
from helpers import CHAT_MODEL, MODEL, chunks, sse_events, validate
from openai import BadRequestError, OpenAI

PROMPT = "The three primary colours are"


def test_response_shape_and_schema(client: OpenAI) -> None:
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    validate(raw.http_response.json(), "completion")
    reply = raw.parse()
    assert reply.object == "text_completion"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 4
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


def test_default_max_tokens_is_16(client: OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, logit_bias={"1": -100, "106": -100})
    assert reply.usage.completion_tokens == 16


def test_list_prompts_give_prompt_major_blocks_of_n(client: OpenAI) -> None:
    prompts = ["Red, green and", "One, two,"]
    reply = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=3, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=3, temperature=0) for p in prompts]
    assert reply.choices[0].text == reply.choices[1].text == singles[0].choices[0].text
    assert reply.choices[2].text == reply.choices[3].text == singles[1].choices[0].text
    assert reply.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert reply.usage.completion_tokens == 12


def test_token_id_prompts_match_text_prompts(client: OpenAI, server) -> None:
    with server.http() as http:
        ids = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT, "add_special": True}).json()["tokens"]
    text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0)
    flat = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    nested = client.completions.create(model=MODEL, prompt=[ids, ids[:3]], max_tokens=5, temperature=0)
    assert flat.choices[0].text == text.choices[0].text == nested.choices[0].text
    assert len(nested.choices) == 2
    with pytest.raises(BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=[5, 10**7], max_tokens=1)
    assert info.value.body["param"] == "prompt"


def test_echo_returns_prompt_first_and_max_tokens_zero_only_the_prompt(client: OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, echo=True, temperature=0)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    assert reply.choices[0].text == PROMPT + plain.choices[0].text
    only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert only.choices[0].text == PROMPT
    assert only.usage.completion_tokens == 0


def test_echo_with_logprobs_scores_the_prompt(client: OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, echo=True, logprobs=2, temperature=0)
    lp = reply.choices[0].logprobs
    text = reply.choices[0].text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == text
    assert lp.text_offset[0] == 0
    assert all(text[off:].startswith(tok) for off, tok in zip(lp.text_offset, lp.tokens, strict=True))
    prompt_positions = sum(1 for off in lp.text_offset if off < len(PROMPT))
    assert len(lp.tokens) == prompt_positions + 3
    # The generated part's logprobs equal those of the same request without echo.
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logprobs=2, temperature=0)
    assert lp.token_logprobs[-3:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)


def test_logprobs_top_entries_include_the_chosen_token(client: OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=3, temperature=0)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == 4
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3
        assert top[token] == pytest.approx(value)
        assert value == pytest.approx(max(top.values()))


def test_best_of_returns_the_candidate_with_the_highest_mean_logprob(client: OpenAI) -> None:
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 11}
    candidates = client.completions.create(n=3, logprobs=0, **kwargs).choices
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in candidates]
    best = client.completions.create(best_of=3, n=1, **kwargs)
    assert len(best.choices) == 1
    assert best.choices[0].text == candidates[means.index(max(means))].text
    assert best.usage.completion_tokens == 18  # every candidate is paid for


def test_best_of_rules(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, best_of=1, n=2, max_tokens=1)
    assert info.value.body["param"] == "best_of"
    with pytest.raises(BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, best_of=3, n=1, max_tokens=1, stream=True)
    assert info.value.body["param"] == "best_of"


@pytest.mark.parametrize("model", [MODEL, CHAT_MODEL])
def test_an_empty_prompt_starts_a_new_document(client: OpenAI, model: str) -> None:
    # One model adds a BOS token, the other has none and starts from its end-of-sequence token.
    reply = client.completions.create(model=model, prompt="", max_tokens=3, temperature=0, echo=True)
    assert reply.usage.prompt_tokens == 1
    assert reply.usage.completion_tokens == 3
    again = client.completions.create(model=model, prompt="", max_tokens=3, temperature=0)
    assert reply.choices[0].text == again.choices[0].text  # the echo of "" adds nothing


def test_suffix_without_fim_tokens_is_a_clear_400(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="def f(", suffix="return x", max_tokens=2)
    assert info.value.body["param"] == "suffix"
    assert "fill-in-the-middle" in info.value.message


def test_stream_matches_non_stream_and_ends_with_done(server, client: OpenAI) -> None:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with server.http() as http:
        events = chunks(sse_events(http, "/v1/completions", body))
    assert all(c["object"] == "text_completion" for c in events)
    text = "".join(c["choices"][0]["text"] for c in events if c["choices"])
    assert text == client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8
    assert [c["choices"][0]["finish_reason"] for c in events if c["choices"]][-1] == "length"


def test_stop_string_in_completions(client: OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    stop = full[4:7]
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop)
    assert reply.choices[0].text == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
