"""Append-only SQLite schema migrations: one registry of steps per database (simonw/llm style).

    MIGRATIONS: Steps = (
        "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)",      # 1
        "ALTER TABLE t ADD COLUMN b REAL",                        # 2: append, never edit or reorder
    )
    migrate(conn, MIGRATIONS)   # a new file gets every step, an existing one the steps it lacks

The schema version is the file's `PRAGMA user_version` (0 for a new file): step `i` (counting
from 1) runs when the version is below `i`, and the version is set to `i` in the same
transaction, so a failing step leaves the file as it was. `BEGIN IMMEDIATE` takes the file's
write lock first, so two processes opening the same new file never run a step twice.

A step is an SQL script (statements split on `;`, so no `;` inside a literal or a trigger) or a
function of the connection. `legacy` adopts a file whose version was recorded some other way
(read only while `user_version` is 0): it returns the number of steps that file already has.

The connection must be in autocommit mode (`isolation_level=None`); the caller serialises its
own threads around the call.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

Step = str | Callable[[sqlite3.Connection], None]
Steps = Sequence[Step]

__all__ = ["Step", "Steps", "migrate", "schema_version"]


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(
    conn: sqlite3.Connection,
    steps: Steps,
    *,
    legacy: Callable[[sqlite3.Connection], int] | None = None,
) -> int:
    """Run the steps this file lacks, in one transaction; returns the schema version. A file
    from newer code (version above `len(steps)`) is left as it is."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = schema_version(conn)
        if version == 0 and legacy is not None:
            version = legacy(conn)
        for number in range(version + 1, len(steps) + 1):
            step = steps[number - 1]
            if isinstance(step, str):
                for statement in filter(str.strip, step.split(";")):
                    conn.execute(statement)
            else:
                step(conn)
            version = number
        if version != schema_version(conn):
            conn.execute(f"PRAGMA user_version = {int(version)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return version
