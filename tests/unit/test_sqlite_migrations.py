"""`hybridllm.sqlite_migrations.migrate`: append-only steps, the version in
`PRAGMA user_version`, one transaction; and files written by the ledger and the decision log
before it still open."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hybridllm.errors import BudgetExceededError
from hybridllm.guard.budget import Cap, ModelPrice, SQLiteLedger, TokenUsage
from hybridllm.routing.log import MIGRATIONS, DecisionLog
from hybridllm.sqlite_migrations import migrate, schema_version

STEPS = (
    "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT); CREATE INDEX t_a ON t (a)",
    "ALTER TABLE t ADD COLUMN b REAL",
)


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def test_a_new_file_gets_every_step_once(tmp_path: Path) -> None:
    conn = connect(tmp_path / "a.db")
    assert migrate(conn, STEPS) == 2 == schema_version(conn)
    assert columns(conn, "t") == ["id", "a", "b"]
    assert migrate(conn, STEPS) == 2  # nothing runs twice (CREATE TABLE would fail)


def test_an_appended_step_upgrades_an_existing_file(tmp_path: Path) -> None:
    conn = connect(tmp_path / "a.db")
    migrate(conn, STEPS[:1])
    conn.execute("INSERT INTO t (a) VALUES ('kept')")

    def backfill(c: sqlite3.Connection) -> None:  # a step may be a function
        c.execute("UPDATE t SET b = length(a)")

    assert migrate(conn, (*STEPS, backfill)) == 3
    assert conn.execute("SELECT a, b FROM t").fetchall() == [("kept", 4.0)]


def test_a_failing_step_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    conn = connect(tmp_path / "a.db")
    migrate(conn, STEPS[:1])
    broken = (*STEPS, "CREATE TABLE u (x); ALTER TABLE nowhere ADD COLUMN y")
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, broken)
    assert schema_version(conn) == 1 and columns(conn, "t") == ["id", "a"]
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'u'").fetchone() is None
    assert not conn.in_transaction


def test_a_file_from_newer_code_is_left_alone(tmp_path: Path) -> None:
    conn = connect(tmp_path / "a.db")
    migrate(conn, STEPS)
    assert migrate(conn, STEPS[:1]) == 2 == schema_version(conn)


def test_legacy_is_read_only_for_an_unversioned_file(tmp_path: Path) -> None:
    conn = connect(tmp_path / "a.db")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)")
    asked: list[int] = []

    def legacy(c: sqlite3.Connection) -> int:
        asked.append(1)
        return 1

    assert migrate(conn, STEPS, legacy=legacy) == 2 and columns(conn, "t") == ["id", "a", "b"]
    assert migrate(conn, STEPS, legacy=legacy) == 2 and asked == [1]


# ---- files written by the code before the shared helper (iterdump of real files) -----------

LEDGER_V1 = """
CREATE TABLE entries (
        id INTEGER PRIMARY KEY,
        scope TEXT NOT NULL,
        model TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('reserved', 'settled', 'released', 'expired')),
        reserved_nano INTEGER NOT NULL,
        cost_nano INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        estimated INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        closed_at REAL,
        day TEXT NOT NULL,
        month TEXT NOT NULL
    );
INSERT INTO "entries" VALUES(1,'chat','m','settled',2000000,1500000,1000,250,0,1767225600.0,
    1767226500.0,1767225600.0,'2026-01-01','2026-01');
INSERT INTO "entries" VALUES(2,'chat','m','reserved',2000000,0,1000,NULL,0,1767225600.0,
    2767225600.0,NULL,'2026-01-01','2026-01');
CREATE TABLE totals (
        period TEXT NOT NULL,
        scope TEXT NOT NULL,
        spent_nano INTEGER NOT NULL DEFAULT 0,
        held_nano INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (period, scope)
    ) WITHOUT ROWID;
INSERT INTO "totals" VALUES('2026-01','*',1500000,2000000);
INSERT INTO "totals" VALUES('2026-01','p:chat',1500000,2000000);
INSERT INTO "totals" VALUES('2026-01-01','*',1500000,2000000);
INSERT INTO "totals" VALUES('2026-01-01','p:chat',1500000,2000000);
CREATE INDEX entries_day ON entries (day, scope);
CREATE INDEX entries_month ON entries (month, scope);
CREATE INDEX entries_open ON entries (state, expires_at);
PRAGMA user_version = 1;
"""

DECISIONS_V2 = """
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
    , feedback INTEGER, feedback_time REAL);
INSERT INTO "decisions" VALUES(1,'r1',1767225600.0,'chat','{"chars": 2.0}',0.2,'local','local',
    NULL,NULL,NULL,0,1,1796064059.78);
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO "schema_version" VALUES(1);
INSERT INTO "schema_version" VALUES(2);
CREATE INDEX decisions_time ON decisions(time);
"""

PRICE = ModelPrice(input_per_million=1.0, output_per_million=2.0)
NEW_YEAR = datetime(2026, 1, 1, 12, tzinfo=UTC).timestamp()


def written(path: Path, script: str) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.close()
    return path


def test_a_ledger_written_before_the_helper_opens_with_its_spend(tmp_path: Path) -> None:
    path = written(tmp_path / "ledger.db", LEDGER_V1)
    with SQLiteLedger(path, clock=lambda: NEW_YEAR) as ledger:
        s = ledger.spend("day", "chat")
        assert (s.settled_usd, s.reserved_usd) == (0.0015, 0.002)
        # the caps still see the old spend: 3.5 m$ of a 5 m$ day, a 2 m$ request does not fit
        with pytest.raises(BudgetExceededError, match="daily"):
            ledger.reserve(model="m", price=PRICE, prompt_tokens=1000, max_tokens=500,
                           scope="chat", caps=[Cap(None, "day", 0.005)])  # fmt: skip
        r = ledger.reserve(model="m", price=PRICE, prompt_tokens=100, max_tokens=50, scope="chat")
        ledger.settle(r, TokenUsage(100, 50))
        assert len(ledger.entries()) == 3
        assert [e["engine"] for e in ledger.entries()] == ["", "", ""]  # old rows: not said
        assert [e["user"] for e in ledger.entries()] == ["", "", ""]  # nor their users
    # 2: the overrun columns, 3: the engine column, 4: the user column, added
    assert schema_version(sqlite3.connect(path)) == 4


def test_a_decision_log_written_before_the_helper_is_adopted(tmp_path: Path) -> None:
    path = written(tmp_path / "decisions.db", DECISIONS_V2)
    with DecisionLog(path) as log:  # steps 1-2 do not run again (CREATE TABLE would fail)
        assert log.schema_version == len(MIGRATIONS) == 4  # 3: the signals, 4: the trace
        (row,) = log.rows()
        assert row["request_id"] == "r1" and row["feedback"] == 1
        log.record(route="cloud", features={}, request_id="r2")
        log.feedback("r2", good=False)
    assert schema_version(sqlite3.connect(path)) == 4


def test_a_version_1_decision_log_gets_the_feedback_columns(tmp_path: Path) -> None:
    v1 = DECISIONS_V2.replace(", feedback INTEGER, feedback_time REAL", "")
    v1 = v1.replace("0,1,1796064059.78", "0")
    v1 = v1.replace('INSERT INTO "schema_version" VALUES(2);', "")
    path = written(tmp_path / "decisions.db", v1)
    with DecisionLog(path) as log:
        assert log.schema_version == len(MIGRATIONS)
        log.feedback("r1", good=True)
        assert log.rows()[0]["feedback"] == 1
