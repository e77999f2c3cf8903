"""Money that is visible (issue 13, part 4): a cloud started in parallel with a local engine
predicted to miss its deadline is named (reason, `ParallelStart`), counted (trace), and a policy
can forbid it (`parallel_cloud = false`) or cap its share (`parallel_cloud_share`)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from hybridllm import Fallback, HybridClient, ModelPrice, ParallelStart, Policy, Prices, Route
from hybridllm.cli.demo import Row, format_table, parallel_note
from hybridllm.errors import PolicyError
from hybridllm.events import EngineName, Event
from hybridllm.policy import resolve_policy
from hybridllm.routing import LiveState, Reason, RequestFacts, decide
from hybridllm.routing.inputs import Prediction
from hybridllm.runtime.gather import PARALLEL_WINDOW
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.trace import Trace
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.virtual_clock  # the async tests run on it (tests/unit/conftest.py)

VOICE = Policy(name="voice", routing={"prefer": "local", "ttft_deadline_ms": 400})
FACTS = RequestFacts(50, 64)


def pred(engine: str, ttft: float, p95: float | None = None) -> Prediction:
    p95 = ttft if p95 is None else p95
    return Prediction(engine, ttft, p95, ttft + 1.0, p95 + 2.0, 0.05, samples=10)  # type: ignore[arg-type]


# local just past the deadline, a cloud whose p95 does not meet it either
MISS = LiveState(latency={"local": pred("local", 0.437), "cloud": pred("cloud", 0.2, 0.6)})


# ---- decide() ---------------------------------------------------------------------------------


def test_a_parallel_cloud_start_is_one_plain_reason_with_its_cost() -> None:
    d = decide(FACTS, VOICE, MISS)
    assert (d.primary, d.fallback, d.fallback_now, d.parallel_cloud) == (
        "local",
        "cloud",
        True,
        True,
    )
    assert d.codes == ("policy_prefers", "parallel_start")
    assert d.reason == (
        "policy 'voice' prefers local; local is preferred but predicted at 437 ms against the "
        "400 ms deadline: the cloud starts in parallel now (it costs a cloud request; the first "
        "token wins)"
    )


def test_the_parallel_start_is_a_typed_rule_with_its_own_words_for_the_plan() -> None:
    state = LiveState(latency=MISS.latency, continues=frozenset({"local"}))
    d = decide(FACTS, VOICE, state)
    assert d.load == "parallel_start" and d.fallback_now and not d.failover
    assert d.parallel_cloud and d.load_reason  # its own words, for the plan's ParallelStart
    assert Reason("parallel_start", d.load_reason) in d.reasons
    assert "no_failover" in d.codes


def test_a_local_engine_started_beside_a_slow_cloud_costs_nothing_extra() -> None:
    pol = Policy(
        name="c", routing={"prefer": "cloud", "ttft_deadline_ms": 500, "objective": "latency"}
    )
    state = LiveState(latency={"local": pred("local", 0.2, 0.9), "cloud": pred("cloud", 2.0)})
    d = decide(FACTS, pol, state)
    assert d.fallback_now and not d.parallel_cloud
    assert "parallel_start" in d.codes
    assert d.load == "parallel_start" and d.fallback == "local" and not d.rescue
    assert "costs" not in d.reason  # the words say no cloud request is paid for


def test_parallel_cloud_false_waits_for_the_deadline_and_says_so() -> None:
    pol = VOICE.with_(hedge={"parallel_cloud": False})
    d = decide(FACTS, pol, MISS)
    assert (d.primary, d.fallback, d.fallback_now, d.fallback_lead) == (
        "local",
        "cloud",
        False,
        False,
    )
    assert d.plan == "single" and not d.parallel_cloud
    assert d.reasons[-1] == Reason(
        "parallel_held",
        "local is preferred but predicted at 437 ms against the 400 ms deadline; policy 'voice' "
        "forbids a parallel cloud start ([hedge] parallel_cloud = false): the cloud starts only "
        "at the "
        "deadline",
    )
    # a local engine predicted in time: no reason added, and still no lead for the cloud
    fine = decide(FACTS, pol, LiveState(latency={"local": pred("local", 0.1)}))
    assert not fine.fallback_now and not fine.fallback_lead
    assert fine.codes == ("policy_prefers",)
    # the default keeps the lead (the cloud may start ahead of the deadline by its own TTFT)
    assert decide(FACTS, VOICE, LiveState(latency={"local": pred("local", 0.1)})).fallback_lead


def test_parallel_cloud_false_still_swaps_to_a_cloud_that_meets_the_deadline() -> None:
    pol = VOICE.with_(hedge={"parallel_cloud": False})
    state = LiveState(latency={"local": pred("local", 0.9), "cloud": pred("cloud", 0.2, 0.3)})
    d = decide(FACTS, pol, state)
    assert (d.primary, d.fallback, d.fallback_now) == ("cloud", "local", False)


@pytest.mark.parametrize(
    ("recent", "parallel"),
    [((0, 0), False), ((0, 3), False), ((0, 4), True), ((1, 9), True), ((2, 9), False)],
)
def test_the_share_cap_counts_this_request_in(recent: tuple[int, int], parallel: bool) -> None:
    pol = VOICE.with_(hedge={"parallel_cloud_share": 0.2})
    state = LiveState(latency=MISS.latency, parallel_recent=recent)
    d = decide(FACTS, pol, state)
    assert d.parallel_cloud is parallel and d.fallback_lead is parallel
    if not parallel:
        started, seen = recent
        assert d.codes[-1] == "parallel_held"
        assert (
            f"policy 'voice' caps parallel cloud starts at 20% of its requests ({started} of the "
            f"last {seen}): the cloud starts only at the deadline" in d.reason
        )  # the words give the share's figures


def test_a_share_cap_does_not_touch_requests_local_can_serve_in_time() -> None:
    pol = VOICE.with_(hedge={"parallel_cloud_share": 0.0})
    d = decide(FACTS, pol, LiveState(latency={"local": pred("local", 0.1)}))
    assert d.fallback_lead and d.codes == ("policy_prefers",)


# ---- the policy fields ------------------------------------------------------------------------


def test_policy_fields_are_validated(tmp_path: Path) -> None:
    assert Policy().hedge.parallel_cloud and Policy().hedge.parallel_cloud_share is None
    bad = {
        "[hedge]\nparallel_cloud_share = 1.5": "parallel_cloud_share",
        "[hedge]\nparallel_cloud_share = -0.1": "parallel_cloud_share",
        "[hedge]\nparallel_cloud_share = nan": "parallel_cloud_share",
        '[hedge]\nparallel_cloud = "no"': "parallel_cloud",
        "[hedge]\nparallel_cloud = false\nparallel_cloud_share = 0.2": "parallel_cloud is false",
    }
    for i, (body, words) in enumerate(bad.items()):
        path = tmp_path / f"p{i}.toml"
        path.write_text(body + "\n")
        with pytest.raises(PolicyError) as info:
            resolve_policy(path)
        assert words in str(info.value), (body, str(info.value))
    ok = tmp_path / "ok.toml"
    ok.write_text('extends = "voice-assistant"\n[hedge]\nparallel_cloud = false\n')
    assert not resolve_policy(ok).hedge.parallel_cloud


def test_presets_say_where_parallel_cloud_starts_are_kept() -> None:
    for name in ("voice-assistant", "code-completion"):
        pol = resolve_policy(name)
        assert (
            pol.routing.prefer == "local"
            and pol.hedge.parallel_cloud
            and pol.hedge.parallel_cloud_share is None
        )
        text = (Path(__file__).parents[2] / "policies" / f"{name}.toml").read_text()
        assert "paid for" in text and "parallel_cloud = true" in text
    assert resolve_policy("npc-dialogue").hedge.parallel_cloud_share == 0.25
    assert resolve_policy("chat").hedge.parallel_cloud  # the default elsewhere


# ---- the race and the client ------------------------------------------------------------------

PRICES = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
FAST = Policy(name="fast", routing={"prefer": "local", "ttft_deadline_ms": 100})


def slow_local(script: list[object], predicted: float = 0.5) -> ScriptedEngine:
    local = ScriptedEngine("local", script=script)  # type: ignore[arg-type]
    local.predicted_ttft_s = predicted  # the engine's own estimate: past the 100 ms deadline
    return local


class EnginesOwnEstimates(LatencyModel):
    """A latency model that never learns: predictions stay the engines' own estimates."""

    def knows(self, name: EngineName) -> bool:
        return False


