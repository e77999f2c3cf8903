"""The cascade plan's orchestration and timing (issue 14), with scripted engines.

Scripted engines only: what is checked here is who starts when, what is held, released or
cancelled, and how the hold counts against the deadline. The real engines (the local model's
real signals, a real cloud server) are in tests/integration/test_cascade.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from hybridllm import HybridClient, Policy, Token
from hybridllm.engines.base import Message
from hybridllm.engines.llama.signals import LocalSignals
from hybridllm.errors import (
    AllEnginesFailedError,
    CloudConnectionError,
    LocalEngineError,
    PolicyError,
    QueueFullError,
)
from hybridllm.events import Fallback
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py


class SignalScriptedEngine(ScriptedEngine):
    """A scripted local engine whose `signals()` takes `hold_s` and holds `answer`."""

    def __init__(
        self, *, hold_s: float, answer: str = "Hel", ended: bool = False, **kw: Any
    ) -> None:
        super().__init__("local", **kw)
        self.hold_s = hold_s
        self.answer = answer
        self.ended = ended
        self.signal_calls = 0
        self.n_answers: list[int] = []
        self.continued_from: list[str] = []

    async def signals(
        self, messages: Sequence[Message], n_answer: int = 8, **_: object
    ) -> LocalSignals:
        self.signal_calls += 1
        self.n_answers.append(n_answer)
        await anyio.sleep(self.hold_s)
        n = len(self.answer) + self.ended  # one token per character, the end of text its own
        lps = tuple(-0.1 * (i + 1) for i in range(n))
        values = {"first_p": 0.9, "answer_tokens": float(n), "lp_mean": sum(lps) / n,
                  "lp_min": min(lps), "is_choice": 0.0, "option_p": math.nan}  # fmt: skip
        cost_ms = self.hold_s * 1e3
        return LocalSignals(
            values, 10, self.answer, self.ended, cost_ms, lps, rotations_ms=cost_ms / 4
        )

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
    base = Policy(name="c", plans=("single", "hedge", "cascade"), routing={"router_threshold": 0.5})
    return base.with_(**kw)


async def run(client: HybridClient, pol: Policy) -> tuple[list[Token], Any, float]:
    t0 = anyio.current_time()
    s = client.stream("hi", policy=pol, plan="cascade")
    tokens = [e async for e in s.events() if isinstance(e, Token)]
    return tokens, s.trace, anyio.current_time() - t0


async def test_confident_local_releases_held_text_and_continues_from_it_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.05, tokens=["lo", "!"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.01)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        tokens, trace, _ = await run(client, policy())
    assert [t.text for t in tokens] == ["Hel", "lo", "!"]
    assert {t.engine for t in tokens} == {"local"}
    assert local.continued_from == ["Hel"]  # the continuation starts from the held text
    assert trace.started == ("local",) and trace.engine == "local"
    assert trace.cascade.decision == "local" and trace.cascade.held_ms >= 45
    assert trace.cascade.value == pytest.approx(0.10) and trace.cascade.cut == 0.5
    assert trace.cascade.extra_ms == pytest.approx(trace.cascade.cost_ms / 4, abs=0.1)


async def test_unconfident_local_defers_before_anything_is_shown_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.05, tokens=["lo"])
    cloud = ScriptedEngine("cloud", tokens=["C1", "C2"], ttft_s=0.02)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9)) as client:
        tokens, trace, _ = await run(client, policy())
    assert [(t.engine, t.text) for t in tokens] == [("cloud", "C1"), ("cloud", "C2")]
    assert local.continued_from == []  # the local engine never streamed: it only held
    assert trace.engine == "cloud" and trace.cascade.decision == "cloud"
    # the cloud started only after the hold: its first token after hold + its own TTFT
    assert trace.ttft_ms == pytest.approx(50 + 20)


async def test_a_hold_past_the_deadline_runs_the_race_scripted() -> None:
    local = SignalScriptedEngine(hold_s=2.0, tokens=["L"], ttft_s=1.0)
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.01)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        tokens, trace, took = await run(client, policy(routing={"ttft_deadline_ms": 200}))
    assert trace.cascade.decision == "race" and trace.cascade.held_ms < 400
    assert [t.engine for t in tokens] == ["cloud"]  # the race's fallback answered
    assert took == pytest.approx(0.2 + 0.01)  # the two-second hold was cut at the deadline


async def test_hedged_cascade_starts_the_cloud_at_once_when_stage1_is_unsure_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.2, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.15)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9)) as client:
        tokens, trace, _ = await run(client, policy(cascade={"hedge": True}))
    assert [t.engine for t in tokens] == ["cloud"]
    assert trace.cascade.hedged and trace.parallel_start
    # the cloud ran during the hold: the first token comes at the hold's end, not hold + TTFT
    assert trace.ttft_ms is not None and trace.ttft_ms <= 200


async def test_hedged_cloud_is_cancelled_when_local_turns_out_confident_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.05, tokens=["lo"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=1.0)
    router = FakeRouter(0.9, combined=0.2)  # stage 1 unsure, stage 2 confident
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        tokens, trace, took = await run(client, policy(cascade={"hedge": True}))
    assert [t.engine for t in tokens] == ["local", "local"]
    assert trace.cascade.hedged and trace.cascade.decision == "local"
    assert took == pytest.approx(0.05)  # the cloud's one-second answer was not waited for


async def test_a_call_plan_runs_the_cascade_the_policy_does_not_list_scripted() -> None:
    # plan= per call asks for a plan, as engine= asks for an engine (Policy.with_plan adds it)
    local = SignalScriptedEngine(hold_s=0.0, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    pol = Policy(name="p", routing={"router_threshold": 0.5})
    assert "cascade" not in pol.plans
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        done = await client.complete("hi", policy=pol, plan="cascade")
        plain = await client.complete("hi", policy=pol)
    assert local.signal_calls == 1  # only the call that asked for the cascade read signals
    assert done.trace.cascade is not None and plain.trace.cascade is None


class FromSignals:
    """A stage-2 model that reads one of the local engine's signals (1 - first_p) and, when
    combined, adds the mean log-probability of the held answer."""

    def __init__(self, combined: bool) -> None:
        self.combined = combined

    def score(self, logits: Any, signals: dict[str, float]) -> float:
        own = 1.0 - signals["first_p"]
        return own - signals["lp_mean"] if self.combined else own


async def test_router_score_reports_stage1_stage2_and_the_local_cost_scripted() -> None:
    """Stage 2 is scored from the signals the local engine read (its answer "Hel": three
    tokens at -0.1, -0.2, -0.3), and its cost is the engine's own."""
    local = SignalScriptedEngine(hold_s=0.01, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    router = FakeRouter(0.7)
    router.stage2 = {"signals": FromSignals(False), "combined": FromSignals(True)}  # type: ignore[dict-item]
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        score = await client.router_score("hi")
    assert local.signal_calls == 1 and score.text == 0.7
    assert score.local == pytest.approx(0.1) and score.value == pytest.approx(0.3)
    assert score.signals["answer_tokens"] == 3.0 and math.isnan(score.signals["option_p"])
    assert score.cost_ms == pytest.approx(local.hold_s * 1e3) and score.model == "combined"
    assert score.extra_ms == pytest.approx(score.cost_ms / 4)  # what the engine said: rotations


async def test_the_preview_shows_the_cascade_the_stream_runs_scripted() -> None:
    """`decide()` picks the cascade (both engines, a router, a local engine that reads its own
    signals): `client.decide()` shows it, and `stream()` runs it."""
    local = SignalScriptedEngine(hold_s=0.0, tokens=["lo"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        preview = client.decide("hi", policy())
        s = client.stream("hi", policy=policy())
        tokens = [e async for e in s.events() if isinstance(e, Token)]
    assert preview.decision.plan == "cascade" and preview.state.reads_signals == {"local"}
    assert s.trace.decision is not None and s.trace.decision.reasons == preview.decision.reasons
    assert s.trace.cascade is not None
    assert "".join(t.text for t in tokens) == "Hello"
    plain = ScriptedEngine("local", tokens=["L"])  # reads no signals: no cascade
    async with HybridClient(local=plain, cloud=cloud, router=FakeRouter(0.1)) as client:
        assert client.decide("hi", policy()).decision.plan == "single"


async def test_a_local_failure_during_the_hold_goes_to_the_cloud_scripted() -> None:
    class Failing(SignalScriptedEngine):
        async def signals(
            self, messages: Sequence[Message], n_answer: int = 8, **_: object
        ) -> LocalSignals:
            raise QueueFullError("queue full", waiting=4, max_queue=4, max_queue_wait_s=None)

    local = Failing(hold_s=0.0, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.01)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        tokens, trace, _ = await run(client, policy())
    assert [t.engine for t in tokens] == ["cloud"]
    # sent to the cloud unscored: the local engine failed before the router could judge it
    assert trace.cascade.decision == "cloud" and trace.cascade.value is None


# ---- complete() judging the whole local answer (cascade_judge = "answer") -----------------------


def test_cascade_judge_is_validated() -> None:
    assert Policy().cascade.judge == "prefix"
    assert Policy(cascade={"judge": "answer"}).cascade.judge == "answer"
    with pytest.raises(PolicyError) as err:
        Policy(cascade={"judge": "whole"})  # type: ignore[arg-type]
    assert err.value.field == "cascade.judge" and "answer" in str(err.value)


async def test_complete_judges_the_whole_local_answer_and_keeps_it_scripted() -> None:
    long = "The answer is 4, because two and two make four."
    local = SignalScriptedEngine(hold_s=0.01, answer=long, ended=True, tokens=["never"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    pol = policy(cascade={"judge": "answer"}, sampling={"max_tokens": 100})
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        done = await client.complete("hi", policy=pol, plan="cascade")
    assert local.n_answers == [100]  # the whole answer (max_tokens), not the 8-token hold
    assert done.text == long and local.continued_from == []  # nothing left to continue
    c = done.trace.cascade
    assert c.judge == "answer" and c.decision == "local"
    assert c.local_tokens == len(long) + 1 and c.answer_signals["answer_tokens"] == 48
    # the logged signals are the first 8 tokens' (stage 2's training form)
    assert c.signals["answer_tokens"] == 8 and c.signals["lp_min"] == pytest.approx(-0.8)
    assert c.answer_signals["lp_min"] == pytest.approx(-4.8)
    # the figures only a whole answer has (routing/answer_figures.py): it ended, 47 text tokens
    assert c.answer_signals["answer_ended"] == 1.0
    assert c.answer_signals["answer_len"] == pytest.approx(math.log1p(47), abs=1e-6)
    assert c.answer_signals["repeat_share"] is None  # no token ids from this engine
    assert done.trace.finish_reason == "stop" and done.trace.completion_tokens == 48


async def test_complete_defers_a_judged_answer_to_the_cloud_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.01, answer="maybe 5", ended=True, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C1", "C2"])
    pol = policy(cascade={"judge": "answer"}, sampling={"max_tokens": 50})
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9)) as client:
        done = await client.complete("hi", policy=pol, plan="cascade")
    assert done.text == "C1C2" and done.trace.engine == "cloud"
    assert done.trace.cascade.judge == "answer" and done.trace.cascade.decision == "cloud"
    assert done.trace.cascade.local_tokens == 8  # the local work is on the trace


async def test_stream_and_a_prefix_policy_judge_the_held_tokens_only_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.0, tokens=["lo"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        _, streamed, _ = await run(
            client, policy(cascade={"judge": "answer"}, sampling={"max_tokens": 50})
        )
        done = await client.complete(
            "hi", policy=policy(sampling={"max_tokens": 50}), plan="cascade"
        )
    assert local.n_answers == [8, 8]  # stream() shows tokens as they come: never the whole
    assert streamed.cascade.judge == "prefix" and done.trace.cascade.judge == "prefix"
    assert done.text == "Hello" and done.trace.cascade.answer_signals is None


async def test_a_stop_string_in_the_held_text_ends_the_answer_there_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.0, answer="4\nEND more", tokens=["never"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        done = await client.complete(
            "hi", policy=policy(sampling={"stop": ("END",)}), plan="cascade"
        )
    assert done.text == "4\n" and done.trace.finish_reason == "stop"
    assert local.continued_from == []


# ---- mid-stream failover after the release ----------------------------------------------------


async def test_a_released_local_answer_that_fails_goes_on_in_the_cloud_scripted() -> None:
    boom = LocalEngineError("decode failed", engine="local")
    local = SignalScriptedEngine(hold_s=0.0, script=[0.0, "lo", 0.0, boom])
    cloud = ScriptedEngine("cloud", tokens=[" world", "!"])
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        s = client.stream("hi", policy=policy(sampling={"max_tokens": 50}), plan="cascade")
        events = [e async for e in s.events()]
    tokens = [(e.engine, e.text) for e in events if isinstance(e, Token)]
    assert tokens == [("local", "Hel"), ("local", "lo"), ("cloud", " world"), ("cloud", "!")]
    # the cloud continued from everything delivered, as the start of the assistant turn, for
    # what is left of max_tokens (3 held tokens and 1 released one were delivered)
    assert cloud.requests[-1].assistant_prefix == "Hello"
    assert cloud.requests[-1].max_tokens == 50 - 4
    fallbacks = [e for e in events if isinstance(e, Fallback)]
    assert [(f.from_engine, f.to_engine, f.cause) for f in fallbacks] == [
        ("local", "cloud", "mid_stream")
    ]
    trace = s.trace
    assert trace.engine == "cloud" and trace.started == ("local", "cloud")
    assert [(w.from_engine, w.to_engine, w.delivered_chars) for w in trace.switches] == [
        ("local", "cloud", 5)
    ]
    assert trace.switches[0].error_type is LocalEngineError  # typed, to branch on
    assert trace.cascade.failover is not None and trace.finish_reason == "stop"


async def test_a_failover_that_fails_too_says_no_engine_could_answer_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.0, script=[LocalEngineError("x", engine="local")])
    cloud = ScriptedEngine("cloud", script=[CloudConnectionError("reset")])
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        with pytest.raises(AllEnginesFailedError) as err:
            await client.complete("hi", policy=policy(), plan="cascade")
    assert err.value.received_content  # "Hel" was shown before the failure
    assert [a[0] for a in err.value.attempts] == ["local", "cloud"]


async def test_no_failover_where_the_cloud_cannot_continue_an_answer_scripted() -> None:
    local = SignalScriptedEngine(hold_s=0.0, script=[LocalEngineError("x", engine="local")])
    cloud = ScriptedEngine("cloud", tokens=["C"], supports_continuation=False)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        with pytest.raises(LocalEngineError):
            await client.complete("hi", policy=policy(), plan="cascade")
    assert cloud.requests == []


async def test_a_hedged_hold_past_the_deadline_keeps_the_cloud_it_started_scripted() -> None:
    local = SignalScriptedEngine(hold_s=2.0, tokens=["L"])
    cloud = ScriptedEngine("cloud", tokens=["C"], ttft_s=0.05)
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9)) as client:
        tokens, trace, took = await run(
            client, policy(cascade={"hedge": True}, routing={"ttft_deadline_ms": 200})
        )
    assert [t.engine for t in tokens] == ["cloud"] and took == pytest.approx(0.2)
    assert len(cloud.requests) == 1  # the hedged request answers: no second cloud request
    assert trace.cascade.decision == "cloud" and trace.cascade.hedged
    assert [(f.to_engine, f.cause) for f in trace.fallbacks] == [("cloud", "parallel")]


async def test_a_hedged_cloud_that_fails_after_the_deadline_leaves_it_to_local_scripted() -> None:
    local = SignalScriptedEngine(hold_s=2.0, tokens=["L", "!"])
    cloud = ScriptedEngine("cloud", script=[0.05, CloudConnectionError("reset")])
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.9)) as client:
        tokens, trace, _ = await run(
            client, policy(cascade={"hedge": True}, routing={"ttft_deadline_ms": 200})
        )
    assert [(t.engine, t.text) for t in tokens] == [("local", "L"), ("local", "!")]
    assert trace.engine == "local" and [(f.to_engine, f.cause) for f in trace.fallbacks] == [
        ("cloud", "parallel"),
        ("local", "failed"),
    ]
    assert trace.started == ("cloud", "local")


