"""Sampling on a logits row: greedy, seeded draws, temperature, top-k, top-p, bias, penalties, grammar masks and
the logprobs of the distribution drawn from."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tokenrelay.backends.llamacpp import sampling
from tokenrelay.backends.llamacpp.sampling import SamplingParams, TokenSampler, scale

VOCAB = 3089


def logits(peaks: dict[int, float], rest: float = -30.0) -> np.ndarray:
    row = np.full(VOCAB, rest, dtype=np.float32)
    for token, value in peaks.items():
        row[token] = value
    return row


def draws(params: SamplingParams, row: np.ndarray, count: int) -> list[int]:
    sampler = TokenSampler(params, VOCAB)
    return [sampler.sample_row(row.copy()).token for _ in range(count)]


def probabilities(row: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    scaled = row.astype(np.float64) / temperature
    weights = np.exp(scaled - scaled.max())
    return weights / weights.sum()


def frequencies(tokens: list[int]) -> dict[int, float]:
    return {token: count / len(tokens) for token, count in Counter(tokens).items()}


ROW = logits({5: 3.0, 1500: 2.5, 2100: 2.0, 3080: 1.0, 40: 0.0})


def test_greedy_takes_the_most_likely_token() -> None:
    assert draws(SamplingParams(temperature=0.0), ROW, 3) == [5, 5, 5]


def test_the_same_seed_draws_the_same_tokens_and_another_seed_others() -> None:
    first = draws(SamplingParams(seed=7), ROW, 50)
    assert draws(SamplingParams(seed=7), ROW, 50) == first
    assert draws(SamplingParams(seed=8), ROW, 50) != first


def test_draws_follow_the_temperature_scaled_distribution() -> None:
    for temperature in (0.5, 1.0, 2.0):
        seen = frequencies(draws(SamplingParams(temperature=temperature, seed=1), ROW, 20_000))
        expected = probabilities(ROW, temperature)
        for token in (5, 1500, 2100, 3080, 40):
            assert seen.get(token, 0.0) == pytest.approx(expected[token], abs=0.015)


def test_tokens_far_below_the_top_are_drawn_as_often_as_their_weight_says(monkeypatch: pytest.MonkeyPatch) -> None:
    # Far tokens are drawn only when a draw lands past the near ones' weight, which is rare with the real margin;
    # a margin of one logit puts most of this row's weight far from its top, so most draws go that way.
    monkeypatch.setattr(sampling, "TAIL", 1.0)
    row = np.linspace(0.0, -3.0, VOCAB, dtype=np.float32)
    seen = draws(SamplingParams(seed=2), row, 20_000)
    expected = probabilities(row)
    for part in np.array_split(np.arange(VOCAB), 4):  # shares about 0.56, 0.26, 0.12, 0.06
        assert np.isin(seen, part).mean() == pytest.approx(expected[part].sum(), abs=0.015)


def test_top_p_draws_from_the_smallest_set_that_reaches_the_mass() -> None:
    expected = probabilities(ROW)  # 5: 0.46, 1500: 0.28, 2100: 0.17, then 0.06 and 0.02
    seen = frequencies(draws(SamplingParams(top_p=0.7, seed=2), ROW, 20_000))
    assert set(seen) == {5, 1500}
    assert seen[5] == pytest.approx(expected[5] / (expected[5] + expected[1500]), abs=0.015)
    assert set(draws(SamplingParams(top_p=0.8, seed=2), ROW, 2000)) == {5, 1500, 2100}


def test_top_p_applies_to_the_temperature_scaled_distribution() -> None:
    # At temperature 0.2 the most likely token alone holds more than 0.9 of the mass.
    assert set(draws(SamplingParams(temperature=0.2, top_p=0.9, seed=3), ROW, 500)) == {5}


def test_top_p_over_a_flat_distribution_keeps_every_token_it_needs() -> None:
    row = np.random.default_rng(0).normal(size=VOCAB).astype(np.float32)
    tokens = draws(SamplingParams(temperature=3.0, top_p=0.5, seed=4), row, 2000)
    order = np.argsort(-probabilities(row, 3.0), kind="stable")
    cumulative = np.cumsum(probabilities(row, 3.0)[order])
    nucleus = set(order[: int(np.searchsorted(cumulative, 0.5)) + 1].tolist())
    assert set(tokens) <= nucleus and len(set(tokens)) > 100


def test_top_k_draws_from_the_k_most_likely_tokens() -> None:
    seen = frequencies(draws(SamplingParams(top_k=2, seed=5), ROW, 20_000))
    assert set(seen) == {5, 1500}
    expected = probabilities(ROW)
    assert seen[5] == pytest.approx(expected[5] / (expected[5] + expected[1500]), abs=0.015)


def test_top_k_then_top_p_within_the_k() -> None:
    assert set(draws(SamplingParams(top_k=3, top_p=0.6, seed=6), ROW, 2000)) == {5, 1500}


def test_logit_bias_bans_and_boosts() -> None:
    assert set(draws(SamplingParams(temperature=0.0, logit_bias={5: -100.0}), ROW, 3)) == {1500}
    assert set(draws(SamplingParams(top_p=0.5, logit_bias={3080: 10.0}, seed=1), ROW, 200)) == {3080}
    banned = draws(SamplingParams(seed=9, logit_bias={5: -100.0, 1500: -100.0}), ROW, 2000)
    assert 5 not in banned and 1500 not in banned


def test_presence_and_frequency_penalties_lower_tokens_already_drawn() -> None:
    row = logits({5: 3.0, 6: 2.9})
    # A presence penalty counts once per token, a frequency penalty once per time the token was drawn.
    assert draws(SamplingParams(temperature=0.0, presence_penalty=0.5), row, 4) == [5, 6, 5, 5]
    assert draws(SamplingParams(temperature=0.0, frequency_penalty=0.06), row, 4) == [5, 5, 6, 5]


class AllowOnly:
    """A stand-in for a grammar constraint that allows a fixed set of tokens."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.accepted: list[int] = []
        self.complete = False

    def restrict(self, row: np.ndarray) -> None:
        keep = np.zeros(row.size, dtype=bool)
        keep[list(self.allowed)] = True
        row[~keep] = -np.inf

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def test_a_grammar_mask_limits_the_draw_and_the_logprobs() -> None:
    constraint = AllowOnly({2100, 40})
    sampler = TokenSampler(SamplingParams(seed=1, top_logprobs=5), VOCAB, constraint)  # type: ignore[arg-type]
    tokens = [sampler.sample_row(ROW.copy()) for _ in range(200)]
    assert {draw.token for draw in tokens} == {2100, 40}
    assert constraint.accepted == [draw.token for draw in tokens]
    assert [token for token, _ in tokens[0].top] == [2100, 40]  # nothing outside the grammar is listed
    assert sum(np.exp(lp) for _, lp in tokens[0].top) == pytest.approx(1.0)


