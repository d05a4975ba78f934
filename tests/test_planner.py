"""The fairness rule between decoding and prompt prefill, and chunk alignment."""

from __future__ import annotations

from tokenrelay.backends.llamacpp.planner import PrefillNeed, aligned_prefix, aligned_take, plan_step, split_passes

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


def test_one_prompt_chunk_per_step_first_come_first_served() -> None:
    plan = plan_step([5], [PrefillNeed(0, 0, 40), PrefillNeed(1, 0, 40)], CHUNK)
    assert plan.prefill == [(0, 40)]


def test_chunks_end_on_fixed_boundaries_whatever_the_start() -> None:
    assert aligned_take(0, 1000, CHUNK) == 64
    assert aligned_take(10, 1000, CHUNK) == 54
    assert aligned_take(64, 1000, CHUNK) == 64
    assert aligned_take(130, 5, CHUNK) == 5


def test_reused_prefixes_are_whole_chunks() -> None:
    assert aligned_prefix(200, CHUNK) == 192
    assert aligned_prefix(63, CHUNK) == 0


def test_a_step_is_split_into_passes_of_bounded_sequences() -> None:
    passes = split_passes(list(range(16)), [(20, 64)], 7)
    assert passes == [([0, 1, 2, 3, 4, 5], [(20, 64)]), ([6, 7, 8, 9, 10, 11, 12], []), ([13, 14, 15], [])]
    assert split_passes([0, 1], [], 7) == [([0, 1], [])]
    assert split_passes([], [(3, 10)], 7) == [([], [(3, 10)])]
