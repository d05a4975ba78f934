"""Keys, limits and the usage ledger of one server, opened in the app's lifespan and closed after it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from tokenrelay.auth.keystore import KeyStore
from tokenrelay.auth.loopback import is_loopback
from tokenrelay.auth.verifier import KeyVerifier
from tokenrelay.backends.base import Backend
from tokenrelay.backends.llamacpp.engine import LlamaCppBackend
from tokenrelay.backends.resident import ResidentModel
from tokenrelay.calls.record import Call
from tokenrelay.config import Settings
from tokenrelay.errors import QuotaExceeded, RateLimited
from tokenrelay.limits.cost import Admitted, Charge, TokenBound, completion_bound, prompt_bound
from tokenrelay.limits.limiter import Limiter, Reservation
from tokenrelay.limits.local_rates import LocalRates
from tokenrelay.limits.rates import FailoverRates
from tokenrelay.limits.shared_rates import SharedRates
from tokenrelay.pricing.book import PriceBook
from tokenrelay.pricing.cost import cost_micros, worst_cost_micros
from tokenrelay.principal import Principal
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.store.database import create_engine, database_url, redacted
from tokenrelay.store.migrate import upgrade
from tokenrelay.usage.ledger import Ledger
from tokenrelay.usage.spill import SpillFiles

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

SWEEP_SECONDS = 60.0


class ExposedWithoutKeys(RuntimeError):
    """`serve` on a non-loopback address with no key at all, and no `--insecure-no-auth`."""


class Accounting:
    def __init__(self, settings: Settings, prices: PriceBook, tracer: Tracer | None = None) -> None:
        self.settings = settings
        self.prices = prices
        self.url = database_url(settings)
        self.engine = create_engine(self.url)
        self.keys = KeyStore(self.engine)
        self.verifier = KeyVerifier(self.keys, settings)
        self.limiter = Limiter(self.engine, rates=_rates(settings.redis_url))
        self.ledger = Ledger(self.engine, settings.accounting, self._spill_files(), tracer)
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._sweeper: asyncio.Task[None] | None = None

    def _spill_files(self) -> SpillFiles:
        tag = hashlib.sha256(redacted(self.url).encode()).hexdigest()[:12]
        return SpillFiles(Path(self.settings.data_dir), tag)

    async def start(self) -> None:
        log.info("usage ledger and keys in %s", redacted(self.url))
        if self.settings.redis_url is not None:
            log.info("requests and tokens per minute counted in Redis at %s", _redis_where(self.settings.redis_url))
        await upgrade(self.engine)
        await self.ledger.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="reservation-sweeper")

    async def check_exposure(self) -> None:
        """Refuse to serve an open API beyond loopback unless told to; warn when serving it open at all."""
        if await self.verifier.auth_required():
            return
        host = self.settings.host
        if not is_loopback(host) and not self.settings.insecure_no_auth:
            raise ExposedWithoutKeys(
                f"refusing to serve on {host} without authentication: no API key exists. Create one with "
                "`tokenrelay keys create --name NAME`, set TOKENRELAY_API_KEY, or pass --insecure-no-auth."
            )
        log.warning(
            "NO AUTHENTICATION: no API key exists, so anyone who can reach %s:%s may use this server. "
            "Create a key with `tokenrelay keys create --name NAME` to require one.",
            host,
            self.settings.port,
        )

    async def _sweep(self) -> None:
        ttl = self.settings.accounting.reservation_ttl_seconds
        while True:
            try:
                released = await self.limiter.release_stale(ttl)
            except Exception:
                log.exception("releasing stale budget reservations failed; trying again later")
            else:
                if released:
                    log.warning("released %d stale budget reservation(s) (a replica stopped mid-request?)", released)
            await asyncio.sleep(SWEEP_SECONDS)

    # Per call ------------------------------------------------------------------------------------
    def begin(self, call: Call, principal: Principal) -> None:
        call.principal, call.key_id, call.key_name = principal, principal.key_id, principal.name
        self.in_flight += 1
        self._idle.clear()

    async def admit(self, call: Call, body: Admitted, backend: Backend) -> Reservation | None:
        principal = call.principal
        if principal is None or not principal.limited:
            return None
        prompt = await prompt_tokens(body, backend)
        # A request without max_tokens may answer until its slot is full: on the engine, a slot of the size its
        # prompt picks (a short one for a short prompt), else the model's context.
        room = backend.card.room_for(prompt) or self.settings.accounting.default_context_tokens
        bound = TokenBound(prompt, completion_bound(body, room))
        # Whichever of the model's nodes or fallbacks serves, the call costs at most this.
        pricing = self.prices.worst(body.model)
        cost = Charge(bound.total, worst_cost_micros(pricing, bound.prompt, bound.completion))
        # This key's requests that just ended hold their worst case until their rows are written (a few ms).
        # Noted before asking, since the writer may commit them while the refusal is being explained.
        settling = principal.key_id is not None and self.ledger.settling(principal.key_id)
        try:
            return await self.limiter.admit(principal, cost, self.settings.currency)
        except (QuotaExceeded, RateLimited):
            if not settling:
                raise
        # Write them now and ask again, rather than refuse a client that sends its requests back to back.
        await self.ledger.flush()
        return await self.limiter.admit(principal, cost, self.settings.currency)

    def end(self, call: Call) -> None:
        if call.principal is None:
            return
        pricing = self.prices.prices(call.served_model or call.model, call.node)
        call.priced, call.cost = pricing is not None, cost_micros(pricing, call.usage)
        self.ledger.record(call)
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
        if call.reservation is not None:
            self.limiter.give_back_rates(call.reservation, call.usage.prompt_tokens + call.usage.completion_tokens)

    # Shutdown ------------------------------------------------------------------------------------
    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for calls still unwinding, so their rows are queued before the final flush."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        if self.in_flight:
            log.warning("shutting down with %d call(s) still in flight; their rows will be spilled", self.in_flight)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self.ledger.close()
        await self.limiter.close()
        await self.engine.dispose()


def _rates(redis_url: str | None) -> FailoverRates | None:
    """Rate buckets in Redis (each replica counting alone while it is down), or None: in the database."""
    if redis_url is None:
        return None
    return FailoverRates(SharedRates(redis_url), LocalRates(), _redis_where(redis_url))


def _redis_where(redis_url: str) -> str:
    """The URL without its password, for the logs."""
    return redacted(make_url(redis_url))


async def prompt_tokens(body: Admitted, backend: Backend) -> int:
    """A chat prompt for an engine model served alone is counted exactly (its template and tokenizer make what
    will run); everywhere else it is bounded: a node renders with its own template, and a model with fallbacks
    may be served by another model's tokenizer."""
    if isinstance(body, ChatCompletionRequest) and isinstance(backend, ResidentModel | LlamaCppBackend):
        return (await backend.count_chat_prompt(body)).tokens
    return prompt_bound(body)
