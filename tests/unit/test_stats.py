"""Unit tests of the rolling aggregates (`telemetry.stats`, `HybridClient.stats()`).

Traces are built by hand or played by `ScriptedEngine` doubles (scripted test engines) on the
virtual clock."""

from __future__ import annotations

import math
import random

import pytest

from hybridllm import HybridClient, Policy, Telemetry
from hybridllm.errors import CloudConnectionError, InvalidArgumentError
from hybridllm.runtime.recorder import Recorder
from hybridllm.runtime.trace import Trace
from hybridllm.telemetry.stats import Stats
from hybridllm.testing import ScriptedEngine


def _trace(ttft_s: float, gaps_s: list[float], engine: str = "local", policy: str = "p") -> Trace:
    tr = Recorder(Trace(t_start=0.0, policy=policy, engine=engine))
    t = ttft_s
    tr.token(t, engine)
    for g in gaps_s:
        t += g
        tr.token(t, engine)
    return tr.freeze()


def _exact(values: list[float], q: float) -> float:
    """The value at rank q * (n - 1), rounded down (DDSketch's rank rule)."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


def test_p99_is_within_one_percent_of_the_exact_one_over_10000_samples() -> None:
    rng = random.Random(7)
    stats = Stats(window_s=60.0, clock=lambda: 0.0)
    ttfts = [rng.lognormvariate(math.log(0.3), 0.6) for _ in range(10_000)]  # a heavy tail
    for ttft in ttfts:
        stats.record(_trace(ttft, []))
    got = stats.report().overall.ttft_ms
    assert got.count == 10_000
    for q, value in ((0.5, got.p50), (0.95, got.p95), (0.99, got.p99)):
        exact = _exact([x * 1000.0 for x in ttfts], q)
        assert value is not None and abs(value - exact) / exact <= 0.01


def test_groups_counts_and_itl_per_engine() -> None:
    stats = Stats(clock=lambda: 0.0)
    stats.record(_trace(0.1, [0.02, 0.02], "local", "voice"))
    stats.record(_trace(0.5, [0.05], "cloud", "chat"))
    report = stats.report()
    assert report.overall.counts.requests == 2 and report.overall.counts.cloud_share == 0.5
    assert set(report.engines) == {"local", "cloud"} and set(report.policies) == {"voice", "chat"}
    assert report.engines["local"].itl_ms.count == 2
    assert report.engines["cloud"].ttft_ms.p50 == pytest.approx(500, rel=0.01)
    assert report.to_dict()["policies"]["voice"]["counts"]["requests"] == 1


def test_the_window_forgets_old_buckets() -> None:
    now = [0.0]
    stats = Stats(window_s=60.0, buckets=6, clock=lambda: now[0])
    stats.record(_trace(0.1, []))
    now[0] = 30.0
    stats.record(_trace(0.2, []))
    assert stats.report().overall.counts.requests == 2
    now[0] = 75.0  # the first bucket [0, 10) is out of the window; [30, 40) is in
    assert stats.report().overall.counts.requests == 1
    now[0] = 1000.0
    assert stats.report().overall.ttft_ms.count == 0


def test_bad_settings_get_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="window_s"):
        Telemetry(window_s=0)
    with pytest.raises(InvalidArgumentError, match="buckets"):
        Telemetry(buckets=0)
    with pytest.raises(InvalidArgumentError, match="otel"):
        Telemetry(otel="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="capture_content"):
        Telemetry(capture_content=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="telemetry"):
        HybridClient(local=ScriptedEngine("local"), telemetry="on")  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.virtual_clock
async def test_the_client_counts_fallbacks_failures_and_the_span_engines() -> None:
    pol = Policy(name="f", routing={"prefer": "cloud", "objective": "latency", "retries": 0})
    cloud = ScriptedEngine("cloud", script=[0.1, "a", 0.02, "b", CloudConnectionError("x")])
    local = ScriptedEngine("local", tokens=["c", "d"], ttft_s=0.05, tpot_s=0.01)
    async with HybridClient(local=local, cloud=cloud, router=None, policy=pol) as client:
        _ = [t async for t in client.stream("hi")]
        report = client.stats()
    assert report.overall.counts.requests == 1 and report.overall.counts.fallbacks == 1
    assert report.overall.counts.cloud_answers == 1
    assert report.engines["cloud"].ttft_ms.count == 1 and report.engines["local"].ttft_ms.count == 0
    assert report.engines["local"].itl_ms.count == 2  # the seam's gap goes with the local span
    assert report.policies["f"].itl_ms.count == 3
