"""HybridClient routing through `decide()`, with `ScriptedEngine` doubles (orchestration only):
a router plugged in, the privacy detector and a budget ledger; load awareness; the decision in the
trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from hybridllm import Cap, HybridClient, ModelPrice, Policy, Prices, Route, Tenant
from hybridllm.errors import (
    BudgetExceededError,
    InvalidArgumentError,
    PolicyError,
    PrivacyBlockedError,
    RateLimitedError,
)
from hybridllm.events import EngineName
from hybridllm.guard.budget import SQLiteLedger, TokenUsage
from hybridllm.routing.inputs import Prediction
from hybridllm.runtime.latency import LatencyModel
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


class FixedRouter:
    """A router double: scores prompts containing "hard" high."""

    def __init__(self) -> None:
        self.asked: list[tuple[float | None, float | None]] = []

    def score(self, messages: Sequence[Mapping[str, str]]) -> float:
        return 0.9 if "hard" in messages[-1]["content"] else 0.1

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        self.asked.append((cloud_share, quality_floor))
        return 0.5


def pair() -> tuple[ScriptedEngine, ScriptedEngine]:
    return ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])


async def test_router_score_against_the_policy_threshold() -> None:
    local, cloud = pair()
    router = FixedRouter()
    pol = Policy(name="auto", routing={"prefer": "auto", "target_cloud_share": 0.3})
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=router) as client:
        hard = await client.complete("a hard question")
        easy = await client.complete("an easy one")
    assert hard.trace.engine == "cloud" and easy.trace.engine == "local"
    assert "router_score" in hard.trace.reason_codes and hard.trace.decision is not None
    assert hard.trace.decision.by_router and hard.trace.decision.primary == "cloud"
    assert router.asked == [(0.3, None), (0.3, None)]
    pinned = Policy(name="pinned", routing={"prefer": "auto", "router_threshold": 0.95})
    async with HybridClient(local=local, cloud=cloud, policy=pinned, router=router) as client:
        assert (await client.complete("a hard question")).trace.engine == "local"


async def test_privacy_finding_never_reaches_the_cloud_even_on_failure() -> None:
    local = ScriptedEngine("local", script=[0.3, "slow"])  # past the deadline: no fallback
    cloud = ScriptedEngine("cloud", tokens=["c"])
    pol = Policy(
        name="p",
        routing={"prefer": "cloud", "ttft_deadline_ms": 50},
        privacy={"mode": "keep-local"},
    )
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        res = await client.complete("mail me at ada.lovelace@example.org")
        assert (await client.complete("no secrets here")).trace.engine == "cloud"
        blocked = pol.with_(privacy={"mode": "block"})
        with pytest.raises(PrivacyBlockedError, match="privacy: email found -> blocked") as info:
            await client.complete("ada.lovelace@example.org", policy=blocked)
        assert info.value.kinds == ("email",) and not info.value.retryable
    assert res.text == "slow" and res.trace.started == ("local",)
    assert "privacy_local" in res.trace.reason_codes  # the email (kinds above) kept it local
    assert len(cloud.requests) == 1 and "@" not in cloud.requests[0].messages[0]["content"]


async def test_the_client_privacy_mode_is_a_floor_under_every_policy() -> None:
    local, cloud = pair()
    pol = Policy(name="open", routing={"prefer": "cloud"}, privacy={"mode": "off"})
    async with HybridClient(local=local, cloud=cloud, policy=pol, privacy="keep-local") as client:
        res = await client.complete("card 4111 1111 1111 1111 please")
        with pytest.raises(PrivacyBlockedError, match="contains card.*card found"):  # even forced
            await client.complete("card 4111 1111 1111 1111", engine="cloud")
    assert res.trace.engine == "local" and not cloud.requests


async def test_an_exhausted_budget_goes_local_or_fails() -> None:
    local, cloud = pair()
    pol = Policy(name="b", routing={"prefer": "cloud", "ttft_deadline_ms": 50})
    spent = [Cap(None, "day", 0.0)]  # nothing left today
    prices = Prices(models={"scripted": ModelPrice(input_per_million=1, output_per_million=2)})
    async with HybridClient(
        local=local, cloud=cloud, policy=pol, prices=prices, budget_caps=spent
    ) as client:
        res = await client.complete("q")
        strict = pol.model_copy(
            update={"budget": pol.budget.model_copy(update={"on_exceeded": "fail"})}
        )
        with pytest.raises(BudgetExceededError, match="budget"):
            await client.complete("q", policy=strict)
    assert res.trace.engine == "local" and not cloud.requests
    assert any(
        r.startswith("budget: cannot cover the cloud request (global daily cap $0: spent $0,")
        and "this request up to $0.000585)" in r  # the amount shows, not "0.0000 USD"
        and r.endswith("local")
        for r in res.trace.reasons  # the wording is the subject: the amount shows
    ), res.trace.reasons


class QueuedLocal(ScriptedEngine):
    """A scripted local engine that reports a queue (as LlamaCppEngine does when busy)."""

    queue_s = 0.0

    def info(self):  # type: ignore[no-untyped-def]
        from hybridllm.engines.base import EngineInfo

        return EngineInfo(name="local", model="scripted", expected_wait_s=self.queue_s)


async def test_a_long_local_queue_sends_the_request_to_the_cloud() -> None:
    local = QueuedLocal("local", script=[0.05, "l"])
    cloud = ScriptedEngine("cloud", script=[0.01, "c"])
    pol = Policy(name="q", routing={"prefer": "local", "ttft_deadline_ms": 200})
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        assert (await client.complete("q")).trace.engine == "local"
        local.queue_s = 2.1
        async with client.stream("q") as s:
            events = [e async for e in s.events()]
    route = next(e for e in events if isinstance(e, Route))
    assert (
        route.engine == "cloud" and "local queue 2100 ms > deadline 200 ms -> cloud" in route.reason
    )
    assert s.trace.started == ("cloud",) and len(local.requests) == 1


@pytest.mark.virtual_clock  # tests/unit/conftest.py
async def test_a_cloud_that_got_slow_gets_the_local_engine_started_at_once() -> None:
    """The cloud answered in 10 ms, then in 300 ms (past the 200 ms deadline, still ahead of a
    slow local engine): the latency model notices within a few requests, and the local engine
    is started with the cloud instead of at the deadline."""
    local = ScriptedEngine("local", script=[0.6, "l"])
    cloud = ScriptedEngine("cloud", script=[0.01, "c"])
    pol = Policy(
        name="c", routing={"prefer": "cloud", "ttft_deadline_ms": 200, "objective": "latency"}
    )
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        for _ in range(10):
            assert (await client.complete("q")).trace.engine == "cloud"
        cloud.script = [0.3, "c"]
        traces = [(await client.complete("q")).trace for _ in range(5)]
    assert all(tr.engine == "cloud" for tr in traces)
    first_started_at_once = next(
        i
        for i, tr in enumerate(traces)
        if tr.decision is not None and tr.decision.load == "parallel_start"
    )
    assert first_started_at_once <= 3, [tr.reasons for tr in traces]
    last = traces[-1]
    assert last.segments_ms["fallback_started"] == pytest.approx(0)  # not at the deadline
    assert last.decision is not None and last.decision.load == "parallel_start"
    assert last.decision.fallback == "local"  # the local engine starts in parallel now
    # the wording is the subject: the route says one reason, not also the deadline's
    assert "starts if no token" not in last.route_reason
    assert last.parallel_engine == "local"
    assert last.parallel_start in last.route_reason  # the wording is the subject


async def test_policy_dirs_reach_the_client(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    (d / "mine.toml").write_text('extends = "code-completion"\n[sampling]\nmax_tokens = 7\n')
    local, _ = pair()
    async with HybridClient(local=local, policy_dirs=[d]) as client:
        res = await client.complete("q", policy="mine")
        assert client.routing.last_local_prompt == "user: q"  # noted for the KV-cache estimate
    assert local.requests[0].max_tokens == 7 and res.trace.engine == "local"


async def test_explain_decision_without_sending() -> None:
    local, cloud = pair()
    async with HybridClient(local=local, cloud=cloud) as client:
        decision, facts, state = client.decide("hi", Policy(routing={"prefer": "cloud"}))
    assert decision.primary == "cloud" and facts.prompt_tokens > 0
    assert not local.requests and not cloud.requests


async def test_the_shipped_router_is_loaded_by_default_and_scores_requests() -> None:
    """With both engines and no `router=`, the client loads models/router/ while the engines
    start; a policy with a target cloud share then routes by its score."""
    from hybridllm.routing import Router

    local, cloud = pair()
    async with HybridClient(local=local, cloud=cloud, policy="chat") as client:
        assert isinstance(client.routing.router, Router)
        res = await client.complete("What is the capital of France?")
    assert "router_score" in res.trace.reason_codes, res.trace.reasons
    async with HybridClient(local=local, cloud=cloud, policy="chat", router=None) as client:
        res = await client.complete("What is the capital of France?")
    assert "router_score" not in res.trace.reason_codes


async def test_a_repeated_local_prompt_is_predicted_from_its_uncached_part() -> None:
    local = ScriptedEngine("local", tokens=["l"])
    pol = Policy(name="l", routing={"prefer": "local"})
    long = "word " * 400
    async with HybridClient(local=local, policy=pol) as client:
        client.routing.latency.seed("local", prefill_tps=100.0, tpot_s=0.01, overhead_s=0.0)
        client.routing.note_local([{"role": "user", "content": long}])  # as after a local run

        def predicted(text: str) -> float:
            return client.decide(text, pol).state.latency["local"].ttft_s

        shared = predicted(long + "and one more question?")
        fresh = predicted("other " * 334 + "and one more question?")  # same length, no prefix
    assert fresh > 4.0  # ~500 tokens at 100 tokens/s
    assert shared < fresh / 10


async def test_every_request_lands_in_the_decision_log_and_takes_feedback(tmp_path: object) -> None:
    from pathlib import Path

    from hybridllm.routing import DecisionLog

    path = Path(str(tmp_path)) / "decisions.db"
    local, cloud = pair()
    async with HybridClient(
        local=local, cloud=cloud, policy="chat", decision_log=path, router=FixedRouter()
    ) as client:
        hard = await client.complete("a hard question")
        easy = await client.complete("an easy one")
        client.feedback(easy.trace, good=False)
        client.feedback(hard.trace.request_id, good=True)
    with DecisionLog(path) as log:
        rows = {r["request_id"]: r for r in log.rows()}
    assert set(rows) == {hard.trace.request_id, easy.trace.request_id}
    h, e = rows[hard.trace.request_id], rows[easy.trace.request_id]
    assert (h["route"], h["engine"], h["score"], h["feedback"]) == ("cloud", "cloud", 0.9, 1)
    assert (e["route"], e["engine"], e["score"], e["feedback"]) == ("local", "local", 0.1, 0)
    assert h["policy"] == "chat" and h["ttft_ms"] is not None and h["ttft_ms"] > 0
    assert h["prompt"] is None and e["prompt"] is None  # prompt text only when opted in
    assert h["features"]["turns"] > 0 and h["features"]["log_tokens"] > 0

    opted = Path(str(tmp_path)) / "with-text.db"
    async with HybridClient(
        local=local, decision_log=DecisionLog(opted, store_prompts=True)
    ) as client:
        await client.complete("remember me")
    with DecisionLog(opted) as log:
        assert "remember me" in (log.rows()[0]["prompt"] or "")


async def test_a_failed_request_is_logged_with_its_error_type(tmp_path: object) -> None:
    """The decision log takes the error's kind from the trace's typed field, not its text."""
    from pathlib import Path

    from hybridllm.errors import CloudConnectionError
    from hybridllm.routing import DecisionLog

    path = Path(str(tmp_path)) / "decisions.db"
    down = ScriptedEngine("cloud", script=[CloudConnectionError("refused: port 9: closed")])
    async with HybridClient(
        cloud=down, decision_log=path, policy=Policy(routing={"retries": 0})
    ) as client:
        with pytest.raises(CloudConnectionError):
            await client.complete("q")
    with DecisionLog(path) as log:
        (row,) = log.rows()
    assert row["error_kind"] == "CloudConnectionError" and row["route"] == "cloud"


# ---- a policy's `plan` (as a file sets it) works like a call's `plan=` (issue 24) ---------------


class SignalsEngine(ScriptedEngine):
    """A scripted local engine that can read its own signals (`ReadsSignals`), never asked to."""

    async def signals(self, messages: object, n_answer: int = 8, **_: object) -> object:
        raise AssertionError("a preview reads no signals")


def asking(base: Policy, plan: str) -> Policy:
    """`base` with its `plan` field set as a policy file sets it (listed in plans, nothing
    else changed: unlike `Policy.with_plan`, a hedge gets no delay)."""
    plans = base.plans if plan in base.plans else (*base.plans, plan)
    return Policy(**{**base.model_dump(), "plan": plan, "plans": plans})


class History(LatencyModel):
    """A latency model with a history: a heavy-tailed cloud (an automatic hedge pays) and a
    fast local engine."""

    TAIL = (0.1, 0.12, 0.13, 0.15, 0.15, 0.16, 0.18, 0.2, 0.22, 0.25, 0.3, 0.5, 3.0, 10.0)

    def knows(self, name: EngineName) -> bool:
        return True

    def predict(
        self, name: EngineName, prompt_tokens: float, max_tokens: int, *, queue_s: float = 0.0
    ) -> Prediction:
        if name == "local":
            return Prediction("local", 0.05, 0.05, 1.0, 1.0, 0.05, samples=10)
        tail = self.TAIL
        return Prediction("cloud", 0.15, 0.45, 1.2, 2.5, 0.05, samples=len(tail), ttft_samples=tail)


@pytest.mark.parametrize(
    ("plan", "prefer", "expected"),
    [
        ("hedge", "cloud", "hedge"),
        ("speculative", "local", "speculative"),
        ("handoff", "local", "handoff"),
        ("cascade", "local", "cascade"),
    ],
)
async def test_a_policys_plan_is_decided_as_the_calls_plan(
    plan: str, prefer: str, expected: str
) -> None:
    routing = {"prefer": prefer, "router_threshold": 0.5, "ttft_deadline_ms": 600}
    # the first token wins (a quality decision would price the hedge's lost quality: issue 25)
    base = Policy(name="p", routing={**routing, "objective": "latency"})  # type: ignore[arg-type]
    local, cloud = SignalsEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    client = HybridClient(local=local, cloud=cloud, router=FixedRouter(), latency=History())
    # temperature > 0 with top_p = 1: speculation would not pay, so only asking runs it
    kw = {"temperature": 0.7, "top_p": 1.0}
    by_policy = client.decide("q", asking(base, plan), **kw).decision  # type: ignore[arg-type]
    by_call = client.decide("q", base, plan=plan, **kw).decision  # type: ignore[arg-type]
    neither = client.decide("q", base, **kw).decision  # type: ignore[arg-type]
    assert by_policy.plan == by_call.plan == expected
    assert (by_policy.primary, by_policy.fallback) == (by_call.primary, by_call.fallback)
    assert by_policy.hedge_s == by_call.hedge_s
    assert neither.plan == "single" and not local.requests and not cloud.requests


# ---- the local circuit is read (issue 24, section 6) ---------------------------------------------


async def test_a_local_engine_that_keeps_missing_deadlines_leaves_requests_to_the_cloud() -> None:
    from hybridllm.errors import DeadlineMissError

    local, cloud = pair()
    async with HybridClient(local=local, cloud=cloud, policy=Policy(name="p")) as client:
        for _ in range(5):  # as the race records a local engine that lost past the deadline
            client.breakers["local"].record(DeadlineMissError("no token", engine="local"))
        preview = client.decide("q")
        done = await client.complete("q")
    assert preview.state.local_circuit_open and preview.decision.engines == ("cloud",)
    assert done.trace.engine == "cloud" and "local_circuit_open" in done.trace.reason_codes
    assert not local.requests


async def test_a_preview_leaves_the_local_circuits_probe_to_the_next_request() -> None:
    from hybridllm.errors import DeadlineMissError
    from hybridllm.runtime.health import CircuitBreaker

    local, cloud = pair()
    async with HybridClient(local=local, cloud=cloud, policy=Policy(name="p")) as client:
        breaker = client.breakers["local"] = CircuitBreaker(miss_reset_after_s=0.0)
        for _ in range(5):  # opened by misses (judged over 5 outcomes), half-open at once
            breaker.record(DeadlineMissError("no token", engine="local"))
        assert breaker.state == "half-open"
        for _ in range(3):
            assert client.decide("q").decision.primary == "local"  # the probe would go through
        assert breaker.would_allow()  # no preview took it
        done = await client.complete("q")  # takes the probe; its success closes the circuit
    assert done.trace.engine == "local" and breaker.state == "closed"


# ---- the preview and the stream go through one admission (issue 24, section 6) -----------------


async def test_the_preview_applies_the_clients_privacy_floor_as_the_stream_does() -> None:
    local, cloud = pair()
    pol = Policy(name="open", routing={"prefer": "cloud"}, privacy={"mode": "off"})
    prompt = "mail the summary to ann@example.org"
    async with HybridClient(local=local, cloud=cloud, policy=pol, privacy="keep-local") as client:
        preview = client.decide(prompt)
        done = await client.complete(prompt)
    assert preview.facts.privacy_kinds and "email" in preview.facts.privacy_kinds
    assert preview.decision.engines == ("local",) and done.trace.engine == "local"
    assert done.trace.decision is not None
    assert done.trace.decision.reasons == preview.decision.reasons
    assert not cloud.requests


async def test_decide_takes_what_stream_takes() -> None:
    local, cloud = pair()
    async with HybridClient(local=local, cloud=cloud) as client:
        by_name = client.decide("hi", "chat")
        by_keyword = client.decide([{"role": "user", "content": "hi"}], policy="chat")
        forced = client.decide("hi", engine="cloud", max_tokens=3, priority="background")
    assert by_name == by_keyword and by_name.decision.primary is not None
    assert forced.decision.engines == ("cloud",) and forced.facts.max_tokens == 3
    decision, facts, state = forced  # it unpacks as the 3-tuple it was
    assert decision is forced.decision and state is forced.state and facts is forced.facts


async def test_per_user_caps_send_one_user_local_and_say_each_users_quota() -> None:
    """`[budget] per_user_day_usd`: alice, who spent most of her day, goes local (or is
    refused, under on_exceeded = "fail"); bob and a request without a user go to the cloud;
    `quota()` says what each has spent and has left."""
    local, cloud = pair()
    price = ModelPrice(input_per_million=1, output_per_million=2)
    ledger = SQLiteLedger()
    spent = ledger.reserve(
        model="scripted", price=price, prompt_tokens=100, max_tokens=450, user="alice"
    )
    ledger.settle(spent, TokenUsage(100, 450))  # alice: $0.001 spent today
    pol = Policy(name="b", routing={"prefer": "cloud"}, budget={"per_user_day_usd": 0.0012})
    prices = Prices(models={"scripted": price})
    async with HybridClient(
        local=local, cloud=cloud, policy=pol, prices=prices, ledger=ledger
    ) as client:
        alice = await client.complete("q", user="alice", max_tokens=100)  # needs ~$0.0002
        bob = await client.complete("q", user="bob", max_tokens=100)
        nobody = await client.complete("q", max_tokens=100)
        strict = pol.with_(budget={"on_exceeded": "fail"})
        with pytest.raises(BudgetExceededError) as info:
            await client.complete("q", user="alice", max_tokens=100, policy=strict)
        assert info.value.per_user and info.value.limit_usd == 0.0012
        quota_alice, quota_bob = client.quota("alice"), client.quota("bob")
        assert client.quota("carol").day.spent_usd == 0.0
        with pytest.raises(InvalidArgumentError):
            client.quota("  ")
        with pytest.raises(InvalidArgumentError):
            await client.complete("q", user="")
    assert alice.trace.engine == "local" and "budget_local" in alice.trace.reason_codes
    assert bob.trace.engine == "cloud" and nobody.trace.engine == "cloud"
    assert quota_alice.day.spent_usd == pytest.approx(0.001) and quota_alice.day.reserved_usd == 0
    assert quota_alice.day.limit_usd == 0.0012 and quota_alice.month.limit_usd is None
    assert quota_alice.day.left_usd == pytest.approx(0.0002) and not quota_alice.exhausted
    assert 0 < quota_bob.day.spent_usd < 0.0002 and quota_bob.month.left_usd is None
    assert all(e["user"] != "alice" for e in ledger.entries())  # kept hashed


async def test_per_user_rpm_sends_a_user_past_it_local_and_tenants_keep_their_users_apart() -> None:
    """`[limits] per_user_rpm = 2`: alice's third cloud request this minute goes local (a
    `RateLimitedError` under on_exceeded = "fail"); bob, and alice of another tenant, are
    counted apart. No price is needed: the count is kept in a ledger of its own."""
    local, cloud = pair()
    pol = Policy(name="r", routing={"prefer": "cloud"}, limits={"per_user_rpm": 2})
    other = Tenant("team-b")
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        alice = [await client.complete("q", user="alice", max_tokens=4) for _ in range(3)]
        bob = await client.complete("q", user="bob", max_tokens=4)
        alice_b = await client.complete("q", user="alice", tenant=other, max_tokens=4)
        nobody = await client.complete("q", max_tokens=4)
        strict = pol.with_(budget={"on_exceeded": "fail"})
        with pytest.raises(RateLimitedError) as info:
            await client.complete("q", user="alice", max_tokens=4, policy=strict)
    assert [a.trace.engine for a in alice] == ["cloud", "cloud", "local"]
    assert "budget_local" in alice[2].trace.reason_codes
    assert bob.trace.engine == alice_b.trace.engine == nobody.trace.engine == "cloud"
    assert info.value.limit_rpm == 2 and 0 < info.value.retry_after_s <= 60
    with pytest.raises(PolicyError):
        Policy(name="bad", limits={"per_user_rpm": 0})
