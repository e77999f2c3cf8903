"""The decision log: migrations, prompt opt-in, feedback, concurrent writers, and
`hybridllm router train --from-log` end to end."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
from pathlib import Path

import pytest

from hybridllm.cli.main import main
from hybridllm.errors import DecisionLogError
from hybridllm.routing import DecisionLog, Router
from hybridllm.routing.features import extract
from hybridllm.routing.log import MIGRATIONS
from tests._router_data import write_fixture

SECRET = "my bank password is hunter2, what is 17 * 23?"


def test_fresh_log_has_every_migration(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "d.db") as log:
        assert log.schema_version == len(MIGRATIONS)
    with DecisionLog(tmp_path / "d.db") as log:  # reopening applies nothing twice
        assert log.schema_version == len(MIGRATIONS)
        conn = sqlite3.connect(tmp_path / "d.db")
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_an_old_log_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.executescript(str(MIGRATIONS[0]))
    conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.execute(
        "INSERT INTO decisions (request_id, time, features, route) "
        "VALUES ('r1', 1.0, '{}', 'local')"
    )
    conn.close()
    with DecisionLog(path) as log:
        assert log.schema_version == len(MIGRATIONS)
        log.feedback("r1", good=False)
        (row,) = log.rows()
        assert row["request_id"] == "r1" and row["feedback"] == 0


def test_prompt_text_is_stored_only_when_opted_in(tmp_path: Path) -> None:
    feats = extract(SECRET).dense_dict()
    with DecisionLog(tmp_path / "private.db") as log:
        rid = log.record(route="local", engine="local", features=feats, score=0.3,
                         policy="chat", messages=SECRET)  # fmt: skip
        log.feedback(rid, good=True)
        (row,) = log.rows()
        assert row["prompt"] is None and row["features"] == feats
        assert log.training_examples() == []
    for f in tmp_path.glob("private.db*"):  # the database, its WAL and shared memory
        assert b"hunter2" not in f.read_bytes()

    with DecisionLog(tmp_path / "opted.db", store_prompts=True) as log:
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": SECRET}]
        rid = log.record(route="local", engine="local", features=feats, messages=msgs)
        log.feedback(rid, good=False)
        (ex,) = log.training_examples()
        assert ex.prompt == msgs and ex.local_correct is False and ex.source == "log"


def test_outcome_feedback_and_scores(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "d.db") as log:
        a = log.record(route="cloud", features={}, score=0.8, policy="chat", at=100.0)
        b = log.record(route="local", features={}, score=0.1, policy="voice", at=200.0)
        log.outcome(a, engine="local", ttft_ms=512.5, error_kind="CloudTimeoutError", fallback=True)
        log.feedback(b, good=True)
        log.feedback(b, good=False)  # the latest verdict wins
        rows = {r["request_id"]: r for r in log.rows()}
        assert rows[a]["engine"] == "local" and rows[a]["fallback"] == 1
        assert rows[a]["ttft_ms"] == 512.5 and rows[a]["error_kind"] == "CloudTimeoutError"
        assert rows[b]["feedback"] == 0 and rows[b]["feedback_time"] is not None
        assert sorted(log.scores()) == [0.1, 0.8]
        assert log.scores(policy="chat") == [0.8]
        assert log.scores(since=150.0) == [0.1]
        with pytest.raises(DecisionLogError, match="unknown request id"):
            log.feedback("nope", good=True)
        with pytest.raises(DecisionLogError, match="already logged"):
            log.record(route="local", features={}, request_id=a)


def _write_many(path: str, tag: str, n: int) -> None:
    with DecisionLog(path) as log:
        for i in range(n):
            rid = log.record(route="local", features={"i": float(i)}, request_id=f"{tag}-{i}")
            log.feedback(rid, good=i % 2 == 0)


def test_concurrent_writers_threads_and_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    DecisionLog(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(path, f"p{k}", 40)) for k in range(2)]
    for p in procs:
        p.start()
    with DecisionLog(path) as shared:

        def write(tag: str) -> None:
            for i in range(40):
                shared.record(route="cloud", features={}, request_id=f"{tag}-{i}")

        threads = [threading.Thread(target=write, args=(f"t{k}",)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    with DecisionLog(path) as log:
        rows = log.rows()
    assert len(rows) == 5 * 40 and len({r["request_id"] for r in rows}) == 200


def test_train_from_log_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labels = write_fixture(tmp_path / "labels.jsonl")
    db = tmp_path / "decisions.db"
    with DecisionLog(db, store_prompts=True) as log:
        for i in range(12):
            prompt = f"Translate to French: the {i} red cars"
            rid = log.record(route="local", engine="local", features=extract(prompt).dense_dict(),
                             messages=[{"role": "user", "content": prompt}])  # fmt: skip
            log.feedback(rid, good=False)
        log.record(route="local", engine="local", features={}, messages="no feedback given")
        rid = log.record(route="cloud", engine="cloud", features={}, messages="cloud answered")
        log.feedback(rid, good=True)
    with DecisionLog(tmp_path / "private.db") as log:  # no prompts: nothing to learn from
        log.feedback(log.record(route="local", engine="local", features={}), good=False)

    out = tmp_path / "router"
    assert main(["router", "train", "--data", str(labels), "--out", str(out),
                 "--from-log", str(db)]) == 0  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["from_log"]["rows"] == 12
    assert manifest["data"]["rows"] == 240
    router = Router.load(out)
    assert router.score("Translate to French: the 99 red cars") > router.score(
        "Is a cat bigger than a castle? Answer yes or no."
    )

    base = tmp_path / "base"
    assert main(["router", "train", "--data", str(labels), "--out", str(base)]) == 0
    learned = Router.load(out).score("Translate to French: the 7 red cars")
    assert learned > Router.load(base).score("Translate to French: the 7 red cars")

    plot = tmp_path / "eval.png"
    code = main(["router", "eval", "--data", str(labels), "--router", str(out),
                 "--leave-out", "arith", "--plot", str(plot)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "APGR" in text and "left out of training: arith" in text and "length-only" in text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recalibrate_from_log_end_to_end(tmp_path: Path) -> None:
    labels = write_fixture(tmp_path / "labels.jsonl")
    base = tmp_path / "router"
    assert main(["router", "train", "--data", str(labels), "--out", str(base)]) == 0
    router = Router.load(base)
    db = tmp_path / "d.db"
    with DecisionLog(db) as log:  # the user's traffic: yes/no questions, which score low
        for i in range(40):
            prompt = f"Is a cat number {i} bigger than a castle? Answer yes or no."
            log.record(route="local", features={}, score=router.score(prompt), policy="chat")
    out = tmp_path / "mine"
    assert main(["router", "recalibrate", "--from-log", str(db), "--router", str(base),
                 "--out", str(out)]) == 0  # fmt: skip
    mine = Router.load(out)
    assert mine.calibration.source == "traffic n=40"
    assert mine.threshold(cloud_share=0.5) < router.threshold(cloud_share=0.5)
    assert mine.score("Calculate 3 * 4?") == router.score("Calculate 3 * 4?")
