"""Which decision log a URL names: `decision_log_from_url`, for `HybridClient(decision_log=...)`,
`hybridllm serve --decision-log URL`, `hybridllm stats --log URL` and `hybridllm router train
--from-log URL`.

    decision_log_from_url("~/.cache/hybridllm/decisions.db")   # a path: DecisionLog (SQLite)
    decision_log_from_url("sqlite:///var/lib/app/decisions.db") # the same, as a URL
    decision_log_from_url("redis://log.internal:6379/0")        # RedisDecisionLog (shared)
"""

from __future__ import annotations

from pathlib import Path

from hybridllm.errors import InvalidArgumentError
from hybridllm.routing.log import DecisionLog, DecisionLogLike
from hybridllm.stores.redis_urls import REDIS_SCHEMES, redact_url

__all__ = ["DECISION_LOG_URL_RULE", "as_decision_log", "decision_log_from_url", "sqlite_path"]

DECISION_LOG_URL_RULE = "a file path, sqlite:///path or redis://host:port/db[?prefix=NAME]"


def sqlite_path(url: str | Path, *, argument: str = "decision_log") -> Path | None:
    """The SQLite file `url` names (a path, `~` expanded, or `sqlite://` and the path), None
    for a Redis URL; anything else (another scheme, an empty string) an `InvalidArgumentError`
    naming `argument`."""
    if isinstance(url, Path):
        return url.expanduser()
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError(argument, url, DECISION_LOG_URL_RULE)
    if url.startswith(REDIS_SCHEMES):
        return None
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")
        if not path:
            raise InvalidArgumentError(argument, url, DECISION_LOG_URL_RULE)
        return Path(path).expanduser()
    if "://" in url:
        raise InvalidArgumentError(argument, redact_url(url), DECISION_LOG_URL_RULE)
    return Path(url).expanduser()


def decision_log_from_url(
    url: str | Path, *, argument: str = "decision_log", store_prompts: bool = False
) -> DecisionLogLike:
    """The decision log `url` names: a path or `sqlite://PATH` gives the SQLite `DecisionLog`
    (one machine); `redis://` or `rediss://` (TLS) `[:password@]host:port/db[?prefix=NAME]` a
    `RedisDecisionLog` (several processes or machines share it). Anything else is an
    `InvalidArgumentError` naming `argument` (the caller's name for it: "decision_log",
    "--decision-log", "--log"). `store_prompts`: keep prompt text (off by default)."""
    path = sqlite_path(url, argument=argument)
    if path is not None:
        return DecisionLog(path, store_prompts=store_prompts)
    from hybridllm.routing.log_redis import RedisDecisionLog

    try:
        return RedisDecisionLog(str(url), store_prompts=store_prompts)
    except InvalidArgumentError as exc:  # named as the caller names it
        raise InvalidArgumentError(argument, exc.value, exc.rule) from None


def as_decision_log(value: object, *, argument: str = "decision_log") -> DecisionLogLike | None:
    """`value` as a decision log: None or a `DecisionLogLike` as it is, a path or URL through
    `decision_log_from_url`, anything else an `InvalidArgumentError` naming `argument`."""
    if value is None or isinstance(value, DecisionLogLike):
        return value
    if isinstance(value, str | Path):
        return decision_log_from_url(value, argument=argument)
    raise InvalidArgumentError(argument, value, f"a DecisionLog, or {DECISION_LOG_URL_RULE}")
