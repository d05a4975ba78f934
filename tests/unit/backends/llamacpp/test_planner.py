"""The step planner: every decoding sequence gets a token per step; prompts share a per-step budget in arrival order."""

from __future__ import annotations

from tokenrelay.backends.llamacpp.planner import PrefillNeed, plan_step

BUDGET = 64


def test_every_decoding_sequence_gets_a_token_while_a_long_prompt_prefills() -> None:
    decoding = [0, 1, 2]
    pending, steps = 3000, 0
    while pending:
        plan = plan_step(decoding, [PrefillNeed(3, pending)], BUDGET)
        assert plan.decode == decoding  # nobody's stream waits for the prompt
        ((key, take),) = plan.prefill
        assert key == 3 and 0 < take <= BUDGET
        pending, steps = pending - take, steps + 1
    assert steps == -(-3000 // BUDGET)  # the budget is spent in full every step but the last


def test_short_prompts_share_a_step_first_come_first_served() -> None:
    needs = [PrefillNeed(0, 20), PrefillNeed(1, 30), PrefillNeed(2, 20), PrefillNeed(3, 5)]
    # 20 + 30 fit; the third gets what is left (14) and the fourth waits for the next step.
    assert plan_step([5], needs, BUDGET).prefill == [(0, 20), (1, 30), (2, 14)]


def test_a_burst_of_sixteen_prompts_is_evaluated_in_one_step_beside_the_streams() -> None:
    needs = [PrefillNeed(key, 45) for key in range(16)]
    plan = plan_step([16, 17], needs, 1024)
    assert plan.decode == [16, 17]
    assert plan.prefill == [(key, 45) for key in range(16)]


def test_nothing_to_prefill_is_a_decode_only_step() -> None:
    assert plan_step([0, 1], [], BUDGET).prefill == []


def test_whole_blocks_go_as_prompt_pieces_and_a_tail_only_after_its_prompts_blocks() -> None:
    # 200 pending: 192 in blocks of 64, then a tail of 8; a budget of 100 takes one block only, and no tail.
    first = plan_step([9], [PrefillNeed(0, 200, tail=8, unit=64), PrefillNeed(1, 20, tail=20, unit=64)], 100)
    assert first.prefill == [(0, 64)] and first.tails == [(1, 20)]  # the rest of the budget: the next prompt's tail
    last = plan_step([9], [PrefillNeed(0, 72, tail=8, unit=64)], 100)
    assert last.prefill == [(0, 64)] and last.tails == [(0, 8)]
