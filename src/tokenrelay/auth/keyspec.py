"""The fields of a new key, validated the same way for `keys create` and `POST /admin/keys`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from tokenrelay.auth.keystore import KeySpec
from tokenrelay.config import decimal_amount
from tokenrelay.limits.periods import Period
from tokenrelay.pricing.cost import micros_of
from tokenrelay.store.timeutil import DURATION_PATTERN, parse_expiry, utcnow

# The ledger's columns: 32-bit for the per-minute limits, 64-bit for the token budget.
PositiveLimit = Annotated[int, Field(ge=1, le=2**31 - 1)]
# A duration from now or a moment; either must be in the future (and before the year 10000).
Expiry = Annotated[
    str,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": DURATION_PATTERN},
                {"type": "string", "format": "date"},
                {"type": "string", "format": "date-time"},
            ]
        }
    ),
]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:\-]*$")]
    models: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    rpm: PositiveLimit | None = None
    tpm: PositiveLimit | None = None
    budget_tokens: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    # Below a trillion units of currency; what is finer than a micro-unit is rounded to one.
    budget_cost: decimal_amount(12) | None = Field(  # type: ignore[valid-type]  # an Annotated type a call builds
        default=None, description="money this key may spend per budget period, in the server's currency"
    )
    budget_period: Period = Field(
        default="total", description="when the budgets' spend starts from zero again (UTC calendar periods)"
    )
    expires: Expiry | None = Field(default=None, description="30d, 12h, 2w ... from now, or an ISO date / date-time")
    admin: bool = False

    @field_validator("expires")
    @classmethod
    def _valid_expiry(cls, value: str | None) -> str | None:
        if value is not None and parse_expiry(value) <= utcnow():
            raise ValueError("expires must be in the future")
        return value

    def spec(self) -> KeySpec:
        return KeySpec(
            name=self.name,
            models=sorted(set(self.models)) if self.models is not None else None,
            rpm=self.rpm,
            tpm=self.tpm,
            budget_tokens=self.budget_tokens,
            budget_cost=None if self.budget_cost is None else micros_of(self.budget_cost),
            budget_period=self.budget_period,
            expires_at=parse_expiry(self.expires) if self.expires is not None else None,
            admin=self.admin,
        )