async def events_of(client: HybridClient, **kw: object) -> tuple[list[Event], Trace]:
    async with client.stream("q", **kw) as s:  # type: ignore[arg-type]
        events = [e async for e in s.events()]
    return events, s.trace


@pytest.mark.anyio
async def test_a_parallel_start_is_a_parallel_start_event_not_a_late_fallback() -> None:
    local = slow_local([0.15, "local"])
    cloud = ScriptedEngine("cloud", script=[0.4, "cloud"])
    async with HybridClient(local=local, cloud=cloud, policy=FAST) as client:
        events, tr = await events_of(client)
        await anyio.sleep(0.01)
        assert cloud.active == 0 and cloud.closed_streams == 1  # the loser was stopped
    route, started = events[0], events[1]
    assert isinstance(route, Route) and isinstance(started, ParallelStart)
    assert started.engine == "cloud" and started.from_engine == "local"
    assert isinstance(started, Fallback)  # compatible: "another engine was started"
    assert [type(e) for e in events if isinstance(e, Fallback)] == [ParallelStart]
    # one reason: the parallel start, not also "cloud starts if no token in 100 ms"
    assert tr.decision is not None and tr.decision.parallel_cloud
    # the wording is the subject: the route says the parallel start, in the same words
    assert "starts if no token" not in route.reason and "starts at once" not in route.reason
    assert started.reason in route.reason
    assert tr.engine == "local" and tr.parallel_engine == "cloud"
    assert tr.parallel_start == started.reason
    assert tr.segments_ms["fallback_started"] == pytest.approx(0)  # at once, with the primary
    assert tr.cost_usd is None  # no prices=: nothing costed
    assert tr.summary()["parallel_start"] == "cloud"


