"""The fairness rule between decoding and prompt prefill."""

from __future__ import annotations

from tokenrelay.backends.llamacpp.planner import PrefillNeed, StepLimits, plan_step

LIMITS = StepLimits(batch_size=512, prefill_chunk=64, max_outputs=32)


def test_every_decoding_sequence_gets_a_token_while_a_long_prompt_prefills() -> None:
    decoding = [0, 1, 2]
    long_prompt = PrefillNeed(key=3, pending=3000, all_logits=False)
    steps = 0
    pending = long_prompt.pending
    while pending:
        plan = plan_step(decoding, [PrefillNeed(3, pending, False)], LIMITS)
        assert plan.decode == decoding  # nobody's stream waits for the prompt
        ((key, take),) = plan.prefill
        assert key == 3 and take <= LIMITS.prefill_chunk
        pending -= take
        steps += 1
    assert steps == -(-3000 // 64)


def test_prefill_uses_the_whole_batch_when_nobody_decodes() -> None:
    plan = plan_step([], [PrefillNeed(0, 3000, False)], LIMITS)
    assert plan.prefill == [(0, 512)]


def test_prompts_are_served_first_come_first_served_within_the_budget() -> None:
    plan = plan_step([5], [PrefillNeed(0, 40, False), PrefillNeed(1, 40, False)], LIMITS)
    assert plan.prefill == [(0, 40), (1, 24)]


def test_prompt_logprobs_are_bounded_by_logit_rows() -> None:
    plan = plan_step([], [PrefillNeed(0, 500, True)], LIMITS)
    assert plan.prefill == [(0, 32)]
