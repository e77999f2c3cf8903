"""`RedisDecisionLog`: the decision log on a Redis server, for several gateways (processes,
containers, machines) that must share one log.

    log = RedisDecisionLog("redis://log.internal:6379/0")            # or decision_log_from_url
    log = RedisDecisionLog("redis://:secret@host:6379/2?prefix=team-a", store_prompts=True)

It keeps the rows of `hybridllm.routing.log.DecisionLog` (the same fields, JSON where the
SQLite columns hold JSON, the same opt-in for prompt text and the same errors) and answers the
same calls (`DecisionLogLike`). Keys, all under one hash tag (`{<prefix>}`, default
`{hybridllm:decisions}`, so a Redis Cluster keeps them in one slot): `:r:<request id>` (a row:
a hash of the SQLite columns; a column never written, or written as NULL, is absent), `:time`
(request ids by time, for `rows(since=)`) and `:seq` (the last row number: the `id` column).

Every write touches one row and runs on the server as one step (a small Lua script, which
Redis runs atomically): `record` adds the row only if its request id is new, and each later
update (outcome, trace, signals, feedback) sets its fields only if the row exists. So any
process may write any row (a gateway may take the feedback on a request another answered), and
none coordinates anything itself. Rows come back in the order the server took them (their
number), as the SQLite log's come in its row order; `since` reads the times, which come from
the writers' clocks (keep them in sync with NTP).

redis-py is imported only when a `RedisDecisionLog` is made (`hybridllm.stores.redis_urls.connect`;
`hybridllm[redis]`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from hybridllm.errors import DecisionLogError
from hybridllm.routing.features import Messages
from hybridllm.routing.labels import Example
from hybridllm.routing.log import (
    kept_trace,
    log_example,
    signals_json,
    stored_prompt,
    training_signal_pair,
)
from hybridllm.stores.redis_urls import connect, redact_url, split_prefix

__all__ = ["DEFAULT_PREFIX", "RedisDecisionLog"]

DEFAULT_PREFIX = "hybridllm:decisions"

# KEYS[1]: the prefix; ARGV: request id, time, then the row's field/value pairs. Answers the
# row's number, or 0 when the request id is already logged (nothing written).
_RECORD = """
local k = KEYS[1] .. ':r:' .. ARGV[1]
if redis.call('EXISTS', k) == 1 then return 0 end
local id = redis.call('INCR', KEYS[1] .. ':seq')
redis.call('HSET', k, 'id', id, unpack(ARGV, 3))
redis.call('ZADD', KEYS[1] .. ':time', ARGV[2], ARGV[1])
return id
"""

# KEYS[1]: the prefix; ARGV: request id, n, n field/value pairs to set, then the fields to
# clear (NULL). Answers 1, or 0 when the row does not exist (nothing written).
_UPDATE = """
local k = KEYS[1] .. ':r:' .. ARGV[1]
if redis.call('EXISTS', k) == 0 then return 0 end
local n = tonumber(ARGV[2])
if n > 0 then redis.call('HSET', k, unpack(ARGV, 3, 2 + 2 * n)) end
if #ARGV > 2 + 2 * n then redis.call('HDEL', k, unpack(ARGV, 3 + 2 * n)) end
return 1
"""

# the SQLite columns, in its order, and how a stored string reads back (None: as text)
_COLUMNS: tuple[tuple[str, Callable[[str], object] | None], ...] = (
    ("id", int),
    ("request_id", None),
    ("time", float),
    ("policy", None),
    ("features", json.loads),
    ("score", float),
    ("route", None),
    ("engine", None),
    ("prompt", None),
    ("ttft_ms", float),
    ("error_kind", None),
    ("fallback", int),
    ("feedback", int),
    ("feedback_time", float),
    ("signals", None),
    ("cascade", None),
    ("tpot_ms", float),
    ("itl_p99_ms", float),
    ("total_ms", float),
    ("trace", None),
)
_BATCH = 500  # rows read per round trip


def _stored(value: object) -> str:
    """A field's value as the hash keeps it (floats exactly, by repr)."""
    return repr(value) if isinstance(value, float) else str(value)


