"""The decision log: migrations, prompt opt-in, feedback, concurrent writers, and
`hybridllm router train --from-log` end to end. The behavioural tests run against both logs
(`make_log`): the SQLite `DecisionLog`, and `RedisDecisionLog` on a real loopback redis-server
(`redis_url`, tests/conftest.py; those cases are marked integration)."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from hybridllm.cli.main import main
from hybridllm.client import HybridClient
from hybridllm.errors import DecisionLogError, InvalidArgumentError
from hybridllm.routing import DecisionLog, DecisionLogLike, RedisDecisionLog, Router
from hybridllm.routing.features import extract
from hybridllm.routing.log import MIGRATIONS
from hybridllm.routing.logs import decision_log_from_url
from hybridllm.testing import ScriptedEngine
from tests._router_data import write_fixture

SECRET = "my bank password is hunter2, what is 17 * 23?"


class Logs:
    """Opens logs of one kind for one test: each name its own empty log (a file in the test's
    directory, or a key prefix of its own on the session's redis-server)."""

    def __init__(self, kind: str, tmp: Path, server: str | None) -> None:
        self.kind, self.tmp, self.server = kind, tmp, server
        self.run = uuid.uuid4().hex[:8]
        self.made: list[DecisionLogLike] = []

    def url(self, name: str = "d") -> str:
        if self.server is None:
            return str(self.tmp / f"{name}.db")
        return f"{self.server}?prefix=test-{self.run}-{name}"

    def __call__(self, name: str = "d", *, store_prompts: bool = False) -> DecisionLogLike:
        log = decision_log_from_url(self.url(name), store_prompts=store_prompts)
        self.made.append(log)
        return log

    def stored_bytes(self, name: str) -> bytes:
        """Everything the log `name` keeps, as bytes (the files; the server's values)."""
        if self.server is None:
            return b"".join(f.read_bytes() for f in self.tmp.glob(f"{name}.db*"))
        import redis

        r = redis.Redis.from_url(self.server)
        values: list[bytes] = []
        for key in r.scan_iter(match=f"{{test-{self.run}-{name}}}*"):
            kind = r.type(key)
            if kind == b"hash":
                values += [x for pair in r.hgetall(key).items() for x in pair]
            elif kind == b"zset":
                values += r.zrange(key, 0, -1)
            else:
                values.append(r.get(key) or b"")
        r.close()
        assert values
        return b"".join(values)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Logs]:
    server = request.getfixturevalue("redis_url") if request.param == "redis" else None
    logs = Logs(request.param, tmp_path, server)
    yield logs
    for log in logs.made:
        log.close()


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


def test_prompt_text_is_stored_only_when_opted_in(make_log: Logs) -> None:
    feats = extract(SECRET).dense_dict()
    log = make_log("private")
    rid = log.record(route="local", engine="local", features=feats, score=0.3,
                     policy="chat", messages=SECRET)  # fmt: skip
    log.feedback(rid, good=True)
    (row,) = log.rows()
    assert row["prompt"] is None and row["features"] == feats
    assert log.training_examples() == []
    stored = make_log.stored_bytes("private")  # the database, its WAL and shared memory; keys
    assert b"local" in stored and b"hunter2" not in stored

    log = make_log("opted", store_prompts=True)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": SECRET}]
    rid = log.record(route="local", engine="local", features=feats, messages=msgs)
    log.feedback(rid, good=False)
    (ex,) = log.training_examples()
    assert ex.prompt == msgs and ex.local_correct is False and ex.source == "log"
    assert b"hunter2" in make_log.stored_bytes("opted")


def test_outcome_feedback_and_scores(make_log: Logs) -> None:
    with make_log() as log:
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


def _write_many(url: str, tag: str, n: int) -> None:
    with decision_log_from_url(url) as log:
        for i in range(n):
            rid = log.record(route="local", features={"i": float(i)}, request_id=f"{tag}-{i}")
            log.feedback(rid, good=i % 2 == 0)


