"""One record per request (issue 41), with `ScriptedEngine` doubles on the virtual clock: every
plan reports to the request's recorder (`RequestRun.fell_back`, `RequestRun.switched`), so each
`Fallback` event the app sees has its typed trace record with the same cause; `stats()` counts
it; usage is summed over every attempt, per engine, and is at least what was delivered; and what
leaves a request is a `HybridError`, never an `ExceptionGroup`.

The matrix: every registered plan (single with a fallback, hedge, handoff, cascade, speculative,
and the toy plan tests/unit/toy_plan.py registers) times the faults a script can play on the
cloud (fails before its first token, fails mid-stream, stalls, refused by a guard, cancelled by
the app)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from hybridllm import HybridClient, Policy
from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import (
    CloudConnectionError,
    ContextOverflowError,
    HybridError,
    InternalError,
    PolicyError,
    PrivacyBlockedError,
)
from hybridllm.events import Chunk, Done, Event, Fallback, Finish, ParallelStart, Token, Usage
from hybridllm.gateway.app import create_app
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.policy import load_policy_file, plan_names
from hybridllm.runtime.trace import Trace
from hybridllm.telemetry.stats import request_samples
from hybridllm.testing import ScriptedEngine
from tests.unit import toy_plan  # noqa: F401  (registers "shout")
from tests.unit.test_cascade_scripted import FakeRouter, SignalScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

PLANS: dict[str, Policy] = {
    "single": Policy(name="rec-single", routing={"prefer": "cloud", "stall_ms": 200, "retries": 0}),
    "hedge": Policy(
        name="rec-hedge",
        routing={"prefer": "cloud", "stall_ms": 200, "retries": 0, "ttft_deadline_ms": 300},
        hedge={"after_ms": 5},
    ),
    "handoff": Policy(
        name="rec-handoff",
        routing={"prefer": "local", "stall_ms": 200, "retries": 0},
        handoff={"after_tokens": 2},
    ),
    # stage 1 unsure (the cloud starts at once, held), stage 2 sends the answer to the cloud
    "cascade": Policy(
        name="rec-cascade",
        plans=("single", "hedge", "cascade"),
        routing={"router_threshold": 0.5, "stall_ms": 200, "retries": 0},
    ),
    # scripted engines cannot draft or verify: the plan streams the cloud plainly
    "speculative": Policy(
        name="rec-speculative", routing={"prefer": "cloud", "stall_ms": 200, "retries": 0}
    ),
    "shout": Policy(name="rec-shout", routing={"prefer": "cloud", "stall_ms": 200, "retries": 0}),
}


def reset() -> CloudConnectionError:
    return CloudConnectionError("connection reset", received_content=True)


def refused() -> PrivacyBlockedError:
    return PrivacyBlockedError("personal data: the guard keeps it local", engine="cloud")


# the cloud's script for each fault (the local engine answers whole)
FAULTS: dict[str, list[Any]] = {
    "none": [0.01, "c1", 0.01, "c2", 0.01, "c3"],
    "fails-before-first-token": [0.01, CloudConnectionError("connection refused")],
    "fails-mid-stream": [0.01, "c1", 0.01, "c2", reset()],
    "stalls": [0.01, "c1", 5.0, "never"],
    "refused": [refused()],
    "cancelled-by-app": [0.01, "c1", 0.01, "c2", 0.01, "c3"],
}
LOCAL = ["l1", "l2", "l3", "l4"]


def engines(plan: str) -> tuple[ScriptedEngine, ScriptedEngine]:
    if plan == "cascade":  # a local engine that reads its own signals
        local: ScriptedEngine = SignalScriptedEngine(hold_s=0.05, tokens=LOCAL, tpot_s=0.01)
    else:
        local = ScriptedEngine("local", tokens=LOCAL, ttft_s=0.02, tpot_s=0.01)
    return local, ScriptedEngine("cloud", script=[])


def test_the_matrix_covers_every_registered_plan() -> None:
    assert set(PLANS) == set(plan_names())


async def play(plan: str, fault: str) -> tuple[list[Event], Any, BaseException | None, int]:
    local, cloud = engines(plan)
    cloud.script = list(FAULTS[fault])
    cloud.duration_s = sum(s for s in cloud.script if isinstance(s, float))
    events: list[Event] = []
    raised: BaseException | None = None
    router = FakeRouter(0.6, combined=0.9) if plan == "cascade" else None
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        kw: dict[str, Any] = {"policy": PLANS[plan]}
        if plan != "single":
            kw["plan"] = plan
        try:
            async with client.stream("write", **kw) as s:
                async for e in s.events():
                    events.append(e)
                    if fault == "cancelled-by-app" and isinstance(e, Token):
                        break
        except Exception as exc:  # what leaves the request, whatever it is
            raised = exc
        assert local.active == 0 and cloud.active == 0  # nothing left running
        fallbacks = client.stats().overall.counts.fallbacks
    return events, s.trace, raised, fallbacks


def same(a: Any, b: Any) -> bool:
    """Equal data, floats within a microsecond's rounding (ms -> s -> ms)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, abs=1e-6)
    return bool(a == b)


