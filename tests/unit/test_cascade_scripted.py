"""The cascade plan's orchestration and timing (issue 14), with scripted engines.

Scripted engines only: what is checked here is who starts when, what is held, released or
cancelled, and how the hold counts against the deadline. The real engines (the local model's
real signals, a real cloud server) are in tests/integration/test_cascade.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from hybridllm import HybridClient, Policy, QueueFullError, ScriptedEngine, Token
from hybridllm.engines._llama_signals import LocalSignals
from hybridllm.engines.base import Message

pytestmark = pytest.mark.anyio


class SignalScriptedEngine(ScriptedEngine):
    """A scripted local engine whose `signals()` takes `hold_s` and holds `answer`."""

    def __init__(self, *, hold_s: float, answer: str = "Hel", **kw: Any) -> None:
        super().__init__("local", **kw)
        self.hold_s = hold_s
        self.answer = answer
        self.signal_calls = 0
        self.continued_from: list[str] = []

    async def signals(self, messages: Sequence[Message], n_answer: int = 8) -> LocalSignals:
        self.signal_calls += 1
        await anyio.sleep(self.hold_s)
        values = {"first_p": 0.9, "answer_tokens": 1.0, "is_choice": 0.0, "option_p": math.nan}
        return LocalSignals(values, 10, self.answer, False, self.hold_s * 1e3)

    def stream(self, request: Any) -> Any:
        self.continued_from.append(request.assistant_prefix)
        return super().stream(request)


class Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, *_: Any) -> float:
        return self.value


class FakeRouter:
    """Stage 1 says `text`; stage 2 (when given) says `combined`."""

    def __init__(self, text: float, combined: float | None = None) -> None:
        self.text = text
        self.stage2 = {} if combined is None else {"signals": Fixed(combined),
                                                    "combined": Fixed(combined)}  # fmt: skip

    def score(self, messages: Any) -> float:
        return self.text

    def head_logits(self, feats: Any) -> list[float]:
        return [0.0, 0.0]

    def threshold(self, **_: Any) -> float:
        return 0.5


def policy(**kw: Any) -> Policy:
    return Policy(name="c", plans=("single", "hedge", "cascade"), router_threshold=0.5, **kw)


async def run(client: HybridClient, pol: Policy) -> tuple[list[Token], Any, float]:
    t0 = time.perf_counter()
    s = client.stream("hi", policy=pol, plan="cascade")
    tokens = [e async for e in s.events() if isinstance(e, Token)]
    return tokens, s.trace, time.perf_counter() - t0


async def test_confident_local_releases_held_text_and_continues_from_it_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.05, tokens=["lo", "!"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.01)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        tokens, trace, _ = await run(client, policy())
    assert [t.text for t in tokens] == ["Hel", "lo", "!"]
    assert {t.engine for t in tokens} == {"local"}
    assert local.continued_from == ["Hel"]  # the continuation starts from the held text
    assert trace.started == ["local"] and trace.engine == "local"
    assert trace.cascade["decision"] == "local" and trace.cascade["held_ms"] >= 45
    assert "cascade: combined score 0.10 <= 0.50" in trace.route_reason


async def test_unconfident_local_defers_before_anything_is_shown_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.05, tokens=["lo"])
    cloud = ScriptedEngine("cloud", tokens=["C1", "C2"], ttft_s=0.02)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9)) as client:
        tokens, trace, _ = await run(client, policy())
    assert [(t.engine, t.text) for t in tokens] == [("cloud", "C1"), ("cloud", "C2")]
    assert local.continued_from == []  # the local engine never streamed: it only held
    assert trace.engine == "cloud" and trace.cascade["decision"] == "cloud"
    # the cloud started only after the hold: its first token after hold + its own TTFT
    assert trace.ttft_ms is not None and trace.ttft_ms >= 65


async def test_a_hold_past_the_deadline_runs_the_race_scripted() -> None:
    local = SignalScriptedEngine(hold_s=2.0, tokens=["L"], ttft_s=1.0)
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.01)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        tokens, trace, took = await run(client, policy(ttft_deadline_ms=200))
    assert trace.cascade["decision"] == "race" and trace.cascade["held_ms"] < 400
    assert [t.engine for t in tokens] == ["cloud"]  # the race's fallback answered
    assert took < 1.5  # the two-second hold was cut at the deadline, not waited out


async def test_hedged_cascade_starts_the_cloud_at_once_when_stage1_is_unsure_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.2, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.15)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9)) as client:
        tokens, trace, _ = await run(client, policy(cascade_hedge=True))
    assert [t.engine for t in tokens] == ["cloud"]
    assert trace.cascade["hedged"] and trace.parallel_start
    # the cloud ran during the hold: the first token comes at the hold's end, not hold + TTFT
    assert trace.ttft_ms is not None and trace.ttft_ms < 200 + 120


async def test_hedged_cloud_is_cancelled_when_local_turns_out_confident_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.05, tokens=["lo"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=1.0)
    router = FakeRouter(0.9, combined=0.2)  # stage 1 unsure, stage 2 confident
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        tokens, trace, took = await run(client, policy(cascade_hedge=True))
    assert [t.engine for t in tokens] == ["local", "local"]
    assert trace.cascade["hedged"] and trace.cascade["decision"] == "local"
    assert took < 0.9  # the cloud's one-second answer was not waited for


async def test_a_call_plan_runs_the_cascade_the_policy_does_not_list_scripted() -> None:
    # plan= per call asks for a plan, as engine= asks for an engine (Policy.with_plan adds it)
    local = SignalScriptedEngine(hold_s=0.0, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    pol = Policy(name="p", router_threshold=0.5)
    assert "cascade" not in pol.plans
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        done = await client.complete("hi", policy=pol, plan="cascade")
        plain = await client.complete("hi", policy=pol)
    assert local.signal_calls == 1  # only the call that asked for the cascade read signals
    assert done.trace.cascade is not None and plain.trace.cascade is None


async def test_router_score_reports_stage1_stage2_and_the_local_cost_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.01, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.7, 0.3)) as client:
        score = await client.router_score("hi")
    assert (score.text, score.local, score.value) == (0.7, 0.3, 0.3)
    assert score.signals["first_p"] == 0.9 and math.isnan(score.signals["option_p"])
    assert score.cost_ms == pytest.approx(10.0)


async def test_a_local_failure_during_the_hold_goes_to_the_cloud_scripted() -> None:
    class Failing(SignalScriptedEngine):
        async def signals(self, messages: Sequence[Message], n_answer: int = 8) -> LocalSignals:
            raise QueueFullError("queue full", waiting=4, max_queue=4, max_queue_wait_s=None)

    local = Failing(hold_s=0.0, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.01)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        tokens, trace, _ = await run(client, policy())
    assert [t.engine for t in tokens] == ["cloud"]
    assert trace.cascade["decision"] == "cloud" and "local failed" in trace.route_reason
