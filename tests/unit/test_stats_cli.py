"""`hybridllm stats`: the decision log's percentiles and counts over a time span, computed as
`HybridClient.stats()` computes them (the requests are played by `ScriptedEngine` doubles,
scripted test engines, on the virtual clock, or written into a log by hand)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.cli.main import main
from hybridllm.cli.stats import since_seconds, table_rows
from hybridllm.cli.stats_log import aggregate, read_log
from hybridllm.errors import CloudConnectionError, DecisionLogError
from hybridllm.routing.log import MIGRATIONS, DecisionLog
from hybridllm.runtime.recorder import Recorder
from hybridllm.runtime.trace import FallbackRecord, Trace
from hybridllm.sqlite_migrations import migrate
from hybridllm.telemetry.logged import samples_from_dict
from hybridllm.telemetry.stats import Stats, request_samples
from hybridllm.testing import ScriptedEngine

PNG = b"\x89PNG\r\n\x1a\n"


def _trace(ttft_s: float, gaps_s: list[float], engine: str, policy: str) -> Trace:
    tr = Recorder(Trace(t_start=0.0, policy=policy, engine=engine, started=(engine,)))
    t = ttft_s
    tr.token(t, engine, delivered=t + 0.001)
    for g in gaps_s:
        t += g
        tr.token(t, engine, delivered=t + 0.002)
    tr.done("stop", t + 0.01)
    return tr.freeze()


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested report as {"a.b.c": value}, for comparing floats with `pytest.approx`."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _agree(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Two reports agree: the same groups and counts, figures within the sketch's 2 x 0.5%
    (a value on a bin's edge can fall either side after float rounding)."""
    a, b = _flat(got), _flat(want)
    assert a.keys() == b.keys()
    for key, value in b.items():
        if isinstance(value, float) and a[key] is not None:
            assert a[key] == pytest.approx(value, rel=0.011, abs=1e-9), key
        else:
            assert a[key] == value, key


def _log(path: Path, rows: list[tuple[float, Trace]]) -> None:
    with DecisionLog(path) as log:
        for at, tr in rows:
            rid = log.record(
                route=tr.engine or "none",
                features={},
                policy=tr.policy,
                engine=tr.engine,
                at=at,
                request_id=tr.request_id,
            )
            log.outcome(rid, engine=tr.engine, ttft_ms=tr.ttft_ms, trace=tr.to_dict())


def test_since_takes_minutes_hours_days_and_weeks() -> None:
    assert since_seconds("1h") == 3600 and since_seconds("7d") == 7 * 86400
    assert since_seconds("30m") == 1800 and since_seconds("2w") == 14 * 86400
    for bad in ("1y", "h", "0h", "-1d", "1.5h"):
        with pytest.raises(Exception, match="a count >= 1 and a unit"):
            since_seconds(bad)