@pytest.mark.anyio
async def test_a_primary_that_loses_its_parallel_start_late_is_not_charged_a_miss() -> None:
    """A parallel start is the decision's answer to a local engine predicted late: the cloud
    winning past the deadline confirms that prediction, and is no evidence for the breaker
    (the demo's slow local engine opened its circuit that way and lost the cascade)."""
    local = slow_local([0.5, "local"])
    cloud = ScriptedEngine("cloud", script=[0.2, "cloud"])  # also past the 100 ms deadline
    latency = EnginesOwnEstimates()
    async with HybridClient(local=local, cloud=cloud, policy=FAST, latency=latency) as client:
        traces = [(await events_of(client))[1] for _ in range(6)]
        breaker = client.breakers["local"]
    assert all(t.parallel_start and t.engine == "cloud" for t in traces)
    assert breaker.state == "closed" and breaker.recent_miss_rate == 0.0
    # the same late loss without a parallel start (no prediction of it) is a miss
    local2 = ScriptedEngine("local", script=[0.5, "local"])
    policy = FAST.with_(hedge={"parallel_cloud": False})
    async with HybridClient(local=local2, cloud=cloud, policy=policy) as client:
        _, tr = await events_of(client)
        assert tr.engine == "cloud" and not tr.parallel_start
        assert client.breakers["local"].recent_miss_rate == 1.0


@pytest.mark.anyio
async def test_the_trace_counts_what_the_guard_settled_for_a_parallel_cloud() -> None:
    local = slow_local([0.15, "local", 0.01, " wins"])
    cloud = ScriptedEngine("cloud", script=[0.5, "cloud"])
    async with HybridClient(local=local, cloud=cloud, policy=FAST, prices=PRICES) as client:
        _, tr = await events_of(client)
        guard = client._guard
        assert guard is not None and guard.ledger is not None
        ledger_usd = guard.ledger.spend("day", "fast").settled_usd
        entries = guard.ledger.entries()
    # the cloud request was sent, then cancelled when the local engine won: the guard settles
    # its prompt (the bound it reserved, no usage came back) and no output tokens
    assert tr.engine == "local" and [s.role for s in tr.spent] == ["parallel"]
    (spend,) = tr.spent
    assert spend.estimated and spend.completion_tokens == 0 and spend.prompt_tokens > 0
    assert spend.usd > 0 and tr.cost_usd == tr.parallel_cost_usd == spend.usd
    assert [e["state"] for e in entries] == ["settled"]
    assert ledger_usd == pytest.approx(spend.usd)  # the trace shows what the ledger holds