def test_concurrent_writers_threads_and_processes(make_log: Logs) -> None:
    path = make_log.url("shared")
    make_log("shared").close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(path, f"p{k}", 40)) for k in range(2)]
    for p in procs:
        p.start()
    with make_log("shared") as shared:

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
    with make_log("shared") as log:
        rows = log.rows()
    assert len(rows) == 5 * 40 and len({r["request_id"] for r in rows}) == 200
    assert sum(r["feedback"] is not None for r in rows) == 80  # the processes' verdicts
    assert len({r["id"] for r in rows}) == 200


def test_train_from_log_end_to_end(
    make_log: Logs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = write_fixture(tmp_path / "labels.jsonl")
    db = make_log.url("decisions")
    with make_log("decisions", store_prompts=True) as log:
        for i in range(12):
            prompt = f"Translate to French: the {i} red cars"
            rid = log.record(route="local", engine="local", features=extract(prompt).dense_dict(),
                             messages=[{"role": "user", "content": prompt}])  # fmt: skip
            log.feedback(rid, good=False)
        log.record(route="local", engine="local", features={}, messages="no feedback given")
        rid = log.record(route="cloud", engine="cloud", features={}, messages="cloud answered")
        log.feedback(rid, good=True)
    with make_log("private") as log:  # no prompts: nothing to learn from
        log.feedback(log.record(route="local", engine="local", features={}), good=False)

    out = tmp_path / "router"
    assert main(["router", "train", "--data", str(labels), "--out", str(out),
                 "--from-log", db]) == 0  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["from_log"]["rows"] == 12
    assert manifest["data"]["rows"] == 240
    router = Router.load(out)
    assert router.score("Translate to French: the 99 red cars") > router.score(
        "Is a cat bigger than a castle? Answer yes or no."
    )
    if make_log.kind != "sqlite":
        return  # what follows reads the trained router, not the log: once is enough

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


def test_recalibrate_from_log_end_to_end(make_log: Logs, tmp_path: Path) -> None:
    labels = write_fixture(tmp_path / "labels.jsonl")
    base = tmp_path / "router"
    assert main(["router", "train", "--data", str(labels), "--out", str(base)]) == 0
    router = Router.load(base)
    db = make_log.url()
    with make_log() as log:  # the user's traffic: yes/no questions, which score low
        for i in range(40):
            prompt = f"Is a cat number {i} bigger than a castle? Answer yes or no."
            log.record(route="local", features={}, score=router.score(prompt), policy="chat")
    out = tmp_path / "mine"
    assert main(["router", "recalibrate", "--from-log", db, "--router", str(base),
                 "--out", str(out)]) == 0  # fmt: skip
    mine = Router.load(out)
    assert mine.calibration.source == "traffic n=40"
    assert mine.threshold(cloud_share=0.5) < router.threshold(cloud_share=0.5)
    assert mine.score("Calculate 3 * 4?") == router.score("Calculate 3 * 4?")


def test_outcome_keeps_the_trace_signals_and_cascade(make_log: Logs) -> None:
    trace = {"tpot_ms": 12.5, "itl_p99_ms": 30.0, "total_ms": 400.0, "content": {"a": SECRET}}
    cascade = {"signals": {"margin": 0.25, "entropy": float("nan")}, "judge": "answer",
               "answer_signals": {"margin": 0.5}}  # fmt: skip
    with make_log(store_prompts=True) as log:
        rid = log.record(route="local", engine="local", features={}, messages="q", at=5.0)
        log.outcome(rid, ttft_ms=80.0, cascade=cascade, trace=trace)
        log.outcome(rid, ttft_ms=90.0)  # a later outcome keeps the engine, sets TTFT again
        log.feedback(rid, good=True)
        (row,) = log.rows()
        assert row["engine"] == "local" and row["ttft_ms"] == 90.0 and row["error_kind"] is None
        assert row["tpot_ms"] == 12.5 and row["total_ms"] == 400.0
        assert json.loads(row["trace"])["content"] == {"a": SECRET}  # prompts opted in
        assert json.loads(row["cascade"]) == {"judge": "answer", "answer_signals": {"margin": 0.5}}
        (signals,) = log.training_signals().values()
        assert signals["margin"] == 0.25 and signals["entropy"] != signals["entropy"]  # NaN
        assert log.training_whole() == {f"log/{rid}": {"margin": 0.5}}
    with make_log("private") as log:  # without prompts, the captured text is dropped
        rid = log.record(route="local", features={})
        log.outcome(rid, trace=trace, error_kind="CloudTimeoutError", engine="cloud")
        (row,) = log.rows()
        assert "content" not in json.loads(row["trace"]) and row["engine"] == "cloud"
        assert row["prompt"] is None and row["error_kind"] == "CloudTimeoutError"


def test_rows_in_the_order_logged_and_since(make_log: Logs) -> None:
    with make_log() as log:
        for rid, at in (("b", 300.0), ("a", 100.0), ("c", 200.0), ("d", 200.0)):
            log.record(route="local", features={"at": at}, request_id=rid, at=at)
        assert [r["request_id"] for r in log.rows()] == ["b", "a", "c", "d"]
        assert [r["request_id"] for r in log.rows(since=200.0)] == ["b", "c", "d"]
        assert log.rows(since=301.0) == []
        assert log.rows()[1]["features"] == {"at": 100.0}


def test_decision_log_urls(tmp_path: Path, redis_url: str) -> None:
    sqlite = decision_log_from_url(f"sqlite://{tmp_path}/a.db")
    assert isinstance(sqlite, DecisionLog) and sqlite.path == tmp_path / "a.db"
    sqlite.close()
    shared = decision_log_from_url(f"{redis_url}?prefix=urls", store_prompts=True)
    assert isinstance(shared, RedisDecisionLog) and shared.prefix == "urls"
    assert shared.store_prompts and isinstance(shared, DecisionLogLike)
    shared.close()
    for bad in ("", "ftp://x/y", "sqlite://", f"{redis_url}?prefix=a{{b"):
        with pytest.raises(InvalidArgumentError, match="^--decision-log must be"):
            decision_log_from_url(bad, argument="--decision-log")
    with pytest.raises(InvalidArgumentError, match="^decision_log must be.*reachable"):
        decision_log_from_url("redis://:secret@127.0.0.1:1/0")  # nothing listens there
    with pytest.raises(InvalidArgumentError, match="^decision_log must be"):
        HybridClient(local=ScriptedEngine("local"), router=None, decision_log=3)  # type: ignore[arg-type]


class FailingLog(DecisionLog):
    """The SQLite log with a store that fails on every write (a full disk, a lost server)."""

    def record(self, **kw: object) -> str:  # type: ignore[override]
        raise sqlite3.OperationalError("disk I/O error")


@pytest.mark.anyio
async def test_a_failing_log_costs_its_row_not_the_answer_nor_the_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The row is written after the answer, in the client's own task group: a store that
    fails there must not end the client (and every other request with it)."""
    local = ScriptedEngine("local", tokens=["a", "b"])
    dlog = FailingLog(tmp_path / "d.db")
    async with HybridClient(local=local, router=None, decision_log=dlog) as client:
        first = await client.complete("one")
        second = await client.complete("two")  # the client still serves
        for _ in range(1000):  # the rows are written after the answers: wait for both losses
            if len([r for r in caplog.records if "decision log lost" in r.getMessage()]) >= 2:
                break
            await anyio.sleep(0.01)
        with pytest.raises(DecisionLogError):  # feedback on a row that was never written
            client.feedback(first.trace, good=True)
    assert first.text == second.text == "ab"
    lost = [r for r in caplog.records if "decision log lost" in r.getMessage()]
    assert len(lost) == 2 and "OperationalError" in lost[0].getMessage()
