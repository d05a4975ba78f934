"""API keys on a real SQLite database: what is stored, and who a bearer token turns out to be."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from tokenrelay.auth.keystore import KeySpec, KeyStore
from tokenrelay.auth.verifier import KeyVerifier
from tokenrelay.config import AccountingSettings, Settings
from tokenrelay.errors import AuthenticationError, InvalidRequest
from tokenrelay.principal import ANONYMOUS, STATIC_KEY
from tokenrelay.store.database import create_engine
from tokenrelay.store.migrate import upgrade
from tokenrelay.store.schema import api_keys
from tokenrelay.store.timeutil import utcnow

UNCACHED = Settings(accounting=AccountingSettings(key_cache_seconds=0))


def run(tmp_path: Path, scenario: Callable[[KeyStore], Awaitable[None]]) -> None:
    async def opened() -> None:
        engine = create_engine(make_url(f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"))
        await upgrade(engine)
        try:
            await scenario(KeyStore(engine))
        finally:
            await engine.dispose()

    asyncio.run(opened())


def test_a_key_is_stored_hashed_and_shown_by_its_prefix(tmp_path: Path) -> None:
    async def scenario(store: KeyStore) -> None:
        record, secret = await store.create(KeySpec(name="team-a", models=["m"], rpm=5))
        async with store.engine.connect() as conn:
            stored = (await conn.execute(select(api_keys))).one()
        assert secret not in [str(v) for v in stored]  # only its hash
        assert secret.startswith(record.prefix) and len(record.prefix) < len(secret)
        assert (await store.get("team-a")).id == record.id == (await store.get(record.id)).id
        with pytest.raises(InvalidRequest) as taken:
            await store.create(KeySpec(name="team-a"))
        assert taken.value.status == 409

    run(tmp_path, scenario)


def test_a_server_is_open_until_the_first_key_and_stays_closed_after_the_last_is_revoked(tmp_path: Path) -> None:
    async def scenario(store: KeyStore) -> None:
        verifier = KeyVerifier(store, UNCACHED)
        assert await verifier.authenticate(None) is ANONYMOUS
        assert await verifier.authenticate("sk-anything") is ANONYMOUS  # the SDKs always send some token
        record, secret = await store.create(KeySpec(name="only", models=["m"]))
        caller = await verifier.authenticate(secret)
        assert (caller.key_id, caller.may_use("m"), caller.may_use("other")) == (record.id, True, False)
        with pytest.raises(AuthenticationError):
            await verifier.authenticate(None)
        with pytest.raises(AuthenticationError):
            await verifier.authenticate(secret + "x")
        await store.revoke("only")
        with pytest.raises(AuthenticationError):
            await verifier.authenticate(secret)
        with pytest.raises(AuthenticationError):
            await verifier.authenticate(None)

    run(tmp_path, scenario)


def test_rotation_replaces_the_secret_and_keeps_the_key(tmp_path: Path) -> None:
    async def scenario(store: KeyStore) -> None:
        verifier = KeyVerifier(store, UNCACHED)
        record, old = await store.create(KeySpec(name="rotating", budget_tokens=50))
        rotated, new = await store.rotate("rotating")
        assert rotated.id == record.id and rotated.budget_tokens == 50 and new != old
        assert (await verifier.authenticate(new)).key_id == record.id
        with pytest.raises(AuthenticationError):
            await verifier.authenticate(old)
        await store.revoke(record.id)
        with pytest.raises(InvalidRequest) as revoked:
            await store.rotate(record.id)
        assert revoked.value.status == 409

    run(tmp_path, scenario)


def test_an_expired_key_is_refused_and_a_static_key_accepted(tmp_path: Path) -> None:
    async def scenario(store: KeyStore) -> None:
        settings = Settings(api_key="static-secret-for-tests", accounting=AccountingSettings(key_cache_seconds=0))
        verifier = KeyVerifier(store, settings)
        _, secret = await store.create(KeySpec(name="old", expires_at=utcnow() - timedelta(seconds=1)))
        with pytest.raises(AuthenticationError):
            await verifier.authenticate(secret)
        assert await verifier.authenticate("static-secret-for-tests") is STATIC_KEY
        with pytest.raises(AuthenticationError):
            await verifier.authenticate(None)  # a static key closes the server too

    run(tmp_path, scenario)
