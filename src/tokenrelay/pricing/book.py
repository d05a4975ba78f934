"""Which prices apply to a call: its serving node's own, else its serving model's, else none (it costs 0)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenrelay.config import ModelSettings, Pricing, UpstreamSettings, fallback_chain

# A model's nodes as they are now (configured and registered), by name.
NodesOf = Callable[[str], dict[str, UpstreamSettings]]


class PriceBook:
    def __init__(self, models: Sequence[ModelSettings], nodes_of: NodesOf) -> None:
        self.settings = list(models)
        self.models = {model.id: model.pricing for model in models}
        self.nodes_of = nodes_of

    def prices(self, model_id: str, node: str | None = None) -> Pricing | None:
        if node is not None:
            settings = self.nodes_of(model_id).get(node)
            if settings is not None and settings.pricing is not None:
                return settings.pricing
        return self.models.get(model_id)

    def worst(self, model_id: str) -> Pricing | None:
        """Prices that bound what a request for `model_id` costs, whichever of its nodes or fallbacks serves it."""
        return self.highest(fallback_chain(model_id, self.settings))

    def highest(self, model_ids: Sequence[str]) -> Pricing | None:
        """Prices that bound the cost of a call any of these models (or any of their nodes) may serve: what a
        reservation assumes before it is known who serves."""
        found = [
            pricing
            for model_id in model_ids
            for pricing in (self.models.get(model_id), *(s.pricing for s in self.nodes_of(model_id).values()))
            if pricing is not None
        ]
        if not found:
            return None
        return Pricing(input=max(max(p.input, p.cached) for p in found), output=max(p.output for p in found))
