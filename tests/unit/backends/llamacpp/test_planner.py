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


def test_a_prompt_is_cut_in_whole_units_and_its_last_piece_takes_the_rest_over_the_budget_if_need_be() -> None:
    assert plan_step([9], [PrefillNeed(0, 200, unit=64)], 100).prefill == [(0, 64)]
    assert plan_step([9], [PrefillNeed(0, 200, unit=64)], 150).prefill == [(0, 128)]  # 72 left: a unit and more
    assert plan_step([9], [PrefillNeed(0, 72, unit=64)], 64).prefill == [(0, 72)]  # never a piece under a unit


def test_a_prompt_shorter_than_a_block_goes_with_the_decoding_rows_within_what_the_pieces_before_it_left() -> None:
    first = plan_step([9], [PrefillNeed(0, 200, unit=64), PrefillNeed(1, 20, tail=20, unit=64)], 100)
    assert first.prefill == [(0, 64)] and first.tails == [(1, 20)]