@pytest.mark.anyio
async def test_a_deadline_fallback_and_a_plain_cloud_request_are_not_parallel() -> None:
    local = ScriptedEngine("local", script=[0.5, "late"])
    cloud = ScriptedEngine("cloud", script=[0.01, "cloud"])
    async with HybridClient(local=local, cloud=cloud, policy=FAST, prices=PRICES) as client:
        events, tr = await events_of(client)
        _, forced = await events_of(client, engine="cloud")
    assert tr.engine == "cloud" and tr.parallel_start is None and tr.parallel_engine is None
    assert not any(isinstance(e, ParallelStart) for e in events)
    assert [s.role for s in tr.spent] == ["fallback"] and tr.parallel_cost_usd is None
    assert [s.role for s in forced.spent] == ["primary"] and (forced.cost_usd or 0) > 0


@pytest.mark.anyio
async def test_parallel_cloud_false_starts_the_cloud_only_at_the_deadline() -> None:
    pol = FAST.with_(hedge={"parallel_cloud": False})
    local = slow_local([0.3, "late"])
    cloud = ScriptedEngine("cloud", script=[0.01, "cloud"])
    cloud.predicted_ttft_s = 0.2  # misses too; would lead the deadline by 50 ms by default
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        events, tr = await events_of(client)
    fbs = [e for e in events if isinstance(e, Fallback)]
    assert [type(e) for e in fbs] == [Fallback] and tr.parallel_start is None
    assert tr.segments_ms["fallback_started"] == pytest.approx(100)  # the deadline, not ahead
    # held by `parallel_cloud = false` (the policy has no share cap): at the deadline itself
    assert tr.decision is not None and tr.decision.load == "parallel_held"
    assert pol.hedge.parallel_cloud_share is None and not tr.decision.fallback_lead
    assert tr.engine == "cloud"


@pytest.mark.anyio
async def test_the_share_cap_holds_over_a_run_of_requests() -> None:
    pol = FAST.with_(hedge={"parallel_cloud_share": 0.25})
    local = slow_local([0.12, "local"])
    cloud = ScriptedEngine("cloud", script=[0.3, "cloud"])
    latency = EnginesOwnEstimates()
    async with HybridClient(local=local, cloud=cloud, policy=pol, latency=latency) as client:
        traces = [(await client.complete("q")).trace for _ in range(12)]
        started, seen = client.routing.parallel_recent("fast")
        other = FAST.model_copy(update={"name": "other"})  # no cap
        await client.complete("q", policy=other)  # another policy: its own window
        assert client.routing.parallel_recent("fast") == (started, seen)
        assert client.routing.parallel_recent("other") == (1, 1)
    parallel = [tr.parallel_engine == "cloud" for tr in traces]
    # a cloud request paid for and not used counts too: a parallel start, or one started at the
    # deadline and cancelled when the local engine won (issue 25)
    extra = [p or tr.cloud_cancelled for tr, p in zip(traces, parallel, strict=True)]
    assert seen == 12 <= PARALLEL_WINDOW and started == sum(extra)
    assert sum(parallel) <= 3, [tr.decision for tr in traces]  # at most 25% of 12
    assert sum(extra) >= 10  # the cloud started at the deadline lost to the local engine
    held = [tr for tr, p in zip(traces, parallel, strict=True) if not p]
    # held by the 25% share cap (`parallel_cloud` itself is on)
    assert pol.hedge.parallel_cloud and held
    assert all(tr.decision is not None and tr.decision.load == "parallel_held" for tr in held)


# ---- the demo ---------------------------------------------------------------------------------


def test_the_demo_shows_parallel_cloud_starts() -> None:
    rows = [
        Row("voice-assistant", "local", 150.0, 40.0, 20, 900.0, "cloud"),
        Row("chat", "cloud", 300.0, 30.0, 20, 1000.0),
    ]
    table = format_table(rows)
    assert "parallel" in table.splitlines()[0]
    assert table.splitlines()[2].split()[-1] == "cloud" and table.splitlines()[3].endswith("-")
    note = parallel_note(rows)
    assert note.startswith("1 of 2 requests also started the cloud in parallel")
    assert "paid for" in note and "parallel_cloud = false" in note
    assert parallel_note(rows[1:]) == ""
