"""API keys in the database: create, list, revoke, rotate, and look one up by the hash of its secret."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, exists, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from tokenrelay.auth.keysecrets import display_prefix, hash_secret, new_key_id, new_secret, same_hash
from tokenrelay.errors import InvalidRequest, NotFound
from tokenrelay.limits.periods import next_reset, period_start
from tokenrelay.pricing.cost import money
from tokenrelay.principal import Principal
from tokenrelay.store.schema import api_keys, key_counters
from tokenrelay.store.timeutil import iso, utcnow


@dataclass(frozen=True, slots=True)
class KeySpec:
    """What `keys create` and `POST /admin/keys` ask for."""

    name: str
    models: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    budget_tokens: int | None = None
    budget_cost: int | None = None  # micro-units of the settings' currency
    budget_period: str = "total"
    expires_at: datetime | None = None
    admin: bool = False


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as `keys list` shows it: everything but the secret, which is never stored."""

    id: str
    name: str
    prefix: str
    models: list[str] | None
    admin: bool
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_used: int  # tokens spent in the current budget period
    budget_cost: int | None  # micro-units
    cost_used: int  # micro-units spent in the current budget period
    budget_period: str
    resets_at: datetime | None  # when the period's spend starts from zero again
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "api_key",
            "name": self.name,
            "prefix": self.prefix,
            "models": self.models,
            "admin": self.admin,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "budget_tokens": self.budget_tokens,
            "budget_used": self.budget_used,
            "budget_cost": None if self.budget_cost is None else money(self.budget_cost),
            "cost_used": money(self.cost_used),
            "budget_period": self.budget_period,
            "resets_at": iso(self.resets_at),
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
            "last_used_at": iso(self.last_used_at),
        }


_RECORD_COLUMNS = [
    api_keys.c.id,
    api_keys.c.name,
    api_keys.c.prefix,
    api_keys.c.models,
    api_keys.c.admin,
    api_keys.c.rpm,
    api_keys.c.tpm,
    api_keys.c.budget_tokens,
    api_keys.c.budget_cost,
    api_keys.c.budget_period,
    key_counters.c.budget_used,
    key_counters.c.cost_used,
    key_counters.c.period_start,
    api_keys.c.created_at,
    api_keys.c.expires_at,
    api_keys.c.revoked_at,
    api_keys.c.last_used_at,
]


def _record(row: Row, now: datetime) -> KeyRecord:
    fields = row._asdict()
    start = period_start(row.budget_period, now)
    if start is not None and (row.period_start is None or row.period_start < start):
        fields.update(budget_used=0, cost_used=0)  # no request yet in this period
    del fields["period_start"]
    return KeyRecord(**fields, resets_at=next_reset(row.budget_period, now))


def _principal(row: Row) -> Principal:
    models = frozenset(row.models) if row.models is not None else None
    return Principal(
        key_id=row.id,
        name=row.name,
        models=models,
        rpm=row.rpm,
        tpm=row.tpm,
        budget_tokens=row.budget_tokens,
        budget_cost=row.budget_cost,
        budget_period=row.budget_period,
        admin=row.admin,
        expires_at=row.expires_at,
    )


class KeyStore:
    def __init__(self, engine: AsyncEngine, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.clock = clock  # naive UTC now: which budget period a key's spend is shown for

    async def create(self, spec: KeySpec) -> tuple[KeyRecord, str]:
        secret, key_id, now = new_secret(), new_key_id(), utcnow()
        values = {
            "id": key_id,
            "name": spec.name,
            "prefix": display_prefix(secret),
            "secret_hash": hash_secret(secret),
            "models": spec.models,
            "admin": spec.admin,
            "rpm": spec.rpm,
            "tpm": spec.tpm,
            "budget_tokens": spec.budget_tokens,
            "budget_cost": spec.budget_cost,
            "budget_period": spec.budget_period,
            "created_at": now,
            "expires_at": spec.expires_at,
        }
        try:
            async with self.engine.begin() as conn:
                await conn.execute(insert(api_keys).values(values))
                await conn.execute(insert(key_counters).values(_fresh_counters(key_id)))
        except IntegrityError:
            raise InvalidRequest(f"A key named {spec.name!r} already exists.", code="key_exists", status=409) from None
        return await self.get(key_id), secret

    async def list(self) -> list[KeyRecord]:
        query = self._records().order_by(api_keys.c.created_at, api_keys.c.id)
        async with self.engine.connect() as conn:
            now = self.clock()
            return [_record(row, now) for row in await conn.execute(query)]

    async def get(self, ref: str) -> KeyRecord:
        """A key by id or by name."""
        query = self._records().where((api_keys.c.id == ref) | (api_keys.c.name == ref))
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None:
            raise NotFound(f"No API key with id or name {ref!r}.", code="key_not_found")
        return _record(row, self.clock())

    async def revoke(self, ref: str) -> KeyRecord:
        record = await self.get(ref)
        if record.revoked_at is None:
            query = update(api_keys).where(api_keys.c.id == record.id, api_keys.c.revoked_at.is_(None))
            async with self.engine.begin() as conn:
                await conn.execute(query.values(revoked_at=utcnow()))
        return await self.get(record.id)

    async def rotate(self, ref: str) -> tuple[KeyRecord, str]:
        """A new secret for the same key (same id, limits and usage); the old secret stops working."""
        record = await self.get(ref)
        if record.revoked_at is not None:
            raise InvalidRequest(f"Key {record.name!r} is revoked; create a new one.", code="key_revoked", status=409)
        secret = new_secret()
        values = {"secret_hash": hash_secret(secret), "prefix": display_prefix(secret), "rotated_at": utcnow()}
        async with self.engine.begin() as conn:
            await conn.execute(update(api_keys).where(api_keys.c.id == record.id).values(values))
        return await self.get(record.id), secret

    async def principal(self, secret_hash: str) -> Principal | None:
        """The unrevoked key with this hash (expiry is checked by the caller on every request)."""
        query = select(api_keys).where(api_keys.c.secret_hash == secret_hash, api_keys.c.revoked_at.is_(None))
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None or not same_hash(row.secret_hash, secret_hash):
            return None
        return _principal(row)

    async def principal_by_id(self, key_id: str) -> Principal | None:
        """The unrevoked key with this id: whom a batch's lines act for, checked again as they run."""
        query = select(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else _principal(row)

    async def any_keys(self) -> bool:
        """True once any key was ever created, revoked ones included: revoking the last key must not open the server."""
        async with self.engine.connect() as conn:
            return bool((await conn.execute(select(exists().select_from(api_keys)))).scalar())

    @staticmethod
    def _records() -> Any:
        return select(*_RECORD_COLUMNS).select_from(api_keys.join(key_counters))


def _fresh_counters(key_id: str) -> dict[str, Any]:
    return {
        "key_id": key_id,
        "rpm_level": 0.0,
        "rpm_at": 0.0,
        "tpm_level": 0.0,
        "tpm_at": 0.0,
        "budget_used": 0,
        "budget_reserved": 0,
        "cost_used": 0,
        "cost_reserved": 0,
    }
