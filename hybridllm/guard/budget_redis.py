"""`RedisLedger`: the budget ledger on a Redis server, for several gateways (processes,
containers, machines) that must share one budget.

    ledger = RedisLedger("redis://ledger.internal:6379/0")          # or ledger_from_url(...)
    ledger = RedisLedger("redis://:secret@host:6379/2?prefix=team-a")  # a second budget

It keeps the books of `hybridllm.guard.budget` with the same rules and errors as `SQLiteLedger`
(caps per request, UTC day and month, per scope or global; integer nano-dollars; an overrun
closes its caps for their period; a reservation left open past its time to live is counted at
its worst case). Every step that reads and then writes (reserve with its cap check, settle,
release, the expiry of stale reservations) is one Lua script, which Redis runs atomically: no
other gateway's step runs in between, so gateways sharing the server never overspend a cap
together, and none of them coordinates anything itself.

Keys, all under one hash tag (`{<prefix>}`, default `{hybridllm:ledger}`, so a Redis Cluster
keeps them in one slot): `:seq` (the last entry id), `:e:<id>` (an entry: a hash of
`SQLiteLedger`'s columns), `:open` (open reservations by expiry time) and `:t:<day or
month>:<"*", "p:<scope>", "e:<engine>", "u:<user tag>" or "k:<tenant>">` (running totals:
spent, held, overrun); the gateway's keys and the rate limits' counts beside them
(`hybridllm.guard.keys`, `hybridllm.guard.rates`). Times come
from the caller's clock (`clock`, default `time.time`), as in `SQLiteLedger`: gateways sharing a
ledger should keep their clocks in sync (NTP), since the UTC day and the expiry are read from
them.

redis-py is imported only when a `RedisLedger` is made (`hybridllm.stores.redis_urls.connect`;
`hybridllm[redis]`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from hybridllm.errors import BudgetExceededError, LedgerUnavailableError
from hybridllm.guard.budget import (
    Cap,
    ModelPrice,
    Reservation,
    Spend,
    TokenUsage,
    exceeded,
    ordered_caps,
    remaining_under,
    totals_key,
    usd_nano,
    user_tag,
    utc_day_month,
)
from hybridllm.guard.prices import NANO
from hybridllm.stores.redis_urls import connect, redact_url, split_prefix

__all__ = ["RedisLedger", "redact_url"]

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "hybridllm:ledger"

# Shared by every script: KEYS[1] is the key prefix (`{<prefix>}`); `bump` moves the running
# totals of an entry's day and month, global and of its scope; `expire_stale` closes every open
# reservation whose time to live has passed at its worst case; `sums` reads one total.
_PRELUDE = """
local P = KEYS[1]
local function int(x) return string.format('%d', x) end
local function bump(scope, engine, user, tenant, day, month, spent, held, over)
  local whos = {'*', 'p:' .. scope}
  if engine and engine ~= '' then whos[#whos + 1] = 'e:' .. engine end
  if user and user ~= '' then whos[#whos + 1] = 'u:' .. user end
  if tenant and tenant ~= '' then whos[#whos + 1] = 'k:' .. tenant end
  for _, period in ipairs({day, month}) do
    for _, who in ipairs(whos) do
      local k = P .. ':t:' .. period .. ':' .. who
      redis.call('HINCRBY', k, 'spent', int(spent))
      redis.call('HINCRBY', k, 'held', int(held))
      redis.call('HINCRBY', k, 'overrun', int(over))
    end
  end
end
local function expire_stale(now)
  local ids = redis.call('ZRANGEBYSCORE', P .. ':open', '-inf', now)
  for _, id in ipairs(ids) do
    local k = P .. ':e:' .. id
    local e = redis.call('HMGET', k, 'scope', 'day', 'month', 'reserved_nano', 'engine', 'user',
      'tenant')
    local amount = tonumber(e[4])
    redis.call('HSET', k, 'state', 'expired', 'cost_nano', e[4], 'closed_at', now)
    bump(e[1], e[5], e[6], e[7], e[2], e[3], amount, -amount, 0)
    redis.call('ZREM', P .. ':open', id)
  end
  return #ids
end
local function sums(period, who)
  local v = redis.call('HMGET', P .. ':t:' .. period .. ':' .. who, 'spent', 'held', 'overrun')
  return tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0
end
"""

# reserve (ARGV[2] == '1') or only check: ARGV = now, record, amount, scope, model,
# prompt_tokens, expires_at, day, month, the number of caps, engine ('' for none), the user's tag
# ('' for none), the tenant ('' for none), then per cap (in the order of `ordered_caps`): its day
# or month, its totals' key (`Cap.key_for`), '1' for a per-request cap, its limit (nano). Answers
# {0, id} (recorded; id 0 when only checking) or {i, spent, held, overrun}: the i-th cap refuses.
_RESERVE = (
    _PRELUDE
    + """
local now, amount = ARGV[1], tonumber(ARGV[3])
expire_stale(now)
for i = 1, tonumber(ARGV[10]) do
  local at = 10 + 4 * i
  local spent, held, over = sums(ARGV[at], ARGV[at + 1])
  if ARGV[at + 2] == '1' then spent, held = 0, 0 end
  if over > 0 or spent + held + amount > tonumber(ARGV[at + 3]) then
    return {i, spent, held, over}
  end
end
if ARGV[2] ~= '1' then return {0, 0} end
local id = redis.call('INCR', P .. ':seq')
redis.call('HSET', P .. ':e:' .. id, 'id', id, 'scope', ARGV[4], 'model', ARGV[5],
  'state', 'reserved', 'reserved_nano', ARGV[3], 'cost_nano', 0, 'prompt_tokens', ARGV[6],
  'estimated', 0, 'created_at', now, 'expires_at', ARGV[7], 'day', ARGV[8], 'month', ARGV[9],
  'overrun_nano', 0, 'engine', ARGV[11], 'user', ARGV[12], 'tenant', ARGV[13])
redis.call('ZADD', P .. ':open', ARGV[7], id)
bump(ARGV[4], ARGV[11], ARGV[12], ARGV[13], ARGV[8], ARGV[9], 0, amount, 0)
return {0, id}
"""
)

# settle or release: ARGV = id, cost (nano; 0 to release), 'settled' or 'released', now,
# prompt_tokens, completion_tokens, estimated. Answers {1, cost} when it closed the entry, else
# {0, the cost recorded} (already closed) or {0, 0} (unknown).
_CLOSE = (
    _PRELUDE
    + """
local k = P .. ':e:' .. ARGV[1]
local e = redis.call('HMGET', k, 'state', 'scope', 'day', 'month', 'reserved_nano', 'cost_nano',
  'engine', 'user', 'tenant')
if not e[1] then return {0, 0} end
if e[1] ~= 'reserved' and e[1] ~= 'expired' then return {0, tonumber(e[6])} end
local cost, amount = tonumber(ARGV[2]), tonumber(e[5])
local over = math.max(0, cost - amount)
if e[1] == 'reserved' then
  bump(e[2], e[7], e[8], e[9], e[3], e[4], cost, -amount, over)
  redis.call('ZREM', P .. ':open', ARGV[1])
else  -- expired: it was counted as spent at its worst case
  bump(e[2], e[7], e[8], e[9], e[3], e[4], cost - amount, 0, over)
end
redis.call('HSET', k, 'state', ARGV[3], 'cost_nano', ARGV[2], 'overrun_nano', int(over),
  'closed_at', ARGV[4])
if ARGV[3] == 'settled' then
  redis.call('HSET', k, 'prompt_tokens', ARGV[5], 'completion_tokens', ARGV[6],
    'estimated', ARGV[7])
end
return {1, cost}
"""
)

# the totals of one day or month and scope, after expiring: ARGV = now, period, who
_SPEND = _PRELUDE + "expire_stale(ARGV[1])\nreturn {sums(ARGV[2], ARGV[3])}\n"
_EXPIRE = _PRELUDE + "return expire_stale(ARGV[1])\n"

# an entry's fields as `SQLiteLedger.entries()` gives them: its columns, in its order, typed
_COLUMNS: tuple[tuple[str, Callable[[str], object] | None], ...] = (
    ("id", int),
    ("scope", None),
    ("model", None),
    ("state", None),
    ("reserved_nano", int),
    ("cost_nano", int),
    ("prompt_tokens", int),
    ("completion_tokens", int),
    ("estimated", int),
    ("created_at", float),
    ("expires_at", float),
    ("closed_at", float),
    ("day", None),
    ("month", None),
    ("overrun_nano", int),
    ("engine", None),
    ("user", None),
    ("tenant", None),
)


class RedisLedger:
    """Reservations and spend on a Redis server, shared by every process that opens the same
    URL and prefix (`?prefix=NAME` in the URL, default "hybridllm:ledger"). `ttl_s`: how long a
    reservation may stay open before it expires; `clock`: the time (seconds since the epoch).

    A server that cannot be reached once the ledger is made fails closed: `reserve` raises and
    `check` returns `LedgerUnavailableError` (a `BudgetExceededError`: the request goes local),
    `remaining` is 0 under any day or month cap; `settle` and `release` log a warning and
    return (the answer was delivered; the reservation, still open on the server, expires at its
    worst case: the books may overstate, never understate); `spend`, `expire` and `entries`
    raise it."""

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        server_url, prefix = split_prefix(url, argument="ledger", default=DEFAULT_PREFIX)
        self.url = redact_url(url)
        self.prefix = prefix
        self.ttl_s = ttl_s
        self._clock = clock
        self._key = "{" + prefix + "}"
        self._redis, self._unreachable = connect(
            server_url, argument="ledger", feature="a Redis ledger"
        )
        self._reserve = self._redis.register_script(_RESERVE)
        self._close = self._redis.register_script(_CLOSE)
        self._spend = self._redis.register_script(_SPEND)
        self._expire = self._redis.register_script(_EXPIRE)

    def __repr__(self) -> str:
        return f"RedisLedger({self.url!r}, prefix={self.prefix!r})"

    def close(self) -> None:
        self._redis.close()

    def script(self, source: str) -> Callable[[Sequence[object]], Any]:
        """A Lua script run under this ledger's prefix (KEYS[1], the hash tag), a server that
        cannot be reached raising `LedgerUnavailableError` (what the gateway's keys and the
        rate limits, `hybridllm.guard.keys` and `rates`, keep beside the books use)."""
        registered = self._redis.register_script(source)
        return lambda args: self._call(registered, args)

    def now(self) -> float:
        """The ledger's clock (seconds since the epoch)."""
        return self._clock()

    def __enter__(self) -> RedisLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reserve / check / settle / release -------------------------------------------------

    def reserve(
        self,
        *,
        model: str,
        price: ModelPrice,
        prompt_tokens: int,
        max_tokens: int,
        scope: str = "default",
        caps: Iterable[Cap] = (),
        ttl_s: float | None = None,
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> Reservation:
        """Hold the worst-case cost against every cap that applies to `scope`, `engine` and
        `user` (kept hashed), or raise `BudgetExceededError` naming the first cap it does not
        fit (nothing is held then)."""
        amount = price.cost_nano(prompt_tokens, max_tokens)
        now = self._clock()
        day, month = utc_day_month(now)
        expires = now + (self.ttl_s if ttl_s is None else ttl_s)
        entry = (scope, model, prompt_tokens, repr(expires), day, month)
        tag = user_tag(user, tenant)
        ordered = ordered_caps(caps, scope, engine, tag, tenant)
        rid, refusal = self._cap_script(ordered, amount, now, entry, (engine, tag, tenant))
        if refusal is not None:
            log.info("%s", refusal)  # the cap and the amounts, never the request
            raise refusal
        held = (prompt_tokens, max_tokens, amount / NANO, day, month, expires)
        return Reservation(rid, scope, model, price, *held, engine=engine, user=tag, tenant=tenant)

    def check(
        self,
        *,
        price: ModelPrice,
        prompt_tokens: int,
        max_tokens: int,
        scope: str = "default",
        caps: Iterable[Cap] = (),
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> BudgetExceededError | None:
        """What `reserve()` would refuse now, holding nothing (None: it fits every cap)."""
        amount = price.cost_nano(prompt_tokens, max_tokens)
        tag = user_tag(user, tenant)
        ordered = ordered_caps(caps, scope, engine, tag, tenant)
        who = (engine, tag, tenant)
        try:
            return self._cap_script(ordered, amount, self._clock(), None, who)[1]
        except LedgerUnavailableError as exc:
            return exc

    def _cap_script(
        self,
        ordered: list[Cap],
        amount: int,
        now: float,
        entry: tuple[str, str, int, str, str, str] | None,
        who: tuple[str | None, str | None, str | None],
    ) -> tuple[int, BudgetExceededError | None]:
        """Run the reserve script over the caps that apply (`ordered_caps`; `entry`: what to
        record, None: only check; `who`: the engine, the user's tag and the tenant): the new
        entry's id, or the refusal of the first cap it does not fit."""
        day, month = utc_day_month(now)
        engine, user, tenant = who
        args: list[object] = [repr(now), int(entry is not None), amount]
        args += entry if entry is not None else ("", "", 0, "0", day, month)
        args += (len(ordered), engine or "", user or "", tenant or "")
        for cap in ordered:
            period = month if cap.period == "month" else day
            key = cap.key_for(user)
            args += (period, key, int(cap.period == "request"), usd_nano(cap.limit_usd))
        answer = self._call(self._reserve, args, needed_usd=amount / NANO)
        if answer[0] == 0:
            return int(answer[1]), None
        cap = ordered[int(answer[0]) - 1]
        spent, held, over = (int(x) for x in answer[1:4])
        return 0, exceeded(cap, spent, held, amount, overrun=over)

    def settle(self, reservation: Reservation, usage: TokenUsage) -> float:
        """Record the real cost (USD) from the usage, as `SQLiteLedger.settle` does (an expired
        reservation's worst case is replaced; a cost above the reservation is an overrun; a
        second settle changes nothing and returns the recorded cost)."""
        cost = reservation.price.cost_nano(usage.prompt_tokens, usage.completion_tokens)
        usage_args = (usage.prompt_tokens, usage.completion_tokens, int(usage.estimated))
        args = (reservation.id, cost, "settled", repr(self._clock()), *usage_args)
        try:
            closed, recorded = self._call(self._close, args)
        except LedgerUnavailableError as exc:
            log.warning(
                "%s: reservation %d not settled (it expires at its worst case)", exc, reservation.id
            )
            return cost / NANO
        return (cost if closed else int(recorded)) / NANO

    def release(self, reservation: Reservation) -> None:
        """The request was never sent: drop the hold, record no spend."""
        args = (reservation.id, 0, "released", repr(self._clock()), 0, 0, 0)
        try:
            self._call(self._close, args)
        except LedgerUnavailableError as exc:
            log.warning(
                "%s: reservation %d not released (it expires at its worst case)",
                exc,
                reservation.id,
            )

    # ---- queries ----------------------------------------------------------------------------

    def spend(
        self,
        period: Literal["day", "month"],
        scope: str | None = None,
        at: float | None = None,
        *,
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> Spend:
        """Spend and open reservations of the UTC day or month holding `at` (default now): of
        every request, of policy `scope`, of the cloud `engine`, of the end user `user` (within
        `tenant`), or of the tenant `tenant` alone."""
        now = self._clock()
        day, month = utc_day_month(now if at is None else at)
        who = totals_key(scope, engine, user_tag(user, tenant), tenant)
        key = day if period == "day" else month
        spent, held, over = (int(x) for x in self._call(self._spend, (repr(now), key, who)))
        return Spend(spent / NANO, held / NANO, over / NANO)

    def remaining(
        self,
        caps: Sequence[Cap],
        scope: str = "default",
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> float | None:
        """USD left under the tightest day/month cap that applies (None: no such cap; 0 for a cap
        an overrun closed), as `SQLiteLedger.remaining`; 0 under such a cap while the server
        cannot be reached."""
        try:
            return remaining_under(self, caps, scope, engine, user, tenant)
        except LedgerUnavailableError:
            tag = user_tag(user, tenant)
            stock = any(
                c.period != "request" and c.applies(scope, engine, tag, tenant) for c in caps
            )
            return 0.0 if stock else None

    def expire(self) -> int:
        """Expire reservations past their time to live now; how many."""
        return int(self._call(self._expire, (repr(self._clock()),)))

    def entries(self) -> list[dict[str, object]]:
        """Every entry, oldest first, with `SQLiteLedger.entries()`'s keys and types."""

        def read() -> list[dict[str, str]]:
            last = int(self._redis.get(f"{self._key}:seq") or 0)
            pipe = self._redis.pipeline(transaction=False)
            for rid in range(1, last + 1):
                pipe.hgetall(f"{self._key}:e:{rid}")
            rows: list[dict[str, str]] = pipe.execute()
            return rows

        return [_entry(row) for row in self._call(read) if row]

    def _call(self, script: Any, args: Sequence[object] = (), needed_usd: float = 0.0) -> Any:
        """Run one of the scripts under this ledger's prefix (or `script()`, a read); a server
        that cannot be reached raises `LedgerUnavailableError`."""
        try:
            return script(keys=[self._key], args=list(args)) if args else script()
        except self._unreachable as exc:
            cause = f"{type(exc).__name__}: {exc}"
            raise LedgerUnavailableError(self.url, cause, needed_usd=needed_usd) from exc


def _entry(row: dict[str, str]) -> dict[str, object]:
    """One entry hash as a typed row (a field never written, such as `closed_at` of an open
    reservation, is None)."""
    out: dict[str, object] = {}
    for name, kind in _COLUMNS:
        value = row.get(name)
        out[name] = value if value is None or kind is None else kind(value)
    return out
