"""What each sequence of a request samples with: the request's sampling fields as the scheduler's plans."""

from __future__ import annotations

from tokenrelay.backends.llamacpp.jobs import SeqPlan
from tokenrelay.backends.llamacpp.sampling import SamplingParams, derive_seed
from tokenrelay.backends.llamacpp.structured.constraint import GrammarConstraint
from tokenrelay.protocol.common import GenerationRequest


def seq_plans(
    request: GenerationRequest,
    count: int,
    max_tokens: int,
    top: int | None,
    score: bool,
    first_index: int,
    text_offset: int,
    constraints: list[GrammarConstraint] | None,
) -> list[SeqPlan]:
    """The sampling plan of each of a prompt's `count` sequences (seeds derived per sequence index)."""
    temperature = 1.0 if request.temperature is None else request.temperature
    return [
        SeqPlan(
            index=i,
            params=SamplingParams(
                temperature=temperature,
                top_p=1.0 if request.top_p is None else request.top_p,
                top_k=request.top_k or 0,
                seed=derive_seed(request.seed, first_index + i),
                presence_penalty=request.presence_penalty or 0.0,
                frequency_penalty=request.frequency_penalty or 0.0,
                logit_bias=request.bias_by_token,
                top_logprobs=top,
                score=score,
            ),
            max_tokens=max_tokens,
            stops=request.stop_list,
            text_offset=text_offset,
            constraint=constraints[i] if constraints else None,
        )
        for i in range(count)
    ]
