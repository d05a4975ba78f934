"""Cost as every usage report gives it: an exact decimal amount for people, its integer micro-units for sums."""

from __future__ import annotations

from typing import Any

from tokenrelay.pricing.cost import money


def cost_figures(micros: int) -> dict[str, Any]:
    return {"cost": money(micros), "cost_micros": micros}
