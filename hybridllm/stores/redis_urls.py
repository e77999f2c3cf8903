"""Redis URLs as the Redis-backed stores read them (`guard.budget_redis.RedisLedger`,
`routing.log_redis.RedisDecisionLog`): the password hidden for messages, the `?prefix=` query
parameter that redis-py does not know split off, and a checked connection.

redis-py is imported only in `connect`, so importing this module (and every module above it)
never loads it (`hybridllm[redis]` is optional).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from hybridllm.errors import InvalidArgumentError, MissingExtraError

if TYPE_CHECKING:
    import redis

__all__ = ["REDIS_SCHEMES", "connect", "redact_url", "split_prefix"]

REDIS_SCHEMES = ("redis://", "rediss://")


def redact_url(url: str) -> str:
    """`url` without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def split_prefix(url: str, *, argument: str, default: str) -> tuple[str, str]:
    """The URL redis-py reads, and the `prefix` query parameter it would not know (`default`
    when absent). An empty prefix, or one holding `{` or `}` (the prefix becomes a Redis
    Cluster hash tag), is an `InvalidArgumentError` naming `argument`."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = [v for k, v in query if k == "prefix"]
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    if prefix and (not prefix[-1] or any(c in prefix[-1] for c in "{}")):
        raise InvalidArgumentError(
            argument, redact_url(url), "a URL whose prefix= is non-empty and has no { or }"
        )
    return urlunsplit(parts._replace(query=rest)), (prefix[-1] if prefix else default)


def connect(
    url: str, *, argument: str, feature: str
) -> tuple[redis.Redis, tuple[type[Exception], ...]]:
    """A client on a pool of connections to `url` (checked with a PING now), and the errors
    that mean the server cannot be reached (a lost connection, a timeout). Socket timeouts
    default to 2 s to connect and 5 s an answer (the URL's `socket_timeout=` and
    `socket_connect_timeout=` override them), so a hung server never hangs a request. A bad or
    unreachable URL is an `InvalidArgumentError` naming `argument`; without redis-py, a
    `MissingExtraError` naming `feature`."""
    try:
        import redis
    except ImportError:
        raise MissingExtraError(feature, "redis", "redis") from None
    try:
        client = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=5.0, socket_connect_timeout=2.0
        )
        client.ping()
    except (ValueError, redis.RedisError) as exc:
        shown = redact_url(url)
        reason = f"a reachable Redis URL, redis://host:port/db ({type(exc).__name__}: {exc})"
        raise InvalidArgumentError(argument, shown, reason) from None
    return client, (redis.ConnectionError, redis.TimeoutError)
