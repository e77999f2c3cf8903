"""The decision log: one SQLite row per routed request, for learning from use.

    log = DecisionLog("decisions.db")                      # store_prompts=False by default
    rid = log.record(policy="chat", features=f.dense_dict(), score=0.42, route="local",
                     engine="local", messages=messages)     # text kept only if opted in
    log.outcome(rid, ttft_ms=310.0, error_kind=None, fallback=False)
    log.feedback(rid, good=True)                            # the user's verdict on the answer

The schema evolves through append-only numbered migrations (`MIGRATIONS`, applied by
`hybridllm.sqlite_migrations.migrate`, the version in `PRAGMA user_version`); an existing file
is upgraded on open, including one that recorded its version in the older `schema_version`
table. Prompt text is stored only when the log was opened with `store_prompts=True`; otherwise
it is never written, whatever the caller passes. The file uses WAL journaling and a busy
timeout, so several processes and threads can write to it at once.

`training_examples()` gives the rows that can teach the router: prompt stored, feedback given,
answered by the local engine (feedback on a cloud answer says nothing about the local model).
The cloud's answer to them is unknown and taken as right, so a bad local answer counts as
"cloud needed" under either label.

`DecisionLogLike` is what the log's users call (the client, `hybridllm stats`, `router train
--from-log`): `DecisionLog` (this SQLite file, one machine) and
`hybridllm.routing.log_redis.RedisDecisionLog` (several gateways sharing one log) both are one;
`hybridllm.routing.logs.decision_log_from_url` picks one from a path or URL.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from hybridllm.errors import DecisionLogError
from hybridllm.routing.features import Messages
from hybridllm.routing.labels import Example
from hybridllm.sqlite_migrations import Steps, migrate, schema_version

MIGRATIONS: Steps = (
    # 1: the decisions
    """
    CREATE TABLE decisions (
        id INTEGER PRIMARY KEY,
        request_id TEXT NOT NULL UNIQUE,
        time REAL NOT NULL,
        policy TEXT,
        features TEXT NOT NULL,
        score REAL,
        route TEXT NOT NULL,
        engine TEXT,
        prompt TEXT,
        ttft_ms REAL,
        error_kind TEXT,
        fallback INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX decisions_time ON decisions(time);
    """,
    # 2: user feedback on the answer
    """
    ALTER TABLE decisions ADD COLUMN feedback INTEGER;
    ALTER TABLE decisions ADD COLUMN feedback_time REAL;
    """,
    # 3: the local model's own signals (router stage 2) and the cascade's decision
    """
    ALTER TABLE decisions ADD COLUMN signals TEXT;
    ALTER TABLE decisions ADD COLUMN cascade TEXT;
    """,
    # 4: the request's timing beside TTFT, and its whole trace (`Trace.to_dict()`) as JSON:
    # what `hybridllm stats` aggregates
    """
    ALTER TABLE decisions ADD COLUMN tpot_ms REAL;
    ALTER TABLE decisions ADD COLUMN itl_p99_ms REAL;
    ALTER TABLE decisions ADD COLUMN total_ms REAL;
    ALTER TABLE decisions ADD COLUMN trace TEXT;
    """,
)


def _legacy_version(conn: sqlite3.Connection) -> int:
    """Files written before `hybridllm.sqlite_migrations` recorded their version as rows of a
    `schema_version` table (left in place, no longer written)."""
    table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if table is None:
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


@runtime_checkable
class DecisionLogLike(Protocol):
    """What the decision log's users call; see `DecisionLog` for each method's meaning (the
    SQLite log; `RedisDecisionLog` keeps the same rows on a Redis server)."""

    store_prompts: bool

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
    ) -> str: ...

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
    ) -> None: ...

    def signals(
        self, request_id: str, signals: dict[str, float], cascade: dict[str, Any] | None = None
    ) -> None: ...

    def feedback(self, request_id: str, good: bool) -> None: ...

    def rows(self, *, since: float | None = None) -> list[dict[str, Any]]: ...

    def scores(self, *, policy: str | None = None, since: float | None = None) -> list[float]: ...

    def training_examples(self) -> list[Example]: ...

    def training_signals(self) -> dict[str, dict[str, float]]: ...

    def training_whole(self) -> dict[str, dict[str, float]]: ...

    def close(self) -> None: ...


def stored_prompt(messages: Messages | None, store_prompts: bool) -> str | None:
    """The prompt as a row keeps it: None unless the log stores prompts; plain text as it is,
    a message list as JSON."""
    if not store_prompts or messages is None:
        return None
    return messages if isinstance(messages, str) else json.dumps(list(messages))


def kept_trace(trace: dict[str, Any], store_prompts: bool) -> dict[str, Any]:
    """The trace a row keeps: its captured text (`content`) only if the log stores prompts."""
    return trace if store_prompts else {k: v for k, v in trace.items() if k != "content"}


def signals_json(signals: dict[str, float]) -> str:
    """The local signals as a row keeps them (NaN, which JSON lacks, as null)."""
    return json.dumps({k: None if v != v else v for k, v in signals.items()})


def training_signal_pair(
    signals: str, cascade: str | None
) -> tuple[dict[str, float], dict[str, float]]:
    """A row's stored signals and its cascade's whole-answer signals (`answer_signals`, {} when
    none) as floats, null back to NaN."""

    def floats(values: dict[str, Any]) -> dict[str, float]:
        return {k: float("nan") if v is None else float(v) for k, v in values.items()}

    whole = (json.loads(cascade) if cascade else {}).get("answer_signals") or {}
    return floats(json.loads(signals)), floats(whole)


class DecisionLog:
    """Append-mostly SQLite log of routing decisions (thread-safe; multi-process safe on one
    machine). Also named `SQLiteDecisionLog`."""

    def __init__(
        self, path: Path | str, *, store_prompts: bool = False, busy_timeout_s: float = 10.0
    ) -> None:
        self.path = Path(path)
        self.store_prompts = store_prompts
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        with self._lock:
            migrate(self._conn, MIGRATIONS, legacy=_legacy_version)

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return schema_version(self._conn)

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
        prompt = stored_prompt(messages, self.store_prompts)
        row = (rid, time.time() if at is None else at, policy, json.dumps(features), score,
               route, engine, prompt)  # fmt: skip
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO decisions (request_id, time, policy, features, score, route, "
                    "engine, prompt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
            except sqlite3.IntegrityError as exc:
                raise DecisionLogError(f"request id {rid!r} is already logged") from exc
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
        """Record how the request went: the engine that answered, TTFT, error, fallback, and
        the cascade plan's decision with the local signals it read (`trace.cascade.as_dict()`:
        the record's fields as JSON, stored as they were when the trace held a dict).
        `trace`: the request's `Trace.to_dict()` (its TPOT, ITL P99 and total time go to their
        own columns too); captured text in it is dropped unless the log stores prompts."""
        self._update(
            request_id,
            "engine = COALESCE(?, engine), ttft_ms = ?, error_kind = ?, fallback = ?",
            (engine, ttft_ms, error_kind, int(fallback)),
        )
        if trace is not None:
            self._trace(request_id, trace)
        if cascade is not None and cascade.get("signals"):
            rest = {k: v for k, v in cascade.items() if k != "signals"}
            self.signals(request_id, cascade["signals"], rest)

    def _trace(self, request_id: str, trace: dict[str, Any]) -> None:
        kept = kept_trace(trace, self.store_prompts)
        figures = (trace.get("tpot_ms"), trace.get("itl_p99_ms"), trace.get("total_ms"))
        self._update(
            request_id,
            "tpot_ms = ?, itl_p99_ms = ?, total_ms = ?, trace = ?",
            (*figures, json.dumps(kept)),
        )

    def signals(
        self, request_id: str, signals: dict[str, float], cascade: dict[str, Any] | None = None
    ) -> None:
        """The local model's signals on this request's prompt (stage 2 learns from them with
        the feedback) and, for the cascade plan, its decision and held time."""
        plan = None if cascade is None else json.dumps(cascade)
        self._update(request_id, "signals = ?, cascade = ?", (signals_json(signals), plan))

    def training_signals(self) -> dict[str, dict[str, float]]:
        """{"log/<request id>": signals} of the `training_examples` rows that recorded them."""
        return {rid: sig for rid, (sig, _) in self._training_rows().items()}

    def training_whole(self) -> dict[str, dict[str, float]]:
        """{"log/<request id>": the whole local answer's figures} of the `training_examples`
        rows whose cascade judged a whole answer (`cascade_judge = "answer"`): what the
        "answer" models of stage 2 learn from."""
        return {rid: whole for rid, (_, whole) in self._training_rows().items() if whole}

    def _training_rows(self) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
        with self._lock:
            raw = self._conn.execute(
                "SELECT request_id, signals, cascade FROM decisions WHERE prompt IS NOT NULL "
                "AND feedback IS NOT NULL AND engine = 'local' AND signals IS NOT NULL ORDER BY id"
            ).fetchall()
        return {f"log/{rid}": training_signal_pair(sig, cascade) for rid, sig, cascade in raw}

    def feedback(self, request_id: str, good: bool) -> None:
        """The user's verdict on the answer of this request (the latest verdict wins)."""
        self._update(request_id, "feedback = ?, feedback_time = ?", (int(good), time.time()))

    def _update(self, request_id: str, assignments: str, values: Sequence[Any]) -> None:
        with self._lock:
            cur = self._conn.execute(
                f"UPDATE decisions SET {assignments} WHERE request_id = ?",
                (*values, request_id),
            )
        if cur.rowcount == 0:
            raise DecisionLogError(f"unknown request id {request_id!r} in {self.path}")

    def rows(self, *, since: float | None = None) -> list[dict[str, Any]]:
        """Every logged decision as a dict (features parsed), oldest first; `since`: only those
        logged at or after that time (seconds since the epoch)."""
        sql, args = "SELECT * FROM decisions", []
        if since is not None:
            sql, args = sql + " WHERE time >= ?", [since]
        with self._lock:
            cur = self._conn.execute(sql + " ORDER BY id", args)
            names = [d[0] for d in cur.description]
            raw = cur.fetchall()
        out = []
        for r in raw:
            d = dict(zip(names, r, strict=True))
            d["features"] = json.loads(d["features"])
            out.append(d)
        return out

    def scores(self, *, policy: str | None = None, since: float | None = None) -> list[float]:
        """Logged router scores (for `Router.recalibrate` on the user's own traffic)."""
        sql = "SELECT score FROM decisions WHERE score IS NOT NULL"
        args: list[Any] = []
        if policy is not None:
            sql += " AND policy = ?"
            args.append(policy)
        if since is not None:
            sql += " AND time >= ?"
            args.append(since)
        with self._lock:
            return [float(r[0]) for r in self._conn.execute(sql, args)]

    def training_examples(self) -> list[Example]:
        """Rows that label the local model: prompt stored, feedback given, answered locally."""
        with self._lock:
            raw = self._conn.execute(
                "SELECT request_id, prompt, feedback FROM decisions WHERE prompt IS NOT NULL "
                "AND feedback IS NOT NULL AND engine = 'local' ORDER BY id"
            ).fetchall()
        return [log_example(rid, prompt, bool(good)) for rid, prompt, good in raw]


def log_example(request_id: str, prompt: str, good: bool) -> Example:
    """A row with a stored prompt and feedback as a training example: the local answer right
    as the user said; the cloud's, unknown, taken as right."""
    text = prompt_text(prompt)
    return Example(source="log", id=request_id, prompt=text, local_correct=good, cloud_correct=True)


def prompt_text(stored: str) -> Messages:
    """A stored prompt back as it was given: a message list (stored as JSON) or plain text."""
    if stored.startswith("["):
        try:
            msgs = json.loads(stored)
        except ValueError:
            return stored
        if isinstance(msgs, list) and all(isinstance(m, dict) for m in msgs):
            return msgs
    return stored


SQLiteDecisionLog = DecisionLog  # beside RedisDecisionLog; `DecisionLog` stays its name