class RedisDecisionLog:
    """Routing decisions on a Redis server, shared by every process that opens the same URL and
    prefix (`?prefix=NAME` in the URL, default "hybridllm:decisions"). `store_prompts`: keep
    the prompt text (off by default; when off it is never sent to the server). A server that
    cannot be reached raises `DecisionLogError` naming it (the password hidden)."""

    def __init__(self, url: str, *, store_prompts: bool = False) -> None:
        server_url, prefix = split_prefix(url, argument="decision_log", default=DEFAULT_PREFIX)
        self.url = redact_url(url)
        self.prefix = prefix
        self.store_prompts = store_prompts
        self._key = "{" + prefix + "}"
        self._redis, self._unreachable = connect(
            server_url, argument="decision_log", feature="a Redis decision log"
        )
        self._record = self._redis.register_script(_RECORD)
        self._update_script = self._redis.register_script(_UPDATE)

    def __repr__(self) -> str:
        return f"RedisDecisionLog({self.url!r}, prefix={self.prefix!r})"

    def close(self) -> None:
        self._redis.close()

    def __enter__(self) -> RedisDecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes -----------------------------------------------------------------------------

    def record(
        self,
        *,
        route: str,
        features: dict[str, float],
        score: float | None = None,
        policy: str | None = None,
        engine: str | None = None,
        messages: Messages | None = None,
        request_id: str | None = None,
        at: float | None = None,
    ) -> str:
        """Log one decision; returns its request id. `messages` are stored only if opted in."""
        rid = request_id or uuid.uuid4().hex
        now = time.time() if at is None else at
        fields = {
            "request_id": rid,
            "time": now,
            "policy": policy,
            "score": score,
            "features": json.dumps(features),
            "route": route,
            "engine": engine,
            "prompt": stored_prompt(messages, self.store_prompts),
            "fallback": 0,
        }
        pairs = [x for k, v in fields.items() if v is not None for x in (k, _stored(v))]
        if self._call(self._record, [rid, _stored(now), *pairs]) == 0:
            raise DecisionLogError(f"request id {rid!r} is already logged")
        return rid

    def outcome(
        self,
        request_id: str,
        *,
        engine: str | None = None,
        ttft_ms: float | None = None,
        error_kind: str | None = None,
        fallback: bool = False,
        cascade: dict[str, Any] | None = None,
        trace: dict[str, Any] | None = None,
    ) -> None:
        """How the request went, as `DecisionLog.outcome` records it, in one write: the
        engine (kept when None), TTFT, error, fallback, the trace with its timing figures, and
        the cascade's decision with the local signals it read."""
        fields: dict[str, object] = {
            "ttft_ms": ttft_ms,
            "error_kind": error_kind,
            "fallback": int(fallback),
        }
        if engine is not None:
            fields["engine"] = engine
        if trace is not None:
            for name in ("tpot_ms", "itl_p99_ms", "total_ms"):
                fields[name] = trace.get(name)
            fields["trace"] = json.dumps(kept_trace(trace, self.store_prompts))
        if cascade is not None and cascade.get("signals"):
            fields.update(self._signal_fields(cascade["signals"], cascade))
        self._update(request_id, fields)

    def signals(
        self, request_id: str, signals: dict[str, float], cascade: dict[str, Any] | None = None
    ) -> None:
        """The local model's signals on this request's prompt and, for the cascade plan, its
        decision (`cascade`, its "signals" left out)."""
        self._update(request_id, self._signal_fields(signals, cascade))

    @staticmethod
    def _signal_fields(
        signals: dict[str, float], cascade: dict[str, Any] | None
    ) -> dict[str, object]:
        rest = None if cascade is None else {k: v for k, v in cascade.items() if k != "signals"}
        return {
            "signals": signals_json(signals),
            "cascade": None if rest is None else json.dumps(rest),
        }

    def feedback(self, request_id: str, good: bool) -> None:
        """The user's verdict on the answer of this request (the latest verdict wins), from
        any process sharing the log."""
        self._update(request_id, {"feedback": int(good), "feedback_time": time.time()})

    def _update(self, request_id: str, fields: dict[str, object]) -> None:
        """Set the row's fields (None: clear), only if the row exists; one step on the server."""
        kept = [(k, _stored(v)) for k, v in fields.items() if v is not None]
        cleared = [k for k, v in fields.items() if v is None]
        args = [request_id, str(len(kept)), *(x for pair in kept for x in pair), *cleared]
        if self._call(self._update_script, args) == 0:
            raise DecisionLogError(f"unknown request id {request_id!r} in {self.url}")

    # ---- reads ------------------------------------------------------------------------------

    def rows(self, *, since: float | None = None) -> list[dict[str, Any]]:
        """Every logged decision as a dict (features parsed; the SQLite log's columns), in the
        order they were logged; `since`: only those logged at or after that time (seconds
        since the epoch)."""
        low = "-inf" if since is None else _stored(float(since))

        def read() -> list[dict[str, str]]:
            found = self._redis.zrangebyscore(f"{self._key}:time", low, "+inf")
            ids = [str(rid) for rid in found]  # decode_responses: already str
            out: list[dict[str, str]] = []
            for start in range(0, len(ids), _BATCH):
                pipe = self._redis.pipeline(transaction=False)
                for rid in ids[start : start + _BATCH]:
                    pipe.hgetall(f"{self._key}:r:{rid}")
                out += pipe.execute()
            return out

        rows = [_row(raw) for raw in self._call(read) if raw]
        return sorted(rows, key=lambda r: r["id"])

    def scores(self, *, policy: str | None = None, since: float | None = None) -> list[float]:
        """Logged router scores (for `Router.recalibrate` on the user's own traffic)."""
        return [
            float(r["score"])
            for r in self.rows(since=since)
            if r["score"] is not None and (policy is None or r["policy"] == policy)
        ]

    def training_examples(self) -> list[Example]:
        """Rows that label the local model: prompt stored, feedback given, answered locally."""
        return [
            log_example(r["request_id"], r["prompt"], bool(r["feedback"]))
            for r in _teaching(self.rows())
        ]

    def training_signals(self) -> dict[str, dict[str, float]]:
        """{"log/<request id>": signals} of the `training_examples` rows that recorded them."""
        return {rid: sig for rid, (sig, _) in self._training_rows().items()}

    def training_whole(self) -> dict[str, dict[str, float]]:
        """{"log/<request id>": the whole local answer's figures} of the `training_examples`
        rows whose cascade judged a whole answer."""
        return {rid: whole for rid, (_, whole) in self._training_rows().items() if whole}

    def _training_rows(self) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
        return {
            f"log/{r['request_id']}": training_signal_pair(r["signals"], r["cascade"])
            for r in _teaching(self.rows())
            if r["signals"] is not None
        }

    def _call(self, script: Any, args: list[str] | None = None) -> Any:
        """Run a script under this log's prefix (or `script()`, a read); a server that cannot
        be reached raises `DecisionLogError`."""
        try:
            return script(keys=[self._key], args=args) if args is not None else script()
        except self._unreachable as exc:
            cause = f"{type(exc).__name__}: {exc}"
            raise DecisionLogError(
                f"the decision log at {self.url} is unreachable ({cause})"
            ) from exc


def _teaching(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that can teach the router (`DecisionLog.training_examples`' rule), by number."""
    kept = (r for r in rows if r["prompt"] is not None and r["feedback"] is not None)
    return sorted((r for r in kept if r["engine"] == "local"), key=lambda r: r["id"])


def _row(raw: dict[str, str]) -> dict[str, Any]:
    """One row hash as the SQLite log's `rows()` gives a row (an absent field is None)."""
    out: dict[str, Any] = {}
    for name, kind in _COLUMNS:
        value = raw.get(name)
        out[name] = value if value is None or kind is None else kind(value)
    return out
