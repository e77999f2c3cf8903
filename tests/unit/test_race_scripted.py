"""The first-token deadline race, with `ScriptedEngine` doubles (timing logic only), on the
virtual clock (tests/unit/conftest.py): the trace's times are the scripts' own, exactly."""

from __future__ import annotations

import math
from functools import partial

import anyio
import pytest

from hybridllm import Fallback, Hedge, HybridClient, Policy, Route, Token
from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import (
    AllEnginesFailedError,
    AuthenticationError,
    CloudConnectionError,
    LocalEngineError,
    RateLimitError,
)
from hybridllm.events import Done
from hybridllm.runtime.plans import race, single
from hybridllm.runtime.stream import RequestRun, Stream, StreamItem
from hybridllm.runtime.trace import Trace
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

DEADLINE = Policy(name="fast", routing={"prefer": "local", "ttft_deadline_ms": 100})


def engines(local_script: list[object], cloud_script: list[object]) -> tuple[ScriptedEngine, ...]:
    return (
        ScriptedEngine("local", script=local_script),  # type: ignore[arg-type]
        ScriptedEngine("cloud", script=cloud_script),
    )  # type: ignore[arg-type]


async def test_primary_in_time_never_starts_the_fallback() -> None:
    local, cloud = engines([0.02, "hi", 0.01, "!"], [0.0, "cloud"])
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        async with client.stream("q") as s:
            events = [e async for e in s.events()]
    assert "".join(e.text for e in events if isinstance(e, Token)) == "hi!"
    assert not cloud.requests and s.trace.engine == "local"
    assert not any(isinstance(e, Fallback) for e in events)


async def test_slow_primary_loses_to_the_fallback_after_the_deadline() -> None:
    local, cloud = engines([1.0, "late"], [0.05, "cl", 0.01, "oud"])
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        async with client.stream("q") as s:
            events = [e async for e in s.events()]
        await anyio.sleep(0.01)
        assert local.active == 0 and local.closed_streams == 1 and local.emitted == 0
    tokens = [e for e in events if isinstance(e, Token)]
    assert [t.text for t in tokens] == ["cl", "oud"] and {t.engine for t in tokens} == {"cloud"}
    assert isinstance(events[0], Route) and events[0].engine == "local"
    fb = [e for e in events if isinstance(e, Fallback)]
    assert len(fb) == 1 and fb[0].to_engine == "cloud"  # at the 100 ms deadline: see below
    assert type(fb[0]) is Fallback and fb[0].cause == "deadline"
    tr = s.trace
    assert tr.engine == "cloud" and tr.fallback_reason and tr.fallback_cause == "deadline"
    assert tr.segments_ms["fallback_started"] == pytest.approx(100)  # at the deadline
    assert tr.ttft_ms == pytest.approx(100 + 50)


async def test_primary_still_wins_if_it_answers_first_after_the_deadline() -> None:
    local, cloud = engines([0.15, "local"], [0.5, "cloud"])
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        res = await client.complete("q")
        await anyio.sleep(0.01)
        assert cloud.requests and cloud.active == 0 and cloud.emitted == 0
    assert res.text == "local" and res.trace.engine == "local"


async def test_primary_failure_before_first_token_starts_fallback_at_once() -> None:
    boom = LocalEngineError("decode failed", engine="local")
    local, cloud = engines([0.01, boom], [0.01, "saved"])
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        res = await client.complete("q")
    assert res.text == "saved"
    assert res.trace.segments_ms["fallback_started"] == pytest.approx(10)  # not at 100 ms
    assert res.trace.fallback_cause == "failed"  # the primary failed before its first token
    first = res.trace.attempts[0]
    assert (first.engine, first.outcome, first.error_type) == ("local", "failed", LocalEngineError)


async def test_both_failing_raises_a_typed_error() -> None:
    local, cloud = engines(
        [0.01, LocalEngineError("x", engine="local")], [CloudConnectionError("refused")]
    )
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        with pytest.raises(AllEnginesFailedError) as info:
            await client.complete("q")
    assert [a[0] for a in info.value.attempts] == ["local", "cloud"]
    assert isinstance(info.value.attempts[1][1], CloudConnectionError)
    assert "local at" in str(info.value) and "refused" in str(info.value)