def produced(events: Sequence[Event]) -> int:
    return sum(1 for e in events if isinstance(e, Token))


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("plan", list(PLANS))
async def test_every_fallback_event_has_its_record_and_usage_adds_up(plan: str, fault: str) -> None:
    events, trace, raised, counted = await play(plan, fault)
    assert trace.plan == plan  # the plan of the cell ran
    # only typed errors leave a request
    assert raised is None or isinstance(raised, HybridError), repr(raised)
    # each Fallback (Hedge, ParallelStart) event is the trace's record, in order, same cause
    seen = [(e.from_engine, e.to_engine, e.cause) for e in events if isinstance(e, Fallback)]
    recorded = [(f.from_engine, f.to_engine, f.cause) for f in trace.fallbacks]
    assert seen == recorded
    assert trace.fallback_cause == (recorded[0][2] if recorded else None)
    # a mid-stream move is a switch and a fallback, from one call
    moved = [(s.from_engine, s.to_engine) for s in trace.switches]
    assert moved == [(f, t) for f, t, c in recorded if c == "mid_stream"]
    for _, to_engine, _ in recorded:
        assert to_engine in trace.started
    assert counted == int(bool(recorded))  # stats() counts what the trace holds
    # the trace is data: Trace.from_dict(to_dict()) gives the same data, and the same samples
    rebuilt = Trace.from_dict(trace.to_dict())
    assert same(rebuilt.to_dict(), trace.to_dict())
    assert request_samples(rebuilt) == request_samples(trace)
    done = [e for e in events if isinstance(e, Done)]
    if not done:
        return
    (usage,) = [e for e in events if isinstance(e, Usage)]
    by_engine = {u.engine: u for u in usage.by_engine}
    attempts: dict[str, int] = {}
    for a in trace.attempts:
        attempts[a.engine] = attempts.get(a.engine, 0) + a.tokens
    # the scripted engines report one token per text chunk: usage is every attempt's tokens
    assert {e: u.completion_tokens for e, u in by_engine.items()} == attempts
    assert usage.completion_tokens == trace.completion_tokens == sum(attempts.values())
    assert trace.completion_tokens >= trace.n_tokens == produced(events)
    delivered = {e: u.delivered_tokens for e, u in by_engine.items() if u.delivered_tokens}
    assert delivered == trace.delivered_by_engine()


async def test_usage_after_a_failover_counts_both_engines() -> None:
    """The issue's case: 2 cloud tokens, a reset, 2 local tokens: 4 delivered, 4 counted."""
    cloud = ScriptedEngine("cloud", script=["a", "b", reset()])
    local = ScriptedEngine("local", tokens=["c", "d"])
    pol = Policy(name="cloudy", routing={"prefer": "cloud", "retries": 0})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=pol) as client:
        async with client.stream("q") as s:
            events = [e async for e in s.events()]
    (usage,) = [e for e in events if isinstance(e, Usage)]
    assert s.trace.n_tokens == 4 and usage.completion_tokens == 4 == s.trace.completion_tokens
    assert {(u.engine, u.completion_tokens, u.delivered_tokens) for u in usage.by_engine} == {
        ("cloud", 2, 2),
        ("local", 2, 2),
    }
    exported = s.trace.to_dict()["usage"]["by_engine"]
    assert {row["engine"]: row["completion_tokens"] for row in exported} == {"cloud": 2, "local": 2}


