"""Rate buckets in Redis, shared by every replica (`limits/rates.py` says why Redis for these).

One hash per API key holds both buckets; one Lua script drains, checks and fills them, so concurrent takes on
any number of replicas serialise in Redis as the database's conditional UPDATE does. The arithmetic is
`limits/buckets.py`'s, on Redis's clock (so replicas whose clocks differ still drain one bucket alike). A full
bucket is empty after a minute, so the hash expires after a minute without a take: an idle key costs nothing.
"""

from __future__ import annotations

import time

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tokenrelay.limits.rates import Levels, RateAsk

PREFIX = "tokenrelay:rates:"
# Short, and no retries: a Redis that does not answer at once sends the replica to local counting
# (`FailoverRates`), rather than holding every request of a limited key for seconds.
TIMEOUT_SECONDS = 0.5
IDLE_SECONDS = 61  # a full bucket drains in 60 s

# KEYS[1]: the key's hash. ARGV: rpm, tpm (0: no such limit), tokens, idle seconds.
# Returns {1 if taken else 0, rpm level, tpm level} (levels as drained now, before this take).
TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'rpm', 'rpm_at', 'tpm', 'tpm_at')
local function drained(level, at, per_minute)
  if per_minute == 0 or not level or not at then return 0 end
  return math.max(0, tonumber(level) - (now - tonumber(at)) * per_minute / 60)
end
local rpm_level = drained(state[1], state[2], rpm)
local tpm_level = drained(state[3], state[4], tpm)
local fits = (rpm == 0 or rpm_level + 1 <= rpm) and (tpm == 0 or tpm_level + tokens <= tpm)
local reply = {fits and 1 or 0, string.format('%.6f', rpm_level), string.format('%.6f', tpm_level)}
if fits then
  if rpm > 0 then rpm_level = rpm_level + 1 end
  if tpm > 0 then tpm_level = tpm_level + tokens end
  local at = string.format('%.6f', now)
  redis.call('HSET', KEYS[1], 'rpm', string.format('%.6f', rpm_level), 'rpm_at', at,
    'tpm', string.format('%.6f', tpm_level), 'tpm_at', at)
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
return reply
"""

# KEYS[1]: the key's hash. ARGV: requests, tokens to take out of the rpm and tpm buckets (never below 0).
GIVE = """
local fields = {'rpm', 'tpm'}
for i = 1, 2 do
  local amount = tonumber(ARGV[i])
  local level = redis.call('HGET', KEYS[1], fields[i])
  if level and amount ~= 0 then
    redis.call('HSET', KEYS[1], fields[i], string.format('%.6f', math.max(0, tonumber(level) - amount)))
  end
end
return 0
"""


class SharedRates:
    def __init__(self, url: str, prefix: str = PREFIX, timeout: float = TIMEOUT_SECONDS) -> None:
        self.prefix = prefix
        self.client = Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
        )
        self._take = self.client.register_script(TAKE)
        self._give = self.client.register_script(GIVE)

    async def take(self, ask: RateAsk) -> Levels | None:
        args = [ask.rpm or 0, ask.tpm or 0, ask.tokens, IDLE_SECONDS]
        taken, rpm, tpm = await self._take(keys=[self.prefix + ask.key_id], args=args)
        return None if taken else Levels(float(rpm), float(tpm), time.time())

    async def give_back(self, key_id: str, requests: int, tokens: int) -> None:
        await self._give(keys=[self.prefix + key_id], args=[requests, tokens])

    async def close(self) -> None:
        await self.client.aclose()
