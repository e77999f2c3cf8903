"""`ledger_from_url`: the budget ledger a URL names (`hybridllm serve --ledger URL`).

One home for choosing a ledger by its URL, so that a new kind (Redis, for several gateways
sharing one budget) is one more branch here:

- a path, or ``sqlite:///PATH`` (``sqlite:////abs/path`` for an absolute one, as SQLAlchemy
  writes them): the SQLite ledger in that file, the embedded default;
- ``sqlite://`` or ``sqlite:///:memory:``: an in-memory ledger (this process only);
- ``redis://`` / ``rediss://``: the Redis ledger, which is not installed in this build (a
  `ConfigError` that says so).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from hybridllm import errors
from hybridllm.guard.budget import Ledger

__all__ = ["LEDGER_SCHEMES", "ledger_from_url"]

LEDGER_SCHEMES = ("sqlite", "redis", "rediss")
RULE = "a file path, sqlite:///PATH or redis://HOST[:PORT][/DB]"


def ledger_from_url(url: str | Path, *, argument: str = "ledger") -> Ledger:
    """The ledger `url` names (see the module); a bad one is an `InvalidArgumentError` naming
    `argument`."""
    if isinstance(url, Path):
        return Ledger(url)
    if not isinstance(url, str) or not url.strip():
        raise errors.InvalidArgumentError(argument, url, RULE)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if "://" not in url:  # a path
        return Ledger(url)
    if scheme == "sqlite":
        return _sqlite(parts.netloc, parts.path, url, argument)
    if scheme in ("redis", "rediss"):
        raise errors.ConfigError(
            f"{argument}: the Redis ledger ({scheme}://) is not installed in this build; use a "
            "file path or sqlite:///PATH (one machine)"
        )
    raise errors.InvalidArgumentError(argument, url, RULE)


def _sqlite(host: str, path: str, url: str, argument: str) -> Ledger:
    """``sqlite:///relative``, ``sqlite:////absolute``, ``sqlite://`` (memory)."""
    if host:
        raise errors.InvalidArgumentError(argument, url, "sqlite:///PATH (three slashes, no host)")
    file = path[1:] if path.startswith("/") else path
    if file in ("", ":memory:"):
        return Ledger()
    return Ledger(file)
