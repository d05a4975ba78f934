"""What a call costs: integer micro-units from decimal prices per million tokens, rounded once."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import ValidationError

from tokenrelay.backends.base import Usage
from tokenrelay.config import Pricing, Settings
from tokenrelay.pricing.book import PriceBook
from tokenrelay.pricing.cost import cost_micros, money, worst_cost_micros

PRICES = Pricing(input=Decimal("1.25"), cached_input=Decimal("0.3"), output=Decimal("2.5"))


def test_cached_prompt_tokens_cost_the_cached_price_and_the_sum_is_rounded_once() -> None:
    # 30 new prompt tokens at 1.25 + 7 cached at 0.3 + 5 completion at 2.5 = 37.5 + 2.1 + 12.5 = 52.1 micro-units
    assert cost_micros(PRICES, Usage(prompt_tokens=37, completion_tokens=5, cached_tokens=7)) == 52
    # One new prompt token at 0.4 and one cached at 0.3: 0.7 rounds to 1 (rounding each part would give 0)
    cheap = Pricing(input=Decimal("0.4"), cached_input=Decimal("0.3"), output=Decimal(1))
    assert cost_micros(cheap, Usage(prompt_tokens=2, cached_tokens=1)) == 1
    assert cost_micros(Pricing(input=Decimal("0.5"), output=Decimal(0)), Usage(prompt_tokens=1)) == 1  # half up
    assert cost_micros(None, Usage(prompt_tokens=10**6, completion_tokens=10**6)) == 0  # unpriced


def test_prices_read_exactly_from_numbers_and_digit_strings() -> None:
    assert Pricing(input=0.15, output="0.6") == Pricing(input=Decimal("0.15"), output=Decimal("0.6"))
    assert cost_micros(Pricing(input=0.1, output=0.2), Usage(prompt_tokens=10, completion_tokens=10)) == 3  # 1 + 2


def test_a_million_tokens_cost_the_price_and_large_counts_stay_exact() -> None:
    assert money(cost_micros(PRICES, Usage(prompt_tokens=10**6))) == "1.250000"
    many = Usage(prompt_tokens=10**12, completion_tokens=3 * 10**12)
    assert cost_micros(PRICES, many) == 1_250_000_000_000 + 7_500_000_000_000  # no float could hold it exactly


def test_the_worst_case_rounds_up_and_assumes_no_cache_discount() -> None:
    assert worst_cost_micros(PRICES, 3, 1) == 7  # 3.75 + 2.5 = 6.25 → 7
    cheaper_cache_than_input = Pricing(input=Decimal(1), cached_input=Decimal(2), output=Decimal(0))
    assert worst_cost_micros(cheaper_cache_than_input, 10, 0) == 20


def test_a_reservation_assumes_the_dearest_node_and_fallback() -> None:
    settings = Settings(
        models=[
            {
                "id": "a",
                "upstreams": [{"url": "http://127.0.0.1:9/v1", "pricing": {"input": 5, "output": 1}}],
                "pricing": {"input": 1, "output": 1},
                "fallbacks": ["b"],
            },
            {"id": "b", "path": "/m.gguf", "pricing": {"input": 2, "output": 9}},
            {"id": "c", "path": "/c.gguf"},
        ]
    )
    nodes = {"a": {"127.0.0.1:9": settings.models[0].upstreams[0]}}
    book = PriceBook(settings.models, lambda model_id: nodes.get(model_id, {}))
    assert book.prices("a", "127.0.0.1:9") == Pricing(input=5, output=1)  # the node's own
    assert book.prices("a", "elsewhere") == Pricing(input=1, output=1)
    assert book.worst("a") == Pricing(input=5, output=9)
    assert book.worst("c") is None and book.prices("c") is None


@pytest.mark.parametrize(
    ("pricing", "problem"),
    [
        ({"input": -1, "output": 1}, "greater than or equal to 0"),
        ({"input": "1e3", "output": 1}, "as a number or as digits"),
        ({"input": 10**9, "output": 1}, "less than 1000000000"),
        ({"input": 1}, "output"),
    ],
)
def test_bad_prices_are_refused_with_the_field_named(pricing: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Settings(models=[{"id": "m", "path": "/m.gguf", "pricing": pricing}])
