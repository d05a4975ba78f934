"""Bearer token → `Principal`: the static keys from settings, then the key store behind a short cache."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from async_lru import alru_cache
from sqlalchemy.exc import SQLAlchemyError

from tokenrelay.auth.keysecrets import hash_secret, looks_like_key, same_hash
from tokenrelay.auth.keystore import KeyStore
from tokenrelay.config import Settings
from tokenrelay.errors import AuthenticationError, Overloaded
from tokenrelay.principal import ADMIN_KEY, ANONYMOUS, STATIC_KEY, Principal
from tokenrelay.store.timeutil import utcnow

log = logging.getLogger(__name__)

T = TypeVar("T")

_CACHED_KEYS = 10_000


async def guarded(lookup: Callable[[], Awaitable[T]]) -> T:
    """A key-store lookup; an unreachable database is a 503 the client may retry, not a bare 500."""
    try:
        return await lookup()
    except (SQLAlchemyError, OSError):
        log.exception("the key store is unreachable")
        message = "API keys cannot be verified right now; retry shortly."
        raise Overloaded(message, headers={"Retry-After": "2"}) from None


class KeyVerifier:
    """Verified keys are cached for `accounting.key_cache_seconds`, which bounds how long a revocation
    takes to reach every replica; a cache miss costs one indexed lookup. Concurrent misses on one key share
    a single lookup (200 requests arriving with a new key cause one query, not 200)."""

    def __init__(self, store: KeyStore, settings: Settings) -> None:
        self.store = store
        cached = alru_cache(maxsize=_CACHED_KEYS, ttl=settings.accounting.key_cache_seconds)
        self._principal = cached(self._lookup_principal)
        self._any_keys = cached(self._lookup_any_keys)
        self._static = self._static_hashes(settings)

    async def _lookup_principal(self, digest: str) -> Principal | None:
        return await guarded(lambda: self.store.principal(digest))

    async def _lookup_any_keys(self) -> bool:
        return await guarded(self.store.any_keys)

    @staticmethod
    def _static_hashes(settings: Settings) -> list[tuple[str, Principal]]:
        pairs = [(settings.api_key, STATIC_KEY), (settings.admin_key, ADMIN_KEY)]
        return [(hash_secret(s.get_secret_value()), p) for s, p in pairs if s is not None]

    async def auth_required(self) -> bool:
        """Keys are needed once a static key is configured or any key was ever created."""
        if any(p is STATIC_KEY for _, p in self._static):
            return True
        return await self._any_keys()

    async def verify(self, token: str) -> Principal | None:
        """The principal for a token, or None when it is unknown, revoked or expired."""
        digest = hash_secret(token)
        for static, principal in self._static:
            if same_hash(digest, static):
                return principal
        if not looks_like_key(token):
            return None
        found = await self._principal(digest)
        if found is None or found.expired(utcnow()):
            return None
        return found

    async def authenticate(self, token: str | None) -> Principal:
        """The caller of a `/v1` request that sent `token` as its bearer token (None: no usable one);
        anonymous while the server runs open."""
        if token is None:
            if not await self.auth_required():
                return ANONYMOUS
            raise AuthenticationError(
                "You didn't provide an API key. Send it as a bearer token: `Authorization: Bearer <key>`."
            )
        principal = await self.verify(token)
        if principal is not None:
            return principal
        if not await self.auth_required():
            return ANONYMOUS  # open server: a stray token (the SDKs always send one) is not an error
        raise AuthenticationError("Incorrect API key provided. It may be wrong, revoked or expired.")