def test_a_judged_whole_answer_takes_the_answer_models_threshold() -> None:
    from hybridllm.runtime.plans.cascade import _judged_by, policy_cut

    class Cal:
        def __init__(self, cut: float) -> None:
            self.cut = cut

        def threshold(self, cloud_share: float | None = None,
                      quality_floor: float | None = None) -> float:  # fmt: skip
            return self.cut

    both = FakeRouter(0.5)
    both.stage2 = {"combined": Cal(0.2), "combined_answer": Cal(0.35)}  # type: ignore[dict-item]
    prefix_only = FakeRouter(0.5)
    prefix_only.stage2 = {"combined": Cal(0.2)}  # type: ignore[dict-item]
    assert _judged_by(both, "answer") == "combined_answer"
    assert _judged_by(both, "prefix") == _judged_by(prefix_only, "answer") == "combined"
    pol = Policy(name="c", plans=("single", "cascade"), routing={"target_cloud_share": 0.3})
    assert policy_cut(both, pol, _judged_by(both, "answer")) == 0.35
    assert policy_cut(both, pol, _judged_by(both, "prefix")) == 0.2


async def test_a_policys_plan_runs_the_cascade_as_a_calls_plan_does_scripted() -> None:
    """`plan = "cascade"` in a policy (here a policy object, as a file gives it) runs the
    cascade under `prefer = "local"`, where only asking for it does."""
    local = SignalScriptedEngine(hold_s=0.0, tokens=["lo"])
    cloud = ScriptedEngine("cloud", tokens=["C"])
    asking = policy(routing={"prefer": "local"}, plan="cascade")
    async with HybridClient(local=local, cloud=cloud, router=FakeRouter(0.1)) as client:
        done = await client.complete("hi", policy=asking)
        plain = await client.complete("hi", policy=policy(routing={"prefer": "local"}))
    assert done.trace.cascade is not None and done.trace.cascade.decision == "local"
    assert done.text == "Hello" and plain.trace.cascade is None and local.signal_calls == 1
