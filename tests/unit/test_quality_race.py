"""Route for quality, race for latency (issue 25): every decision says what it optimises
(`Decision.objective`); a local backup of a cloud chosen for quality is a rescue whose tokens
are held until the deadline (`Decision.release_s`); the automatic hedge prices the quality a
local answer loses; a prediction never locks an engine out (probes); a cloud request started
and cancelled is counted. The race runs `ScriptedEngine` doubles (timing logic only) on the
virtual clock (tests/unit/conftest.py), so the times asserted are the scripts' own."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hybridllm import Fallback, HybridClient, Policy, Token
from hybridllm.events import EngineName
from hybridllm.routing import Decision, LiveState, RequestFacts, decide
from hybridllm.routing.decide import PROBE_AFTER
from hybridllm.routing.hedging import backup_ttft_s, choose_hedge_delay, lead_s
from hybridllm.routing.inputs import Prediction
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.recorder import Recorder
from hybridllm.runtime.trace import Trace
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

CLOUD_FIRST = Policy(name="q", routing={"prefer": "cloud", "ttft_deadline_ms": 100})
AUTO = Policy(name="auto", routing={"prefer": "auto", "ttft_deadline_ms": 600})
FACTS = RequestFacts(50, 64)


def pred(engine: EngineName, ttft: float, samples: tuple[float, ...] = ()) -> Prediction:
    return Prediction(
        engine, ttft, ttft * 1.5, ttft + 1.0, ttft + 2.0, 0.05, samples=len(samples) or 10,
        ttft_samples=tuple(sorted(samples)),
    )  # fmt: skip


def routed(score: float, cut: float = 0.4) -> RequestFacts:
    return RequestFacts(50, 64, router_score=score, router_threshold=cut)


# ---- 1. every decision says what it optimises --------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "policy", "state", "objective", "primary"),
    [
        (routed(0.7), AUTO, LiveState(), "quality", "cloud"),
        (routed(0.1), AUTO, LiveState(), "cost", "local"),
        (FACTS, CLOUD_FIRST, LiveState(), "quality", "cloud"),
        (FACTS, Policy(name="v", routing={"prefer": "local"}), LiveState(), "latency", "local"),
        (FACTS, AUTO, LiveState(), "latency", "local"),  # no router score: local first
        (RequestFacts(50, 64, privacy_kinds=frozenset({"email"})), CLOUD_FIRST, LiveState(),
         "privacy", "local"),
        (FACTS, CLOUD_FIRST, LiveState(budget_fits=False), "cost", "local"),
        (FACTS, CLOUD_FIRST, LiveState(cloud_circuit_open=True), "availability", "local"),
        (RequestFacts(50, 64, forced="cloud"), AUTO, LiveState(), "caller", "cloud"),
        (FACTS, CLOUD_FIRST.with_(routing={"objective": "latency"}), LiveState(), "latency",
         "cloud"),
    ],
)  # fmt: skip
def test_the_decision_records_why_its_primary_was_chosen(
    facts: RequestFacts, policy: Policy, state: LiveState, objective: str, primary: str
) -> None:
    d = decide(facts, policy, state)
    assert (d.objective, d.primary) == (objective, primary), d.reasons


def test_a_load_swap_is_a_latency_decision() -> None:
    pol = Policy(name="v", routing={"prefer": "local", "ttft_deadline_ms": 400})
    d = decide(FACTS, pol, LiveState(local_queue_s=1.0))
    assert (d.primary, d.load, d.objective) == ("cloud", "local_queue", "latency")


# ---- 2. a backup for a quality decision rescues; it does not compete ----------------------------


def test_a_cloud_chosen_for_quality_keeps_the_request_when_predicted_late() -> None:
    """Today's rules swapped to the local engine ("cloud predicted TTFT ... -> local"), or
    started it in parallel to win the race; a quality decision keeps the cloud and holds the
    local rescue until the deadline."""
    state = LiveState(latency={"cloud": pred("cloud", 0.657), "local": pred("local", 0.15)})
    d = decide(routed(0.44, 0.43), AUTO, state)
    assert (d.primary, d.fallback, d.objective) == ("cloud", "local", "quality")
    assert d.load is None and not d.fallback_now and d.release_s == pytest.approx(0.6)
    assert d.rescue and "quality_keeps" in d.codes


def test_a_rescue_that_cannot_make_the_deadline_waits_for_the_clouds_p95() -> None:
    """Both past the 600 ms deadline, the cloud expected within a deadline of the device:
    released at its own first token, the device's answer would replace the cloud's for less
    time than its quality is worth (the benchmark's long prompts); it is held to the cloud's
    p95 instead, at most a deadline past its own first token (a stalled cloud is still
    rescued, there)."""

    def release(cloud: Prediction, local: float, policy: Policy = AUTO) -> Decision:
        state = LiveState(latency={"cloud": cloud, "local": pred("local", local)})
        return decide(routed(0.9), policy, state)

    no_sooner = release(pred("cloud", 1.2), 1.4)
    assert no_sooner.rescue and no_sooner.release_s == pytest.approx(1.8)  # p95: 1.5 x 1.2
    assert "rescue_no_sooner" in no_sooner.codes
    assert release(pred("cloud", 1.2), 0.9).release_s == pytest.approx(1.5)  # 0.9 + a deadline
    tail = replace(pred("cloud", 1.2), ttft_p95_s=8.0)  # a heavy tail: at most a deadline more
    assert release(tail, 1.4).release_s == pytest.approx(2.0)
    kept = [
        release(pred("cloud", 1.2), 0.3),  # the rescue makes the deadline
        release(pred("cloud", 3.0), 0.9),  # the cloud not expected within a deadline of it
        release(pred("cloud", 1.2), 0.9, AUTO.with_(hedge={"quality_weight_ms": 100})),  # cheap
    ]
    for d in kept:
        assert d.release_s == pytest.approx(0.6) and "rescue_no_sooner" not in d.codes


async def test_a_rescue_held_to_the_clouds_p95_lets_a_late_cloud_answer() -> None:
    """The race honours the later release: the cloud's token at 1.3 s wins over the device's,
    ready at 1.1 s, both past the 600 ms deadline."""
    cloud = ScriptedEngine("cloud", tokens=["Paris", "."], ttft_s=1.3, tpot_s=0.01)
    local = ScriptedEngine("local", tokens=["Lyon", "."], ttft_s=1.1, tpot_s=0.01)
    pol = Policy(name="q", routing={"prefer": "cloud", "ttft_deadline_ms": 600})
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
        for cloud_s in (1.1, 1.2, 1.3, 1.4, 1.5, 1.6):  # expected 1.35 s, p95 past 1.5 s
            client.routing.latency.engine("cloud").observe(0, cloud_s)
            client.routing.latency.engine("local").observe(0, 1.4)
        s = client.stream("Capital of France?", max_tokens=8)
        async with s:
            text = "".join([t async for t in s])
    assert (text, s.trace.engine) == ("Paris.", "cloud")
    assert s.trace.decision is not None and "rescue_no_sooner" in s.trace.decision.codes


def test_without_a_deadline_the_rescue_waits_for_a_failure() -> None:
    d = decide(FACTS, Policy(name="c", routing={"prefer": "cloud"}), LiveState())
    assert d.release_s == math.inf and d.rescue


def test_a_latency_decision_still_lets_the_first_token_win() -> None:
    voice = Policy(name="v", routing={"prefer": "local", "ttft_deadline_ms": 400})
    d = decide(FACTS, voice, LiveState(latency={"local": pred("local", 0.1)}))
    assert d.release_s is None and not d.rescue


async def test_a_cloud_token_before_the_deadline_wins_over_a_ready_local_rescue() -> None:
    """The local engine starts ahead of the deadline (its lead) and has its first token at
    60 ms; it is held, the cloud's token at 90 ms (inside the 100 ms deadline) serves."""
    local = ScriptedEngine("local", script=[0.01, "local"])
    cloud = ScriptedEngine("cloud", script=[0.09, "cloud"])
    local.predicted_ttft_s = 0.05  # starts at 100 - 50 = 50 ms
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        async with client.stream("q") as s:
            events = [e async for e in s.events()]
    tokens = [e for e in events if isinstance(e, Token)]
    assert [t.engine for t in tokens] == ["cloud"] and s.trace.ttft_ms == pytest.approx(90)
    assert len(local.requests) == 1 and s.trace.cloud_cancelled is False
    # the local fallback started, as a rescue: its tokens held (`release_s`)
    assert s.trace.decision is not None and s.trace.decision.rescue
    assert [(e.to_engine, e.cause) for e in events if isinstance(e, Fallback)] == [
        ("local", "deadline")
    ]


async def test_a_late_cloud_releases_the_held_rescue_at_the_deadline_itself() -> None:
    """The rescue is instant: its held first token goes out at the deadline (100 ms), not at
    the deadline plus its own TTFT."""
    local = ScriptedEngine("local", script=[0.03, "loc", 0.01, "al"])
    cloud = ScriptedEngine("cloud", script=[0.5, "cloud"])
    local.predicted_ttft_s = 0.05
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        async with client.stream("q") as s:
            text = "".join([t async for t in s])
    assert text == "local" and s.trace.engine == "local"
    assert s.trace.ttft_ms == pytest.approx(100)
    assert "rescue_released" in s.trace.marks


async def test_a_held_rescue_parks_at_its_first_token_and_goes_on_from_it() -> None:
    """The rescue's first token (80 ms) is held and its stream stopped there, so it does not
    decode beside the cloud; at the deadline (100 ms) the token goes out and the same engine
    goes on from it (what is left of max_tokens), its next tokens 10 and 20 ms later."""
    local = ScriptedEngine("local", script=[0.03, "loc", 0.01, "al", 0.01, "ly"])
    cloud = ScriptedEngine("cloud", script=[0.5, "cloud"])
    local.predicted_ttft_s = 0.05  # starts at 50 ms
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        async with client.stream("q", max_tokens=8) as s:
            text = "".join([t async for t in s])
    assert text == "locally" and s.trace.engine == "local"
    assert [r.assistant_prefix for r in local.requests] == ["", "loc"]
    assert local.requests[1].max_tokens == 7
    assert local.emitted == 3  # "al" and "ly" once: the parked stream stopped at "loc"
    ms = [round((t - s.trace.t_start) * 1e3) for t in s.trace.token_times]
    assert ms == [100, 110, 120] and s.trace.completion_tokens == 3
    assert s.trace.marks["rescue_first_token"] - s.trace.t_start == pytest.approx(0.08)
    assert "rescue_resumed" in s.trace.marks


async def test_a_cloud_failure_releases_a_parked_rescue_which_goes_on() -> None:
    from hybridllm.errors import CloudConnectionError

    local = ScriptedEngine("local", script=[0.03, "loc", 0.01, "al"])
    cloud = ScriptedEngine("cloud", script=[0.09, CloudConnectionError("reset")])
    local.predicted_ttft_s = 0.05  # starts at 50 ms, parked at 80 ms
    pol = CLOUD_FIRST.with_(routing={"retries": 0})
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        done = await client.complete("q")
    assert done.text == "local" and [r.assistant_prefix for r in local.requests] == ["", "loc"]
    ms = [round((t - done.trace.t_start) * 1e3) for t in done.trace.token_times]
    assert ms == [90, 100]  # released by the failure at 90 ms, not at the deadline


async def test_a_parked_rescue_whose_answer_was_its_first_token_ends_there() -> None:
    """The rescue's one-word answer ("here", no sentence end) is parked; on the release the same
    engine goes on from it and stops at once: its own end, not a failed continuation (no
    failover to the late cloud, whose text would follow it)."""
    local = ScriptedEngine("local", script=[0.03, "here"])
    cloud = ScriptedEngine("cloud", script=[0.5, "late"])
    local.predicted_ttft_s = 0.05
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        done = await client.complete("q")
    assert done.text == "here" and done.trace.engine == "local"
    assert [r.assistant_prefix for r in local.requests] == ["", "here"]
    assert done.trace.fallback_cause == "deadline" and done.trace.finish_reason == "stop"
    assert [s.kind for s in done.trace.seams] == ["clean"]  # it stopped where it was


async def test_a_parked_rescue_loses_to_a_cloud_token_before_the_deadline() -> None:
    local = ScriptedEngine("local", script=[0.01, "loc", 0.01, "al"])
    cloud = ScriptedEngine("cloud", script=[0.09, "cloud"])
    local.predicted_ttft_s = 0.05
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        done = await client.complete("q")
    assert done.text == "cloud" and len(local.requests) == 1 and local.emitted == 1


async def test_a_one_token_rescue_is_not_parked() -> None:
    """One token asked for: the held token is the whole answer, nothing to go on from."""
    local = ScriptedEngine("local", script=[0.03, "loc"])
    cloud = ScriptedEngine("cloud", script=[0.5, "cloud"])
    local.predicted_ttft_s = 0.05
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        done = await client.complete("q", max_tokens=1)
    assert done.text == "loc" and len(local.requests) == 1


async def test_a_rescue_of_an_engine_that_cannot_continue_is_not_parked() -> None:
    local = ScriptedEngine("local", script=[0.03, "loc", 0.01, "al"], supports_continuation=False)
    cloud = ScriptedEngine("cloud", script=[0.5, "cloud"])
    local.predicted_ttft_s = 0.05
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        done = await client.complete("q")
    assert done.text == "local" and len(local.requests) == 1
    assert "rescue_resumed" not in done.trace.marks


async def test_a_cloud_failure_releases_the_rescue_at_once() -> None:
    from hybridllm.errors import CloudConnectionError

    local = ScriptedEngine("local", script=[0.03, "local"])
    cloud = ScriptedEngine("cloud", script=[0.01, CloudConnectionError("reset")])
    local.predicted_ttft_s = 0.05
    pol = CLOUD_FIRST.with_(routing={"retries": 0})
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        done = await client.complete("q")
    # the cloud failed at 10 ms: the local engine starts then and serves at 40 ms, not 100 ms
    assert done.text == "local" and done.trace.ttft_ms == pytest.approx(40)


async def test_a_fixed_hedge_only_prepares_the_rescue() -> None:
    local = ScriptedEngine("local", script=[0.01, "local"])
    cloud = ScriptedEngine("cloud", script=[0.08, "cloud"])
    pol = CLOUD_FIRST.with_(hedge={"after_ms": 10}, plans=["single", "hedge"])
    async with HybridClient(local=local, cloud=cloud, policy=pol) as client:
        done = await client.complete("q")
    assert done.text == "cloud" and len(local.requests) == 1  # started at 10 ms, held, lost


# ---- 3. the automatic hedge prices quality ------------------------------------------------------

HEAVY = (0.12, 0.14, 0.15, 0.15, 0.16, 0.17, 0.18, 0.2, 0.25, 0.3, 0.45, 0.7, 1.2, 3.0, 10.0)


def test_the_quality_cost_makes_a_hard_prompt_wait_and_lets_an_easy_one_hedge() -> None:
    local = (0.05, 0.05, 0.06)
    free = choose_hedge_delay(HEAVY, local, cap_s=0.55)
    assert free.delay_s is not None and free.delay_s < 0.2  # no quality price: goes early
    hard = choose_hedge_delay(HEAVY, local, cap_s=0.55, hold_s=0.6, quality_s=0.9 * 10)
    assert hard.delay_s is None or hard.held  # the rescue's answer waits for the deadline
    easy = choose_hedge_delay(HEAVY, local, cap_s=0.55, hold_s=0.6, quality_s=0.01 * 10)
    assert easy.delay_s is not None and easy.delay_s < 0.55


def test_the_auto_hedge_of_a_quality_decision_delivers_only_where_quality_allows() -> None:
    pol = AUTO.with_(hedge={"after_ms": "auto"}, plans=["single", "hedge"])
    state = LiveState(
        latency={"cloud": pred("cloud", 0.2, HEAVY), "local": pred("local", 0.05, (0.05,) * 5)}
    )
    hard = decide(routed(0.9), pol, state)
    assert hard.objective == "quality" and hard.release_s == pytest.approx(0.6)
    easy = decide(routed(0.02, 0.01), pol, state)  # sent to the cloud, but rarely wrong locally
    assert easy.plan == "hedge" and easy.release_s == easy.hedge_s
    assert easy.hedge_s is not None and easy.hedge_s < 0.6


# ---- 4. evidence, not two samples; no lock-out -------------------------------------------------


def test_an_engine_kept_from_a_first_token_is_probed() -> None:
    voice = Policy(name="v", routing={"prefer": "local", "ttft_deadline_ms": 400})
    latency = {"local": pred("local", 0.52), "cloud": pred("cloud", 0.1)}
    kept = decide(FACTS, voice, LiveState(latency=latency, unmeasured={"local": 3}))
    assert (kept.primary, kept.load) == ("cloud", "faster_fallback")
    probed = decide(FACTS, voice, LiveState(latency=latency, unmeasured={"local": PROBE_AFTER}))
    assert probed.load is None and probed.primary == "local" and not probed.fallback_now
    assert probed.probe == "local" and kept.probe is None
    assert "probe" in probed.codes


async def test_a_local_engine_predicted_slow_is_not_locked_out_by_a_faster_cloud() -> None:
    """The voice case: the local engine predicted past the deadline, the cloud started in
    parallel wins every race, so the local engine is cancelled before its first token and its
    prediction never moves. After `PROBE_AFTER` requests it is probed, measured, and serves."""
    local = ScriptedEngine("local", script=[0.02, "local"])
    local.predicted_ttft_s = 0.5  # the engine's own estimate, until it has served once
    cloud = ScriptedEngine("cloud", script=[0.01, "cloud"])
    voice = Policy(name="v", routing={"prefer": "local", "ttft_deadline_ms": 100})
    async with HybridClient(local=local, cloud=cloud, policy=voice) as client:
        engines = [(await client.complete("q")).trace.engine for _ in range(PROBE_AFTER + 4)]
    assert engines[:PROBE_AFTER] == ["cloud"] * PROBE_AFTER
    assert engines[PROBE_AFTER:] == ["local"] * 4, engines
    assert len(cloud.requests) == PROBE_AFTER  # no parallel cloud start once measured


def test_the_latency_model_counts_requests_since_an_engine_was_measured() -> None:
    model = LatencyModel()
    for _ in range(3):
        rec = Recorder(Trace(t_start=0.0, engine="cloud", started=("local", "cloud")))
        rec.token(0.1)
        model.observe_trace(rec.freeze(), 20)
    assert model.unmeasured["local"] == 3 and model.unmeasured["cloud"] == 0


# ---- 5. cancelled cloud requests are counted ---------------------------------------------------


async def test_a_cloud_request_started_and_cancelled_is_counted() -> None:
    local = ScriptedEngine("local", script=[0.15, "local"])
    cloud = ScriptedEngine("cloud", script=[1.0, "cloud"])
    voice = Policy(name="v", routing={"prefer": "local", "ttft_deadline_ms": 100})
    async with HybridClient(local=local, cloud=cloud, policy=voice) as client:
        done = await client.complete("q")  # the cloud starts at the deadline, the local wins
        assert client.routing.parallel_recent("v") == (1, 1)
    assert done.trace.engine == "local" and done.trace.cloud_cancelled
    assert done.trace.summary()["cloud_cancelled"] is True


@pytest.mark.parametrize(
    ("local_ttft", "started", "answered", "cause", "why"),
    [
        # a race's fallback leads the deadline by at most half of it; a rescue by its whole
        # TTFT (80 ms of a 100 ms deadline): it starts at 20 ms, its token goes out at 100 ms
        (
            0.08,
            20,
            100,
            "deadline",
            "no token from cloud within 20 ms (started ahead of the 100 ms deadline)",
        ),
        # 150 ms of local TTFT: any other fallback would start at 50 ms and answer at 200 ms;
        # the rescue cannot be ready by the deadline, so it starts at once and answers at 150
        (
            0.15,
            0,
            150,
            "rescue",
            "local starts at once as a rescue (it could not be ready by the 100 ms deadline if it "
            "waited)",
        ),
    ],
)
async def test_a_rescue_starts_by_its_whole_predicted_ttft_or_at_once(
    local_ttft: float, started: float, answered: float, cause: str, why: str
) -> None:
    local = ScriptedEngine("local", script=[local_ttft, "local"])
    cloud = ScriptedEngine("cloud", script=[0.5, "cloud"])
    local.predicted_ttft_s = local_ttft
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        done = await client.complete("q")
    assert done.text == "local" and done.trace.ttft_ms == pytest.approx(answered)
    assert done.trace.segments_ms["fallback_started"] == pytest.approx(started)
    assert done.trace.fallback_reason == f"{why}; a rescue: its tokens are held until 100 ms"
    assert done.trace.fallback_cause == cause


def test_a_rescue_leads_by_its_p95_and_at_most_the_whole_deadline() -> None:
    p = pred("local", 0.2)  # p95 0.3 s
    assert backup_ttft_s(p, rescue=True) == pytest.approx(0.3)
    assert backup_ttft_s(p, rescue=False) == pytest.approx(0.2)
    assert lead_s(0.3, 0.6, rescue=True) == pytest.approx(0.3)
    assert lead_s(0.8, 0.6, rescue=True) == pytest.approx(0.6)  # not ready: at once
    assert lead_s(0.8, 0.6) == pytest.approx(0.3)  # a competitor: at most half the deadline


# ---- after a slow spell: how many requests until the cloud answers again ------------------------


async def slow_then_quick(policy: Policy, slow: int, after: int) -> list[str | None]:
    """`slow` requests with a cloud past the deadline, then `after` with a quick one: which
    engine served each of the quick ones."""
    local = ScriptedEngine("local", script=[0.03, "local"])
    cloud = ScriptedEngine("cloud", script=[0.4, "cloud"])
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        for _ in range(slow):
            await client.complete("q")
        cloud.script = [0.02, "cloud"]
        return [(await client.complete("q")).trace.engine for _ in range(after)]


async def test_a_quality_decision_returns_to_the_cloud_at_its_first_quick_request() -> None:
    served = await slow_then_quick(CLOUD_FIRST, slow=12, after=4)
    assert served == ["cloud"] * 4


async def test_a_latency_decision_returns_to_a_quick_cloud_within_the_probe_bound() -> None:
    """Cloud-first for latency: a slow cloud is swapped out by the prediction (or its slow
    circuit); once quick again it is back within `PROBE_AFTER` + 1 requests, not never."""
    latency = CLOUD_FIRST.with_(routing={"objective": "latency"})
    served = await slow_then_quick(latency, slow=12, after=PROBE_AFTER + 3)
    first = served.index("cloud")
    assert first <= PROBE_AFTER + 1, served
    assert served[first:] == ["cloud"] * (len(served) - first)


def test_explain_names_the_objective_and_the_rescue() -> None:
    from hybridllm.cli.explain import as_json, render

    state = LiveState(latency={"cloud": pred("cloud", 0.2), "local": pred("local", 0.1)})
    facts = routed(0.7)
    d = decide(facts, AUTO, state)
    text = render(d, facts, state, AUTO)
    assert "objective quality (local is a rescue: its tokens are held until 600 ms)" in text
    assert '"objective": "quality"' in as_json(d, facts, state)


def test_no_parallel_start_for_a_fallback_predicted_no_sooner() -> None:
    """Both engines past the deadline, the cloud slower: starting it in parallel would only pay
    for a cloud request that cannot win (the bench's chat run sent 8 of 8 that way)."""
    voice = Policy(name="v", routing={"prefer": "local", "ttft_deadline_ms": 500})
    state = LiveState(latency={"local": pred("local", 1.7), "cloud": pred("cloud", 2.1)})
    d = decide(FACTS, voice, state)
    assert d.load is None and not d.fallback_now and d.primary == "local"
    assert "no_parallel_start" in d.codes


def test_a_slow_rescue_starts_sooner_but_stays_held_for_a_hard_prompt() -> None:
    """A cloud predicted far past the 3 s deadline and a local engine that needs 4 s: a lead of
    half the deadline would have the rescue at 5.5 s (p99: the cloud's own 5 s); the
    hedge starts it at once (4 s) and
    still holds it (a hard prompt's local answer never goes out before the deadline)."""
    cloud = [3.1 + 0.1 * i for i in range(20)]
    c = choose_hedge_delay(cloud, [4.0], cap_s=1.5, hold_s=3.0, quality_s=10.0)
    assert (c.delay_s, c.held) == (0.0, True) and c.tail_s == pytest.approx(4.0)
    assert c.baseline_tail_s == pytest.approx(5.0)  # the rescue at 5.5 s: the cloud's 5 s first
    easy = choose_hedge_delay(cloud, [1.0], cap_s=2.0, hold_s=3.0, quality_s=0.01)
    assert easy.delay_s == 0.0 and not easy.held  # an easy prompt's answer goes out at 1 s


@pytest.mark.parametrize(
    ("tables", "field"),
    [
        ({"routing": {"objective": "speed"}}, "routing.objective"),
        ({"hedge": {"quality_weight_ms": -1}}, "hedge.quality_weight_ms"),
        ({"hedge": {"quality_weight_ms": "x"}}, "hedge.quality_weight_ms"),
        ({"hedge": {"quality_weight_ms": True}}, "hedge.quality_weight_ms"),
    ],
)
def test_a_bad_objective_or_quality_weight_is_a_policy_error_naming_the_field(
    tables: dict[str, dict[str, object]], field: str
) -> None:
    from hybridllm.errors import PolicyError

    with pytest.raises(PolicyError, match=field):
        Policy(name="p", **tables)  # type: ignore[arg-type]