async def test_a_cascade_style_fallback_before_the_first_token_is_counted() -> None:
    """A cloud that fails before its first token under a single plan with a fallback: the
    `Fallback` is recorded, typed, and `stats()` counts one fallback (it used to count 0 for the
    cascade's held cloud, whose event had no record)."""
    events, trace, raised, counted = await play("single", "fails-before-first-token")
    assert raised is None and counted == 1
    assert trace.fallback_cause == "failed" and trace.fell_back
    assert [f.cause for f in trace.fallbacks] == ["failed"]
    assert trace.to_dict()["fallbacks"][0]["cause"] == "failed"


VOICE_LOCAL_ONLY = Policy(
    name="local-only", routing={"prefer": "local", "allow_cloud": False, "ttft_deadline_ms": 400}
)


def overflow() -> ContextOverflowError:
    return ContextOverflowError(engine="local", prompt_tokens=40_000, max_tokens=256, n_ctx=4096)


@pytest.mark.parametrize("preset", ["chat", "voice-assistant", "local-only"])
async def test_a_context_overflow_leaves_as_itself_never_an_exception_group(preset: str) -> None:
    local = ScriptedEngine("local", script=[overflow()])
    policy: Policy | str = VOICE_LOCAL_ONLY if preset == "local-only" else preset
    async with HybridClient(local=local, router=None) as client:
        with pytest.raises(ContextOverflowError) as caught:
            async for _ in client.stream("a long prompt", policy=policy):
                pass
        with pytest.raises(ContextOverflowError):
            await client.complete("a long prompt", policy=policy)
    assert caught.value.n_ctx == 4096


class _Buggy(ScriptedEngine):
    """A double whose stream raises an error that is not hybridllm's (a bug somewhere below)."""

    def stream(self, request: Any) -> Any:
        raise KeyError("a bug")


async def test_an_error_that_is_not_ours_leaves_as_an_internal_error_with_its_cause() -> None:
    async with HybridClient(local=_Buggy("local"), router=None) as client:
        with pytest.raises(InternalError) as caught:
            await client.complete("q", policy=VOICE_LOCAL_ONLY)
    assert isinstance(caught.value.__cause__, KeyError)
    assert isinstance(caught.value, HybridError)


async def test_the_gateway_answers_an_overflow_as_400_context_length_exceeded() -> None:
    """A preset whose plan runs in a task group (the issue saw the gateway's plain 500)."""
    local = ScriptedEngine("local", script=[overflow()])
    hybrid = HybridClient(local=local, router=None)
    app = create_app(hybrid, GatewayLimits(max_body_bytes=4000), api_key="sk-gw")
    body = {"model": "hybridllm/voice-assistant", "messages": [{"role": "user", "content": "hi"}]}
    async with hybrid:
        transport = httpx.ASGITransport(app=app)
        auth = {"authorization": "Bearer sk-gw"}
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=auth) as h:
            whole = await h.post("/v1/chat/completions", json=body)
            streamed = await h.post("/v1/chat/completions", json={**body, "stream": True})
    assert whole.status_code == 400
    assert whole.json()["error"]["code"] == "context_length_exceeded"
    # streamed, the answer has begun (its Route came first): the error is the stream's last event
    errors_sent = [
        json.loads(line[len("data: ") :])
        for line in streamed.text.splitlines()
        if line.startswith("data: {") and '"error"' in line
    ]
    assert [e["error"]["code"] for e in errors_sent] == ["context_length_exceeded"]


async def test_the_breaker_runs_on_the_virtual_clock() -> None:
    from hybridllm.runtime.health import CircuitBreaker

    cb = CircuitBreaker(threshold=1, reset_after_s=30.0)
    cb.record(CloudConnectionError("refused"))
    assert cb.state == "open"
    await anyio.sleep(29.0)
    assert cb.state == "open"
    await anyio.sleep(1.5)  # virtual seconds: the test takes none
    assert cb.state == "half-open"


