"""Which ledger a URL names: `ledger_from_url`, for `HybridClient(ledger=...)` and
`hybridllm serve --ledger URL`.

    ledger_from_url("~/.cache/hybridllm/ledger.db")     # a path: SQLiteLedger (one machine)
    ledger_from_url("sqlite:///var/lib/app/spend.db")   # the same, as a URL
    ledger_from_url("redis://ledger.internal:6379/0")   # RedisLedger (several gateways)
"""

from __future__ import annotations

from pathlib import Path

from hybridllm.errors import InvalidArgumentError
from hybridllm.guard.budget import Ledger, SQLiteLedger
from hybridllm.guard.budget_redis import RedisLedger, redact_url

__all__ = ["LEDGER_URL_RULE", "as_ledger", "ledger_from_url"]

LEDGER_URL_RULE = "a file path, sqlite:///path (or sqlite://:memory:) or redis://host:port/db"
_REDIS_SCHEMES = ("redis://", "rediss://")


def ledger_from_url(url: str | Path, *, argument: str = "ledger") -> Ledger:
    """The ledger `url` names: a path (str or `Path`) or `sqlite://` followed by the path (so
    `sqlite:///abs/path.db`, `sqlite://relative.db`, `sqlite://:memory:`) gives an
    `SQLiteLedger`; `redis://` or `rediss://` (TLS) `[:password@]host:port/db[?prefix=NAME]` a
    `RedisLedger`. Anything else, another scheme or an empty string, is an
    `InvalidArgumentError` naming `argument` (the caller's name for it: "ledger",
    "--ledger")."""
    if isinstance(url, Path):
        return SQLiteLedger(url)
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError(argument, url, LEDGER_URL_RULE)
    if url.startswith(_REDIS_SCHEMES):
        try:
            return RedisLedger(url)
        except InvalidArgumentError as exc:  # named as the caller names it
            raise InvalidArgumentError(argument, exc.value, exc.rule) from None
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")
        if not path:
            raise InvalidArgumentError(argument, url, LEDGER_URL_RULE)
        return SQLiteLedger(path)
    if "://" in url:
        raise InvalidArgumentError(argument, redact_url(url), LEDGER_URL_RULE)
    return SQLiteLedger(url)


def as_ledger(value: object, *, argument: str = "ledger") -> Ledger:
    """`value` as a ledger: a `Ledger` as it is, a path or URL through `ledger_from_url`,
    anything else an `InvalidArgumentError` naming `argument`."""
    if isinstance(value, str | Path):
        return ledger_from_url(value, argument=argument)
    if isinstance(value, Ledger):
        return value
    raise InvalidArgumentError(argument, value, f"a Ledger, or {LEDGER_URL_RULE}")