def test_the_span_picks_the_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, now = tmp_path / "d.db", time.time()
    _log(
        path,
        [
            (now - 1800, _trace(0.1, [0.02], "local", "voice")),
            (now - 7200, _trace(0.5, [0.05], "cloud", "chat")),
            (now - 3 * 86400, _trace(0.3, [0.04], "cloud", "chat")),
        ],
    )
    counts = {}
    for span in ("1h", "1d", "7d"):
        assert main(["stats", "--log", str(path), "--since", span, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        counts[span] = report["overall"]["counts"]["requests"]
        assert report["window_s"] == since_seconds(span)
    assert counts == {"1h": 1, "1d": 2, "7d": 3}
    assert main(["stats", "--log", str(path), "--since", "7d"]) == 0
    table = capsys.readouterr().out
    assert "3 requests in the last 7d" in table and "policy chat" in table
    assert "engine local" in table and "TTFT P99" in table


def test_a_logged_trace_gives_the_samples_the_client_aggregates() -> None:
    tr = _trace(0.2, [0.03, 0.05, 0.02], "local", "voice")
    tr = dataclasses.replace(
        tr,
        spans=(*tr.spans, type(tr.spans[0])("cloud", 2)),  # the cloud wrote the last two tokens
        started=(*tr.started, "cloud"),
        fallbacks=(FallbackRecord(tr.t_start + 0.1, "local", "cloud", "failed", "stalled"),),
    )
    direct, logged = Stats(clock=lambda: 0.0), Stats(clock=lambda: 0.0)
    direct.add(request_samples(tr))
    logged.add(samples_from_dict(json.loads(tr.to_json())))
    _agree(logged.report().to_dict(), direct.report().to_dict())
    assert samples_from_dict(tr.to_dict())[-1][0] == [("engine", "local")]


@pytest.mark.anyio
@pytest.mark.virtual_clock
async def test_stats_of_the_log_agree_with_client_stats(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    pol = Policy(name="f", routing={"prefer": "cloud", "objective": "latency", "retries": 0})
    cloud = ScriptedEngine("cloud", script=[0.1, "a", 0.02, "b", CloudConnectionError("x")])
    local = ScriptedEngine("local", tokens=["c", "d", "e"], ttft_s=0.05, tpot_s=0.01)
    async with HybridClient(
        local=local, cloud=cloud, router=None, policy=pol, decision_log=path
    ) as client:
        for engine in (None, "local", "local"):
            _ = [t async for t in client.stream("hi", engine=engine)]
        expected = client.stats().to_dict()
    got = aggregate(read_log(path, 3600.0), expected["window_s"]).to_dict()
    assert got["overall"]["counts"]["requests"] == 3
    assert got["overall"]["counts"]["fallbacks"] == 1
    _agree(got, expected)


def test_an_old_log_still_opens_and_counts_its_ttft(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, MIGRATIONS[:3])  # a log written before it kept traces
    conn.execute(
        "INSERT INTO decisions (request_id, time, policy, features, route, engine, "
        "ttft_ms, fallback) VALUES ('r1', ?, 'chat', '{}', 'local', 'local', 250.0, 1)",
        (time.time(),),
    )
    conn.close()
    report = aggregate(read_log(path, 3600.0), 3600.0)
    assert report.overall.counts.requests == 1 and report.overall.counts.fallbacks == 1
    assert report.engines["local"].ttft_ms.p50 == pytest.approx(250.0, rel=0.01)
    assert report.overall.tpot_ms.count == 0
    assert table_rows(report)[0][:3] == ("all", "1", "0")
    with DecisionLog(path) as log:
        assert log.schema_version == len(MIGRATIONS)


def test_captured_text_stays_out_of_a_log_without_prompts(tmp_path: Path) -> None:
    tr = _trace(0.1, [0.01], "local", "chat")
    content = {"messages": [{"role": "user", "content": "secret"}], "answer": "x"}
    tr = dataclasses.replace(tr, content=content)
    with DecisionLog(tmp_path / "d.db") as log:
        rid = log.record(route="local", features={}, request_id=tr.request_id)
        log.outcome(rid, trace=tr.to_dict())
        row = log.rows()[0]
    assert "secret" not in row["trace"] and row["tpot_ms"] == pytest.approx(tr.tpot_ms)
    assert row["itl_p99_ms"] == pytest.approx(tr.itl_p99_ms)


def test_the_plot_is_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, now = tmp_path / "d.db", time.time()
    _log(
        path,
        [
            (now - 60 * i, _trace(0.1 + 0.01 * i, [0.02], "local" if i % 2 else "cloud", "chat"))
            for i in range(30)
        ],
    )
    plot = tmp_path / "out" / "ttft.png"
    assert main(["stats", "--log", str(path), "--since", "1h", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == PNG
    assert f"wrote {plot}" in capsys.readouterr().err


def test_bad_arguments_are_clean_cli_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.db"
    assert main(["stats", "--log", str(missing)]) == 2
    assert f"no decision log at {missing}" in capsys.readouterr().err
    assert not missing.exists()  # not created by looking
    with pytest.raises(DecisionLogError):
        read_log(missing, 60.0)
    with pytest.raises(SystemExit) as exit_:
        main(["stats", "--log", str(missing), "--since", "1 year"])
    assert exit_.value.code == 2 and "a count >= 1 and a unit" in capsys.readouterr().err