async def test_empty_deltas_do_not_win_the_race() -> None:
    local, cloud = engines([0.2, "real"], [0.12, "", 0.3, "late"])
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        res = await client.complete("q")
    assert res.text == "real" and res.trace.engine == "local"


async def test_forced_engine_and_private_policy_do_not_race() -> None:
    local, cloud = engines([0.3, "slow"], [0.0, "cloud"])
    private = Policy(
        name="p", routing={"prefer": "local", "allow_cloud": False, "ttft_deadline_ms": 50}
    )
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        assert (await client.complete("q", engine="local")).text == "slow"
        assert (await client.complete("q", policy=private)).text == "slow"
    assert not cloud.requests


async def test_predicted_miss_starts_the_fallback_without_waiting() -> None:
    local, cloud = engines([0.5, "slow"], [0.02, "fast"])
    local.predicted_ttft_s = 0.5  # e.g. a long local queue or a prompt too long to prefill
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        res = await client.complete("q")
    assert res.text == "fast" and res.trace.engine == "cloud"
    assert res.trace.segments_ms["fallback_started"] == pytest.approx(0)
    assert res.trace.decision is not None and res.trace.decision.load == "parallel_start"
    assert res.trace.predicted_ttft_ms["local"] == pytest.approx(500)
    assert res.trace.decision.deadline_s == pytest.approx(0.1)  # predicted past the deadline
    assert res.trace.parallel_engine == "cloud" and res.trace.fallback_cause == "parallel"


async def test_fixed_hedge_starts_the_backup_before_the_deadline() -> None:
    local, cloud = engines([0.3, "slow"], [0.02, "hedged"])
    policy = Policy(
        name="h", routing={"prefer": "local", "ttft_deadline_ms": 1000}, hedge={"after_ms": 50}
    )
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        res = await client.complete("q")
    tr = res.trace
    assert res.text == "hedged" and tr.hedged and tr.started == ("local", "cloud")
    assert tr.segments_ms["fallback_started"] == pytest.approx(50)
    assert tr.fallback_cause == "hedge"


async def test_auto_hedge_prices_the_primary_tail() -> None:
    """Scripted timing: a local primary with a heavy tail (one request in four takes 0.6 s) and
    a fast cloud hedge priced at 1 s of p99 per request: the automatic hedge starts the cloud
    early, just past the primary's body; against a tight history it does not pay."""
    local, cloud = engines([0.03, "ok"], [0.0, "cloud"])
    cloud.predicted_ttft_s = 0.01
    policy = Policy(name="h", routing={"prefer": "local"}, hedge={"after_ms": "auto"})
    async with HybridClient(local=local, cloud=cloud, policy=policy, router=None) as client:
        for _ in range(6):  # a tight history: hedging cannot beat it
            await client.complete("q")
        tight = await client.complete("q")
        assert not tight.trace.hedged and "auto_hedge_none" in tight.trace.reason_codes
        for _ in range(2):  # now a heavy tail
            local.script = [0.6, "slow"]
            await client.complete("q", engine="local")
        local.script = [0.5, "stuck"]
        res = await client.complete("q")
    assert res.text == "cloud" and res.trace.hedged
    assert res.trace.segments_ms["fallback_started"] < 150  # long before the stuck 500 ms


class FlakyEngine(ScriptedEngine):
    """A scripted double whose first `failures` requests fail with the given error."""

    def __init__(self, failures: int, error: Exception, **kw: object) -> None:
        super().__init__("cloud", **kw)  # type: ignore[arg-type]
        self.failures = failures
        self.error = error
        self.plays = list(self.script)

    def stream(self, request):  # type: ignore[no-untyped-def]
        self.script = [self.error] if len(self.requests) < self.failures else self.plays
        return super().stream(request)


async def test_retryable_failures_are_retried_before_the_first_token() -> None:
    cloud = FlakyEngine(2, CloudConnectionError("refused"), tokens=["ok"])
    async with HybridClient(cloud=cloud) as client:
        res = await client.complete("q")
    assert res.text == "ok" and res.trace.retries == 2 and len(cloud.requests) == 3


