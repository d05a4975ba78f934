"""Who is calling: the verified key (or the static `--api-key`, or nobody when the server runs open)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str | None
    name: str | None
    models: frozenset[str] | None = None  # None: every model
    rpm: int | None = None
    tpm: int | None = None
    budget_tokens: int | None = None
    budget_cost: int | None = None  # micro-units of the settings' currency
    budget_period: str = "total"  # total | daily | weekly | monthly: when the budgets' spend starts again from 0
    admin: bool = False
    expires_at: datetime | None = None  # naive UTC

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.budgeted

    @property
    def budgeted(self) -> bool:
        return self.budget_tokens is not None or self.budget_cost is not None


ANONYMOUS = Principal(key_id=None, name=None)
STATIC_KEY = Principal(key_id="static", name="api-key")
ADMIN_KEY = Principal(key_id="admin", name="admin-key", admin=True)
