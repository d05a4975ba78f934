"""What tokens cost, in integer micro-units (millionths) of the settings' currency.

A price is per million tokens, so a token costs `price` micro-units: the arithmetic is exact in decimals, and
a call's cost is rounded once, half up, to a whole micro-unit. A reservation's worst case rounds up, so it is
never less than what the call can cost.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from tokenrelay.backends.base import Usage
from tokenrelay.config import Pricing

MICROS = 1_000_000  # micro-units per unit of currency


def cost_micros(pricing: Pricing | None, usage: Usage) -> int:
    """What a call with this usage costs; 0 for an unpriced model. Cached prompt tokens are at `cached_input`."""
    if pricing is None:
        return 0
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    fresh = usage.prompt_tokens - cached
    exact = fresh * pricing.input + cached * pricing.cached + usage.completion_tokens * pricing.output
    return int(exact.to_integral_value(ROUND_HALF_UP))


def worst_cost_micros(pricing: Pricing | None, prompt_tokens: int, completion_tokens: int) -> int:
    """The most a call bounded by these token counts can cost (cached tokens never cost more than new ones)."""
    if pricing is None:
        return 0
    most = prompt_tokens * max(pricing.input, pricing.cached) + completion_tokens * pricing.output
    return int(most.to_integral_value(ROUND_CEILING))


def money(micros: int) -> str:
    """Micro-units as a decimal amount (`1234567` → `1.234567`), exact, for reports and the API."""
    return str(Decimal(micros).scaleb(-6).quantize(Decimal("0.000001")))


def micros_of(amount: Decimal) -> int:
    """A decimal amount of currency (a budget) in micro-units, rounded half up to a whole one."""
    return int((amount * MICROS).to_integral_value(ROUND_HALF_UP))
