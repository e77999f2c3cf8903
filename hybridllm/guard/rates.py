"""Rate limits kept in a budget ledger: requests per minute per key, counted where every process
sharing the ledger sees them (the gateways on one Redis, the processes on one SQLite file).

    rates = rate_counter(ledger)
    wait = rates.hit("k:team-a", limit=60)   # None: counted; else seconds until it may retry

A counter is a fixed window of `window_s` seconds (a UTC minute by default) per key: at most
`limit` hits in one window, the hit past it refused (and not counted) with the seconds left in
the window. Each hit checks and counts in one atomic step (SQLite: one transaction; Redis: one
Lua script). Keys in use: "k:<tenant>" (a gateway key's `rpm`) and "u:<user tag>" (a policy's
`[limits] per_user_rpm`, the user hashed as the ledger keeps it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hybridllm.errors import ConfigError
from hybridllm.guard.budget import Ledger, SQLiteLedger
from hybridllm.guard.budget_redis import RedisLedger

__all__ = ["RateCounter", "rate_counter"]

WINDOW_S = 60


class RateCounter(Protocol):
    def hit(
        self, key: str, limit: int, window_s: int = WINDOW_S, *, count: bool = True
    ) -> float | None:
        """Count one hit of `key` if its window holds fewer than `limit`: None; else the
        seconds until the window ends (nothing counted). `count` False: only check."""
        ...

    def count(self, key: str, window_s: int = WINDOW_S) -> int:
        """Hits of `key` in the current window (nothing counted)."""
        ...


def rate_counter(ledger: Ledger) -> RateCounter:
    """The counter kept in `ledger` (an `SQLiteLedger` or a `RedisLedger`)."""
    if isinstance(ledger, SQLiteLedger):
        return _SQLiteRates(ledger)
    if isinstance(ledger, RedisLedger):
        return _RedisRates(ledger)
    raise ConfigError(f"rate limits need an SQLite or Redis ledger, not {type(ledger).__name__}")


def _window(now: float, window_s: int) -> tuple[int, float]:
    """The window holding `now` and the seconds left in it (at least a millisecond)."""
    index = math.floor(now / window_s)
    return index, max(0.001, (index + 1) * window_s - now)


class _SQLiteRates:
    def __init__(self, ledger: SQLiteLedger) -> None:
        self.ledger = ledger

    def hit(
        self, key: str, limit: int, window_s: int = WINDOW_S, *, count: bool = True
    ) -> float | None:
        index, left = _window(self.ledger.now(), window_s)
        with self.ledger.transaction() as db:
            db.execute("DELETE FROM rates WHERE key = ? AND window < ?", (key, index))
            row = db.execute(
                "SELECT count FROM rates WHERE key = ? AND window = ?", (key, index)
            ).fetchone()
            if row is not None and int(row[0]) >= limit:
                return left
            if not count:
                return None
            db.execute(
                "INSERT INTO rates (key, window, count) VALUES (?, ?, 1) "
                "ON CONFLICT (key, window) DO UPDATE SET count = count + 1",
                (key, index),
            )
        return None

    def count(self, key: str, window_s: int = WINDOW_S) -> int:
        index, _ = _window(self.ledger.now(), window_s)
        with self.ledger.transaction() as db:
            row = db.execute(
                "SELECT count FROM rates WHERE key = ? AND window = ?", (key, index)
            ).fetchone()
        return 0 if row is None else int(row[0])


# ARGV = the counter's key (with its window), the limit, the window's length in ms (the key
# expires after two), '1' to count ('0': only check). Answers 1 (counted) or 0 (refused).
_HIT = """
local k = KEYS[1] .. ':r:' .. ARGV[1]
if (tonumber(redis.call('GET', k)) or 0) >= tonumber(ARGV[2]) then return 0 end
if ARGV[4] ~= '1' then return 1 end
redis.call('INCR', k)
redis.call('PEXPIRE', k, 2 * tonumber(ARGV[3]))
return 1
"""
_COUNT = "return tonumber(redis.call('GET', KEYS[1] .. ':r:' .. ARGV[1])) or 0\n"


class _RedisRates:
    def __init__(self, ledger: RedisLedger) -> None:
        self.ledger = ledger
        self._hit: Callable[[Sequence[object]], Any] = ledger.script(_HIT)
        self._count: Callable[[Sequence[object]], Any] = ledger.script(_COUNT)

    def hit(
        self, key: str, limit: int, window_s: int = WINDOW_S, *, count: bool = True
    ) -> float | None:
        index, left = _window(self.ledger.now(), window_s)
        counted = self._hit((f"{key}:{index}", limit, window_s * 1000, int(count)))
        return None if int(counted) else left

    def count(self, key: str, window_s: int = WINDOW_S) -> int:
        index, _ = _window(self.ledger.now(), window_s)
        return int(self._count((f"{key}:{index}",)))
