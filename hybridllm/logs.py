"""The library's logging, and the one switch that lets prompt and answer text into it.

Each module logs under its own name (`logging.getLogger(__name__)`, so "hybridllm.client",
"hybridllm.runtime.health", "hybridllm.guard.guarded", ...); hybridllm adds no handler but a
`NullHandler` and sets no level: the app configures logging, e.g.
`logging.getLogger("hybridllm").setLevel(logging.DEBUG)`.

- DEBUG: each routing decision (the typed decision and facts: plan, engines, token counts,
  router score, the kinds of personal data found) and each finished request;
- INFO: another engine started (fallback, hedge, parallel start, mid-stream failover,
  handoff), a request refused (privacy, budget, no engine allowed; at routing or at the guard),
  a circuit closed again;
- WARNING: a circuit opened, a cloud engine made unavailable (no key, or the key refused).

Prompt and answer text, and API keys, never reach a log record: `content(text)` stands in for
them, and shows only their length, unless the app opts in with `log_content(True)` or the
environment variable `HYBRIDLLM_LOG_CONTENT=1` (read at each record; default off). Even then,
keys are never logged.
"""

from __future__ import annotations

import logging
import os

logging.getLogger("hybridllm").addHandler(logging.NullHandler())

_opted_in: bool | None = None  # None: follow HYBRIDLLM_LOG_CONTENT


def log_content(enabled: bool | None) -> None:
    """Let prompt and answer text into hybridllm's DEBUG records (`True`), keep it out (`False`,
    the default), or follow `HYBRIDLLM_LOG_CONTENT` again (`None`)."""
    global _opted_in
    _opted_in = enabled


def content_logged() -> bool:
    """Does prompt and answer text go into log records now?"""
    if _opted_in is not None:
        return _opted_in
    return os.environ.get("HYBRIDLLM_LOG_CONTENT", "").strip().lower() in ("1", "true", "yes")


class Withheld:
    """What a log record holds in place of text the app did not opt in to log: its length."""

    __slots__ = ("chars",)

    def __init__(self, chars: int) -> None:
        self.chars = chars

    def __repr__(self) -> str:
        return f"<{self.chars} characters withheld: hybridllm.log_content(True) logs them>"

    __str__ = __repr__


def content(text: object) -> object:
    """`text` for a log record's arguments: itself when the app opted in, else `Withheld`."""
    if content_logged():
        return text
    return Withheld(len(text) if isinstance(text, str) else len(repr(text)))