async def test_retry_after_is_honoured() -> None:
    limited = RateLimitError("slow down", status_code=429, retry_after=0.2)
    cloud = FlakyEngine(1, limited, tokens=["ok"])
    async with HybridClient(cloud=cloud) as client:
        res = await client.complete("q")
    assert res.text == "ok" and res.trace.ttft_ms == pytest.approx(200)


async def test_no_retry_past_the_deadline_or_for_bad_requests() -> None:
    limited = RateLimitError("slow down", status_code=429, retry_after=5.0)
    cloud = FlakyEngine(1, limited, tokens=["ok"])
    policy = Policy(name="d", routing={"prefer": "cloud", "ttft_deadline_ms": 500})
    async with HybridClient(cloud=cloud, policy=policy) as client:
        with pytest.raises(RateLimitError):
            await client.complete("q")
    assert len(cloud.requests) == 1
    bad = FlakyEngine(1, AuthenticationError("bad key", status_code=401), tokens=["ok"])
    async with HybridClient(cloud=bad) as client:
        with pytest.raises(AuthenticationError):
            await client.complete("q")
    assert len(bad.requests) == 1


async def test_hedge_events_are_hedges() -> None:
    local, cloud = engines([0.3, "slow"], [0.0, "fast"])
    policy = Policy(name="h", routing={"prefer": "local"}, hedge={"after_ms": 20})
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        async with client.stream("q") as s:
            events = [e async for e in s.events()]
    hedges = [e for e in events if isinstance(e, Hedge)]
    assert len(hedges) == 1 and hedges[0].cause == "hedge"


async def test_a_primary_that_keeps_missing_the_deadline_is_skipped() -> None:
    cloud = ScriptedEngine("cloud", script=[5.0, "late"])
    local = ScriptedEngine("local", tokens=["local"])
    routing = {"prefer": "cloud", "ttft_deadline_ms": 50, "objective": "latency"}
    policy = Policy(name="d", routing=routing)
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        for _ in range(5):  # judged over 5 outcomes (issue 25)
            res = await client.complete("q")
            assert res.text == "local" and res.trace.ttft_ms == pytest.approx(50)
        res = await client.complete("q")  # circuit open: local at once
    assert res.text == "local" and "cloud_circuit_open" in res.trace.reason_codes
    assert res.trace.ttft_ms == pytest.approx(0)
    assert len(cloud.requests) == 5


async def test_a_slow_circuit_still_sends_quality_decisions_to_the_cloud_with_a_rescue() -> None:
    """Issue 25: a cloud chosen for quality, opened for slowness, still gets the request; the
    local rescue answers at the deadline, and once the cloud is quick again it answers."""
    cloud = ScriptedEngine("cloud", script=[5.0, "late"])
    local = ScriptedEngine("local", tokens=["local"])
    policy = Policy(name="q", routing={"prefer": "cloud", "ttft_deadline_ms": 50})
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        for _ in range(6):
            res = await client.complete("q")
            assert res.text == "local" and res.trace.ttft_ms == pytest.approx(50)
        assert client.breakers["cloud"].slow
        assert "cloud_circuit_slow_quality" in res.trace.reason_codes
        cloud.script = [0.01, "quick"]
        res = await client.complete("q")
    assert res.text == "quick" and client.breakers["cloud"].state == "closed"
    assert len(cloud.requests) == 7


async def test_cancelling_during_a_race_stops_both_engines() -> None:
    local, cloud = engines([0.2] + ["x", 0.01] * 50, [0.3, "y"])
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        with anyio.move_on_after(0.15):  # both are running: the deadline has passed
            async for _ in client.stream("q"):
                pass
        await anyio.sleep(0.01)
        assert local.active == 0 and cloud.active == 0
        assert len(local.requests) == 1 and len(cloud.requests) == 1


