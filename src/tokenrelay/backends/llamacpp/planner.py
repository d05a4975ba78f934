"""Which tokens go into the next `llama_decode`: the fairness rule between decoding and prefilling.

Every decoding sequence gets exactly one token in every step, so a stream is never stalled by someone
else's prompt; prompts are evaluated in chunks from what is left of the batch, capped at `prefill_chunk`
tokens per step while anyone is decoding (the whole batch when no one is), first come first served.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepLimits:
    batch_size: int
    prefill_chunk: int
    max_outputs: int  # rows of logits one step may produce (each row is n_vocab floats)


@dataclass(frozen=True, slots=True)
class PrefillNeed:
    key: int  # slot id
    pending: int  # prompt tokens still to evaluate
    all_logits: bool  # every prompt position needs logits (echo with logprobs)


@dataclass(frozen=True, slots=True)
class StepPlan:
    decode: list[int]  # slot ids decoding one token
    prefill: list[tuple[int, int]]  # (slot id, tokens to evaluate this step)


def plan_step(decoding: list[int], prefilling: list[PrefillNeed], limits: StepLimits) -> StepPlan:
    decode = decoding[: limits.batch_size]
    room = limits.batch_size - len(decode)
    budget = min(room, limits.prefill_chunk if decode else room)
    outputs = limits.max_outputs - len(decode)
    prefill: list[tuple[int, int]] = []
    for need in prefilling:
        take = min(budget, need.pending)
        if need.all_logits:
            take = min(take, outputs)
        if take <= 0:
            break
        prefill.append((need.key, take))
        budget -= take
        outputs -= take if need.all_logits else 1
    return StepPlan(decode=decode, prefill=prefill)