def test_a_row_logged_before_fallbacks_were_exported_still_counts_them() -> None:
    """A decision-log row written before `fallbacks` existed: its `fallback_reason` and its
    switches become records, so `hybridllm stats` counts the fallback as it did."""
    old = {
        "started": ["cloud", "local"],
        "engine": "local",
        "fallback_reason": "no token from cloud within 500 ms",
        "fallback_cause": "deadline",
        "switches": [],
        "spans": [{"engine": "local", "first_token": 0}],
        "token_ms": [600.0, 620.0],
    }
    rebuilt = Trace.from_dict(old)
    assert rebuilt.fell_back and rebuilt.fallback_cause == "deadline"
    assert rebuilt.ttft_ms == pytest.approx(600.0) and rebuilt.itl_ms == pytest.approx([20.0])
    switched = {**old, "fallback_reason": None, "switches": [
        {"at_ms": 10.0, "from": "cloud", "to": "local", "reason": "reset", "delivered_chars": 3}
    ]}  # fmt: skip
    assert [f.cause for f in Trace.from_dict(switched).fallbacks] == ["mid_stream"]


@pytest.mark.parametrize("router_score", [0.1, 0.9])
async def test_a_cascade_trace_round_trips_and_counts_its_held_tokens(router_score: float) -> None:
    """The cascade's record and the tokens its signals held (counted outside any engine
    stream, `RequestRun.counted`) survive `to_dict` / `from_dict`; the usage counts them."""
    from tests.unit.test_cascade_scripted import FakeRouter, SignalScriptedEngine, policy, run

    local = SignalScriptedEngine(hold_s=0.05, tokens=["lo", "!"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.01)
    router = FakeRouter(router_score)
    async with HybridClient(local=local, cloud=cloud, router=router) as client:  # type: ignore[arg-type]
        _, trace, _ = await run(client, policy())
    assert trace.cascade is not None
    rebuilt = Trace.from_dict(trace.to_dict())
    assert same(rebuilt.to_dict(), trace.to_dict()) and rebuilt.cascade == trace.cascade
    if trace.engine == "local":  # the held "Hel" (3 tokens by the double's count) and the rest
        assert [u.engine for u in trace.counted] == ["local"]
        assert trace.completion_tokens == trace.counted[0].completion_tokens + 2


async def test_a_plan_is_one_module_and_one_registration_line() -> None:
    """tests/unit/toy_plan.py registers "shout"; nothing else names it. A policy and a call may
    name it, `decide()` previews it, `stream()` runs it, and the trace, its export and
    `stats()` carry it; a name nobody registered is still a `PolicyError`."""
    import tests.unit.toy_plan  # noqa: F401  (the registration)
    from hybridllm.errors import PolicyError

    pol = Policy(name="loud", plans=("single", "shout"), plan="shout", routing={"prefer": "local"})
    local = ScriptedEngine("local", tokens=["hi", " there"])
    async with HybridClient(local=local, router=None, policy=pol) as client:
        preview = client.decide("q").decision
        async with client.stream("q") as s:
            text = "".join([e.text async for e in s.events() if isinstance(e, Token)])
        per_call = await client.complete("q", policy=Policy(name="quiet"), plan="shout")
        report = client.stats()
    assert preview.plan == "shout" and "registered_plan" in preview.codes
    assert text == "HI THERE" and per_call.text == "HI THERE"
    assert s.trace.plan == "shout" and s.trace.to_dict()["plan"] == "shout"
    assert Trace.from_dict(s.trace.to_dict()).plan == "shout"
    assert report.overall.counts.requests == 2
    with pytest.raises(PolicyError):
        Policy(name="x", plans=("single", "whisper"))


async def test_a_registered_plan_declares_its_own_policy_table(tmp_path: Path) -> None:
    """The toy plan's `[shout]` table: set in a policy file or in Python, merged by `with_`,
    read by the plan; a bad key is a `PolicyError` naming it (`shout.sufix`, with the closest
    name), and a table no registered plan declares is one too."""
    from tests.unit.toy_plan import ShoutTable

    path = tmp_path / "loud.toml"
    path.write_text('name = "loud"\nplans = ["single", "shout"]\n[shout]\nsuffix = "!"\n')
    loud = load_policy_file(path)
    assert loud.plan_table("shout") == ShoutTable(suffix="!")
    assert Policy(name="q").plan_table("shout") == ShoutTable()  # its defaults
    assert loud.with_(routing={"prefer": "local"}).plan_table("shout") == ShoutTable(suffix="!")
    assert loud.with_(shout={"suffix": "?"}).plan_table("shout") == ShoutTable(suffix="?")
    local = ScriptedEngine("local", tokens=["hi"])
    async with HybridClient(local=local, router=None) as client:
        answer = await client.complete("q", policy=loud, plan="shout")
    assert answer.text == "HI!" and answer.trace.plan == "shout"
    with pytest.raises(PolicyError) as caught:
        Policy(name="x", shout={"sufix": "!"})  # type: ignore[call-arg]
    assert caught.value.field == "shout.sufix" and caught.value.suggestion == "suffix"
    with pytest.raises(PolicyError) as unknown:
        Policy(name="x", plan_tables={"whisper": {}})
    assert unknown.value.field == "whisper"


async def test_the_trace_is_a_frozen_value_once_the_request_ends() -> None:
    """`s.trace` after the end is the recorder's frozen value: no field can be set, it has no
    `__dict__` (slotted), every sequence is a tuple, and it is the trace the `Done` carried."""
    events, trace, _, _ = await play("single", "fails-mid-stream")
    with pytest.raises(dataclasses.FrozenInstanceError):
        trace.engine = "cloud"
    assert not hasattr(trace, "__dict__")
    sequences = ("fallbacks", "started", "switches", "attempts", "spans", "token_times")
    assert all(isinstance(getattr(trace, name), tuple) for name in sequences)
    (done,) = [e for e in events if isinstance(e, Done)]
    assert done.trace == trace
    assert trace.parallel_engine is None and trace.fallback_cause == "mid_stream"
    assert Trace.from_dict(trace.to_dict()).started == trace.started


async def test_a_parallel_start_is_a_fallback_record_and_its_event() -> None:
    """`parallel_start` / `parallel_engine` are read from the fallback record whose cause is
    "parallel" (no field repeats another): a cascade unsure at stage 1 starts the cloud at once,
    and the app sees the `ParallelStart` the trace holds."""
    local = SignalScriptedEngine(hold_s=0.05, tokens=LOCAL, tpot_s=0.01)
    cloud = ScriptedEngine("cloud", tokens=["c1", "c2"], ttft_s=0.01)
    pol = PLANS["cascade"].with_(cascade={"hedge": True})
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9, 0.9)) as client:
        async with client.stream("q", policy=pol, plan="cascade") as s:
            events = [e async for e in s.events()]
    starts = [e for e in events if isinstance(e, ParallelStart)]
    assert [(e.to_engine, e.cause) for e in starts] == [("cloud", "parallel")]
    assert s.trace.parallel_engine == "cloud" and s.trace.parallel_start == starts[0].reason
    assert [f.cause for f in s.trace.fallbacks] == ["parallel"]


class _FlushedTail(ScriptedEngine):
    """Reports one token fewer than the text chunks it sends: the local engine's case of a
    held-back tail (a possible stop string) flushed as a chunk of its own at the end."""

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        async for chunk in super().stream(request):
            if isinstance(chunk, Finish) and chunk.completion_tokens:
                chunk = dataclasses.replace(chunk, completion_tokens=chunk.completion_tokens - 1)
            yield chunk


async def test_a_reported_count_is_the_usage_even_where_more_chunks_were_delivered() -> None:
    """The engine reported 2 tokens for 3 chunks: the usage is its report (what it bills and
    what `max_tokens` bounds), the delivered count stays the chunks."""
    local = _FlushedTail("local", tokens=["a", "b", "c"])
    async with HybridClient(local=local, router=None) as client:
        done = await client.complete("q", max_tokens=2)
    (usage,) = done.trace.usage_by_engine()
    assert (usage.completion_tokens, usage.delivered_tokens, usage.estimated) == (2, 3, False)
    assert done.trace.completion_tokens == 2 and done.trace.n_tokens == 3
