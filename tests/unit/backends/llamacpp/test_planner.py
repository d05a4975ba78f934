"""The fairness rule between decoding and prompt prefill, and chunk alignment."""

from __future__ import annotations

from tokenrelay.backends.llamacpp.planner import PrefillNeed, aligned_prefix, aligned_take, plan_step

CHUNK = 64


def test_every_decoding_sequence_gets_a_token_while_a_long_prompt_prefills() -> None:
    decoding = [0, 1, 2]
    position, pending, steps = 0, 3000, 0
    while pending:
        plan = plan_step(decoding, [PrefillNeed(3, position, pending)], CHUNK)
        assert plan.decode == decoding  # nobody's stream waits for the prompt
        ((key, take),) = plan.prefill
        assert key == 3 and 0 < take <= CHUNK
        position, pending, steps = position + take, pending - take, steps + 1
    assert steps == -(-3000 // CHUNK)


def test_short_prompts_share_a_step_up_to_one_chunk_of_tokens_first_come_first_served() -> None:
    needs = [PrefillNeed(0, 0, 20), PrefillNeed(1, 0, 30), PrefillNeed(2, 0, 20), PrefillNeed(3, 0, 5)]
    # 20 + 30 fit; the third (20) would pass 64, and the fourth may not overtake it.
    assert plan_step([5], needs, CHUNK).prefill == [(0, 20), (1, 30)]
    assert plan_step([5], [PrefillNeed(0, 0, 40), PrefillNeed(1, 0, 40)], CHUNK).prefill == [(0, 40)]


def test_a_long_prompt_is_still_one_chunk_per_step_and_pieces_stay_aligned() -> None:
    plan = plan_step([], [PrefillNeed(0, 10, 500), PrefillNeed(1, 0, 3)], CHUNK)
    assert plan.prefill == [(0, 54), (1, 3)]  # the piece ends on the boundary; what is left fits
    assert plan_step([], [PrefillNeed(0, 64, 500), PrefillNeed(1, 0, 3)], CHUNK).prefill == [(0, 64)]


def test_chunks_end_on_fixed_boundaries_whatever_the_start() -> None:
    assert aligned_take(0, 1000, CHUNK) == 64
    assert aligned_take(10, 1000, CHUNK) == 54
    assert aligned_take(64, 1000, CHUNK) == 64
    assert aligned_take(130, 5, CHUNK) == 5


def test_reused_prefixes_are_whole_chunks() -> None:
    assert aligned_prefix(200, CHUNK) == 192
    assert aligned_prefix(63, CHUNK) == 0