async def test_fallback_starts_ahead_of_the_deadline_by_its_predicted_ttft() -> None:
    """A cloud primary stuck past a 300 ms deadline; the local fallback predicts 100 ms to its
    first token, so it starts at 200 ms and its token lands inside the deadline."""
    policy = Policy(name="lead", routing={"prefer": "cloud", "ttft_deadline_ms": 300})
    local = ScriptedEngine("local", script=[0.1, "here"])
    cloud = ScriptedEngine("cloud", script=[2.0, "late"])
    local.predicted_ttft_s = 0.1
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        res = await client.complete("q")
    tr = res.trace
    assert res.text == "here" and tr.engine == "local"
    assert tr.segments_ms["fallback_started"] == pytest.approx(300 - 100)
    assert tr.ttft_ms == pytest.approx(300)
    assert tr.fallback_cause == "deadline"  # started ahead of it: `fallback_started` above


async def test_fallback_lead_is_at_most_half_the_deadline() -> None:
    """A competing fallback (a latency decision); a quality decision's rescue that cannot be
    ready by the deadline starts at once (`test_quality_race`)."""
    routing = {"prefer": "cloud", "ttft_deadline_ms": 200, "objective": "latency"}
    policy = Policy(name="lead", routing=routing)
    local = ScriptedEngine("local", script=[0.01, "here"])
    cloud = ScriptedEngine("cloud", script=[2.0, "late"])
    local.predicted_ttft_s = 5.0  # a long prompt: the local engine cannot make it anyway
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        res = await client.complete("q")
    assert res.trace.segments_ms["fallback_started"] == pytest.approx(200 / 2)


async def test_an_empty_answer_that_finishes_first_wins() -> None:
    local, cloud = engines([1.0, "late"], [0.01])  # the cloud finishes without a token
    async with HybridClient(local=local, cloud=cloud, policy=DEADLINE) as client:
        res = await client.complete("q")
        await anyio.sleep(0.01)
        assert local.active == 0
    assert res.text == "" and res.trace.engine == "cloud" and res.trace.finish_reason == "stop"


async def test_the_plans_run_on_a_request_run_without_a_client() -> None:
    """`single` and `race` are plain async functions of a `RequestRun`: the client only picks
    one and hands it over."""
    req = GenerationRequest([{"role": "user", "content": "q"}])
    alone = ScriptedEngine("local", script=[0.0, "on", 0.0, "ly"])
    slow, fast = engines([0.5, "late"], [0.0, "fast"])
    plans = {
        "only": partial(single, engine=alone, request=req, reason="only one"),
        "fast": partial(
            race, primary=slow, fallback=fast, request=req, deadline_s=0.05, reason="quick"
        ),
    }
    for want, plan in plans.items():
        send, recv = anyio.create_memory_object_stream[StreamItem](math.inf)
        run = RequestRun(Trace(), send)
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.run, plan)
            async with Stream(run, recv) as s:
                events = [e async for e in s.events()]
        assert "".join(e.text for e in events if isinstance(e, Token)) == want
        assert isinstance(events[0], Route) and isinstance(events[-1], Done)
        assert s.trace.error is None and s.trace.finish_reason == "stop"
    assert slow.active == 0 and slow.emitted == 0


async def test_a_timer_posted_just_before_the_crown_starts_nothing() -> None:
    """The timer task only posts; the coordinator ignores a firing that arrives once an engine
    has won (the crown cancelled the timer, but the item was already on its way)."""
    from hybridllm.runtime.plans.race import _Race, _TimerFired

    local, cloud = engines([0.0, "a"], [0.0, "b"])
    send, _recv = anyio.create_memory_object_stream[StreamItem](math.inf)
    run = RequestRun(Trace(), send)
    req = GenerationRequest([{"role": "user", "content": "q"}])
    async with anyio.create_task_group() as tg:
        r = _Race(run, local, cloud, req, tg, deadline_s=0.1, stall_s=None)
        r.crown(r.start(local, req))
        r._on_timer(_TimerFired("no token from local within 100 ms", "deadline"))
        assert not r.deadline_fired and run.trace.fallback_reason is None
        tg.cancel_scope.cancel()
    assert list(run.trace.started) == ["local"] and not cloud.requests
