"""The rate windows' rule (``limits/windows.py``) as a Redis Lua script: the other store
the benchmark measures. One call's windows are judged and written in one script, all or
none, by Redis's clock, as ``rate_admit`` does on PostgreSQL. It keeps the same three
numbers per window in a hash and expires a window two lengths after it was last written.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as redis

# KEYS: the windows; ARGV: limit, window_s, amount for each window in turn
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local states = {}
local fits = true
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[3 * i - 2])
  local window = tonumber(ARGV[3 * i - 1])
  local amount = tonumber(ARGV[3 * i])
  local h = redis.call('HMGET', key, 's', 'c', 'p')
  local start, current, previous = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
  local index = math.floor(now / window)
  local steps = index - math.floor(start / window + 0.5)
  if steps > 0 then
    if steps == 1 then previous = current else previous = 0 end
    current = 0
    start = index * window
  end
  local elapsed = now / window - math.floor(start / window + 0.5)
  local weight = 1 - math.min(math.max(elapsed, 0), 1)
  local room = limit - current - amount
  if room < 0 or previous * weight > room then fits = false end
  states[i] = {start, current + amount, previous, window}
end
if fits then
  for i, key in ipairs(KEYS) do
    local s = states[i]
    redis.call('HSET', key, 's', s[1], 'c', s[2], 'p', s[3])
    redis.call('PEXPIRE', key, math.ceil(s[4] * 2000))
  end
end
return fits and 1 or 0
"""


class RedisWindows:
    """One call's windows admitted in one round trip (``EVALSHA``)."""

    def __init__(self, client: redis.Redis) -> None:
        self._script = client.register_script(ADMIT_LUA)

    async def admit(self, asks: Sequence[tuple[str, int, float, int]]) -> bool:
        keys = [key for key, _, _, _ in asks]
        args: list[float | int] = []
        for _, limit, window_s, amount in asks:
            args += [limit, window_s, amount]
        return bool(await self._script(keys=keys, args=args))