def test_a_row_with_every_token_banned_still_yields_a_token() -> None:
    sampler = TokenSampler(SamplingParams(seed=1), VOCAB, AllowOnly(set()))  # type: ignore[arg-type]
    assert 0 <= sampler.sample_row(ROW.copy()).token < VOCAB


def test_logprobs_are_those_of_the_temperature_scaled_row_and_list_the_most_likely() -> None:
    sampler = TokenSampler(SamplingParams(temperature=0.5, seed=3, top_logprobs=3), VOCAB)
    draw = sampler.sample_row(ROW.copy())
    expected = np.log(probabilities(ROW, 0.5))
    assert draw.logprob == pytest.approx(expected[draw.token], abs=1e-5)
    assert [token for token, _ in draw.top] == [5, 1500, 2100]
    assert [lp for _, lp in draw.top] == pytest.approx([expected[5], expected[1500], expected[2100]], abs=1e-5)


def test_greedy_logprobs_are_those_of_the_unscaled_row() -> None:
    draw = TokenSampler(SamplingParams(temperature=0.0, top_logprobs=2), VOCAB).sample_row(ROW.copy())
    assert draw.token == 5
    assert draw.logprob == pytest.approx(np.log(probabilities(ROW)[5]), abs=1e-5)
    assert [token for token, _ in draw.top] == [5, 1500]


def test_scoring_alone_gives_the_logprob_without_alternatives() -> None:
    draw = TokenSampler(SamplingParams(seed=1, score=True), VOCAB).sample_row(ROW.copy())
    assert draw.logprob is not None and draw.top == []
    assert TokenSampler(SamplingParams(seed=1), VOCAB).sample_row(ROW.copy()).logprob is None


def test_top_logprobs_of_a_flat_row_are_the_k_largest() -> None:
    row = np.random.default_rng(1).normal(size=VOCAB).astype(np.float32)
    top = scale(row, 1.0).top(20)
    assert [token for token, _ in top] == np.argsort(-row, kind="stable")[:20].tolist()
