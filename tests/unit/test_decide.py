"""`decide()`: properties over random facts, policies and live states (hypothesis), and the
readable reasons of the main cases."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from hybridllm import Policy
from hybridllm.events import EngineName
from hybridllm.policy import Budget
from hybridllm.routing import Decision, LiveState, RequestFacts, decide
from hybridllm.routing.inputs import Prediction

ENGINES: tuple[EngineName, ...] = ("local", "cloud")


def pred(
    engine: EngineName, ttft: float, p95: float | None = None, samples: int = 10
) -> Prediction:
    p95 = ttft if p95 is None else p95
    return Prediction(engine, ttft, p95, ttft + 1.0, p95 + 2.0, 0.05, samples=samples)


seconds = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    prefer = draw(st.sampled_from(["local", "cloud", "auto"]))
    allow_cloud = draw(st.booleans()) if prefer != "cloud" else True
    order = draw(
        st.sampled_from(
            [None, (prefer,), (prefer, "local" if prefer == "cloud" else "cloud")]
            if prefer != "auto"
            else [None, ("local",), ("cloud", "local"), ("local", "cloud")]
        )
    )
    if order == ("cloud",) and not allow_cloud:
        order = None
    plans = draw(st.sampled_from([("single",), ("single", "hedge")]))
    hedge = draw(st.sampled_from([None, 50.0, "auto"])) if "hedge" in plans else None
    parallel = draw(st.booleans())
    share = draw(st.one_of(st.none(), unit)) if parallel else None
    return Policy(
        name="p",
        plans=plans,
        budget=Budget(on_exceeded=draw(st.sampled_from(["local", "fail"]))),
        routing={
            "prefer": prefer,
            "allow_cloud": allow_cloud,
            "fallback_order": order,
            "ttft_deadline_ms": draw(
                st.one_of(st.none(), st.floats(min_value=1.0, max_value=5000.0))
            ),
        },
        hedge={"after_ms": hedge, "parallel_cloud": parallel, "parallel_cloud_share": share},
        privacy={"mode": draw(st.sampled_from(["off", "keep-local", "block"]))},
    )


@st.composite
def facts(draw: st.DrawFn) -> RequestFacts:
    kinds = draw(st.one_of(st.none(), st.frozensets(st.sampled_from(["email", "iban", "api_key"]))))
    return RequestFacts(
        prompt_tokens=draw(st.integers(min_value=1, max_value=8000)),
        max_tokens=draw(st.integers(min_value=1, max_value=2048)),
        router_score=draw(st.one_of(st.none(), unit)),
        router_threshold=draw(st.one_of(st.none(), unit)),
        privacy_kinds=kinds,
        forced=draw(st.sampled_from([None, None, None, "local", "cloud"])),
    )


@st.composite
def states(draw: st.DrawFn) -> LiveState:
    available = draw(
        st.sampled_from([frozenset(ENGINES), frozenset({"local"}), frozenset({"cloud"})])
    )
    latency = {}
    for e in available:
        if draw(st.booleans()):
            t = draw(seconds)
            latency[e] = pred(e, t, t + draw(seconds), draw(st.integers(0, 20)))
    return LiveState(
        available=available,
        latency=latency,
        local_queue_s=draw(seconds),
        cloud_circuit_open=draw(st.booleans()),
        budget_fits=draw(st.booleans()),
        budget_detail="day cap 0.50 USD, left 0.01 USD",
        parallel_recent=draw(
            st.integers(0, 20).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))
        ),
    )


def touches_cloud(d: Decision) -> bool:
    return "cloud" in d.engines


@settings(max_examples=300, deadline=None)
@given(facts(), policies(), states())
def test_invariants(f: RequestFacts, p: Policy, s: LiveState) -> None:
    d = decide(f, p, s)
    # always explained, always one of the plans, engines consistent with the plan
    assert d.reasons and all(r.strip() for r in d.reasons)
    assert d.plan in ("single", "hedge", "refuse")
    assert (d.plan == "refuse") == (d.primary is None)
    if d.primary is not None:
        assert d.primary in s.available and d.primary != d.fallback
        assert d.fallback is None or d.fallback in s.available
    if d.plan == "hedge":
        assert d.fallback is not None and d.hedge_s is not None and "hedge" in p.plans
    if d.fallback_now:
        assert d.fallback is not None and d.plan == "single"
    # a parallel cloud start only where the policy allows one, within its share, and said
    if d.parallel_cloud:
        assert p.hedge.parallel_cloud and any("it costs a cloud request" in r for r in d.reasons)
        started, seen = s.parallel_recent
        cap = p.hedge.parallel_cloud_share
        assert cap is None or (started + 1) / (seen + 1) <= cap
    if not d.fallback_lead:
        assert d.fallback == "cloud" and not d.fallback_now
    # deterministic: a pure function of its inputs
    assert decide(f, p, s) == d
    # a policy that keeps requests on the device never yields a cloud engine
    if not p.cloud_allowed or p.privacy.mode != "off" and f.privacy_kinds != frozenset():
        assert not touches_cloud(d)
    # privacy "block" with a finding refuses
    if p.privacy.mode == "block" and f.privacy_kinds:
        assert d.plan == "refuse" and any("privacy" in r for r in d.reasons)
    # a budget that cannot cover the worst case never yields a cloud request
    if not s.budget_fits:
        assert not touches_cloud(d)
    # an open circuit never yields a cloud primary while the local engine may serve
    local_ok = "local" in s.available and "local" in p.order
    if s.cloud_circuit_open and local_ok and f.forced is None:
        assert d.primary != "cloud"
        assert not touches_cloud(d)


@settings(max_examples=200, deadline=None)
@given(facts(), policies(), states())
def test_a_deadline_local_cannot_meet_never_goes_local_only(
    f: RequestFacts, p: Policy, s: LiveState
) -> None:
    """When the cloud is allowed, healthy and paid for, and the local engine is predicted (or
    queued) past the deadline, the cloud takes part: as the primary or started at once."""
    d = decide(f, p, s)
    deadline = d.deadline_s
    local = s.latency.get("local")
    cloud_usable = (
        "cloud" in s.available
        and p.cloud_allowed
        and "cloud" in p.order
        and "local" in p.order
        and not (p.privacy.mode != "off" and f.privacy_kinds != frozenset())
        and s.budget_fits
        and not s.cloud_circuit_open
        and f.forced is None
        and "local" in s.available
    )
    local_misses = deadline is not None and (
        s.local_queue_s > deadline or (local is not None and local.ttft_s > deadline)
    )
    if cloud_usable and local_misses and d.primary == "local":
        assert d.fallback == "cloud" and any("deadline" in r for r in d.reasons)
        # started in parallel at once, or held back by the policy to the deadline itself
        assert d.fallback_now or not d.fallback_lead
        assert d.fallback_now == (not any("starts only at the deadline" in r for r in d.reasons))


# ---- readable reasons for the main cases ---------------------------------------------------------

CHAT = Policy(name="chat", routing={"prefer": "auto", "ttft_deadline_ms": 500})
BOTH = LiveState(latency={"local": pred("local", 0.2), "cloud": pred("cloud", 0.3, 0.45)})


def test_router_score_picks_the_engine() -> None:
    hard = decide(RequestFacts(50, 64, router_score=0.81, router_threshold=0.62), CHAT, BOTH)
    assert hard.primary == "cloud" and hard.fallback == "local"
    assert "router score 0.81 >= threshold 0.62 -> cloud" in hard.reasons
    easy = decide(RequestFacts(50, 64, router_score=0.2, router_threshold=0.62), CHAT, BOTH)
    assert easy.primary == "local" and "router score 0.20 < threshold 0.62 -> local" in easy.reason


def test_privacy_finding_keeps_the_request_local() -> None:
    pol = CHAT.with_(privacy={"mode": "keep-local"})
    d = decide(RequestFacts(50, 64, 0.9, 0.5, frozenset({"email"})), pol, BOTH)
    assert d.engines == ("local",) and "privacy: email found -> local only" in d.reasons


def test_budget_goes_local_or_refuses() -> None:
    state = LiveState(budget_fits=False, budget_detail="day cap 0.50 USD, left 0.01 USD")
    cloudy = Policy(name="b", routing={"prefer": "cloud"})
    d = decide(RequestFacts(50, 64), cloudy, state)
    assert d.engines == ("local",)
    assert "budget: cannot cover the cloud request (day cap 0.50 USD, left 0.01 USD) -> local" in (
        d.reasons
    )
    strict = cloudy.model_copy(update={"budget": Budget(on_exceeded="fail")})
    refused = decide(RequestFacts(50, 64), strict, state)
    assert refused.plan == "refuse" and "refused" in refused.reason


def test_local_queue_past_the_deadline_goes_to_the_cloud() -> None:
    state = LiveState(latency=BOTH.latency, local_queue_s=2.1)
    d = decide(RequestFacts(50, 64), CHAT, state)
    assert (d.primary, d.fallback) == ("cloud", "local") and not d.fallback_now
    assert "local queue 2100 ms > deadline 500 ms -> cloud" in d.reasons


def test_long_local_prefill_swaps_when_the_cloud_meets_the_deadline() -> None:
    state = LiveState(latency={"local": pred("local", 0.9), "cloud": pred("cloud", 0.3, 0.45)})
    d = decide(RequestFacts(1000, 64), CHAT, state)
    assert d.primary == "cloud" and "cloud p95 450 ms meets it" in d.reason


def test_unknown_cloud_latency_starts_both_at_once() -> None:
    state = LiveState(latency={"local": pred("local", 0.9)})
    d = decide(RequestFacts(1000, 64), CHAT, state)
    assert (d.primary, d.fallback, d.fallback_now) == ("local", "cloud", True)
    assert "local is preferred but predicted at 900 ms against the 500 ms deadline" in d.reason
    assert "the cloud starts in parallel now (it costs a cloud request" in d.reason


def test_slow_cloud_swaps_to_local() -> None:
    pol = Policy(name="c", routing={"prefer": "cloud", "ttft_deadline_ms": 500})
    state = LiveState(latency={"local": pred("local", 0.2, 0.3), "cloud": pred("cloud", 2.0)})
    d = decide(RequestFacts(50, 64), pol, state)
    assert (d.primary, d.fallback) == ("local", "cloud")
    assert "cloud predicted TTFT 2000 ms > deadline 500 ms" in d.reason


def test_open_circuit_goes_local_at_once() -> None:
    pol = Policy(name="c", routing={"prefer": "cloud", "ttft_deadline_ms": 500})
    d = decide(RequestFacts(50, 64), pol, LiveState(cloud_circuit_open=True))
    assert d.engines == ("local",) and "cloud circuit open -> local" in d.reasons


def heavy(engine: EngineName, samples: list[float], ttft: float = 0.15) -> Prediction:
    return Prediction(
        engine, ttft, ttft * 3, ttft + 1.0, ttft * 3 + 2.0, 0.05, samples=len(samples),
        ttft_samples=tuple(sorted(samples)),
    )  # fmt: skip


# a heavy-tailed cloud: most first tokens near 150 ms, one in eight at 3 s or a 10 s stall
CLOUD_TAIL = [0.1, 0.12, 0.13, 0.15, 0.15, 0.16, 0.18, 0.2, 0.22, 0.25, 0.3, 0.35, 0.5, 3.0, 10.0]


def test_auto_hedge_waits_for_history() -> None:
    pol = Policy(
        name="t", routing={"prefer": "cloud", "ttft_deadline_ms": 600}, hedge={"after_ms": "auto"}
    )
    young = LiveState(
        latency={"cloud": heavy("cloud", CLOUD_TAIL[:3]), "local": pred("local", 0.05)}
    )
    assert decide(RequestFacts(10, 8), pol, young).plan == "single"


def test_auto_hedge_with_a_cheap_local_backup_goes_early_in_a_heavy_tail() -> None:
    pol = Policy(
        name="t", routing={"prefer": "cloud", "ttft_deadline_ms": 600}, hedge={"after_ms": "auto"}
    )
    state = LiveState(latency={"cloud": heavy("cloud", CLOUD_TAIL), "local": pred("local", 0.05)})
    d = decide(RequestFacts(10, 8), pol, state)
    assert d.plan == "hedge" and d.hedge_s is not None and d.hedge_s < 0.1
    assert "auto hedge: local starts after" in d.reason and "device time" in d.reason


def test_auto_hedge_with_a_dear_cloud_backup_waits_or_skips() -> None:
    local = heavy("local", [0.1 + 0.002 * i for i in range(20)], ttft=0.12)  # a tight local
    pol = Policy(
        name="t", routing={"prefer": "local", "ttft_deadline_ms": 600}, hedge={"after_ms": "auto"}
    )
    d = decide(
        RequestFacts(10, 8), pol, LiveState(latency={"local": local, "cloud": pred("cloud", 0.2)})
    )
    assert d.plan == "single" and "auto hedge: none pays" in d.reason


def test_private_preset_never_leaves_the_device() -> None:
    from hybridllm.policy import resolve_policy

    d = decide(RequestFacts(10, 8, privacy_kinds=frozenset()), resolve_policy("private"), BOTH)
    assert d.engines == ("local",) and "never leaves the device" in d.reason


# ---- decode speed (tpot_target_ms) and the handoff plan ---------------------------------------


def speed(engine: EngineName, ttft: float, tpot: float) -> Prediction:
    return Prediction(engine, ttft, ttft * 1.5, ttft + 100 * tpot, ttft + 200 * tpot, tpot)


SLOW_LOCAL = {"local": speed("local", 0.1, 0.06), "cloud": speed("cloud", 0.3, 0.01)}


def test_slow_local_decode_on_a_long_answer_hands_off() -> None:
    pol = Policy(
        name="t", plans=("single", "handoff"), routing={"prefer": "local", "tpot_target_ms": 40}
    )
    d = decide(RequestFacts(20, 256), pol, LiveState(latency=SLOW_LOCAL))
    assert d.plan == "handoff" and d.primary == "local" and d.fallback == "cloud"
    assert "local decodes at 60 ms/token, slower than the 40 ms target" in d.reason
    assert "handoff: local starts, cloud continues after 4 tokens" in d.reason


def test_slow_local_decode_without_handoff_gives_the_cloud_the_request() -> None:
    pol = Policy(
        name="t", routing={"prefer": "local", "tpot_target_ms": 40, "ttft_deadline_ms": 500}
    )
    d = decide(RequestFacts(20, 256), pol, LiveState(latency=SLOW_LOCAL))
    assert d.plan == "single" and d.primary == "cloud" and d.reason.endswith("-> cloud")


def test_slow_local_decode_keeps_local_when_the_cloud_misses_the_deadline() -> None:
    pol = Policy(
        name="t", routing={"prefer": "local", "tpot_target_ms": 40, "ttft_deadline_ms": 200}
    )
    d = decide(RequestFacts(20, 256), pol, LiveState(latency=SLOW_LOCAL))
    assert d.primary == "local" and "misses the 200 ms deadline -> local" in d.reason


def test_short_answers_and_fast_local_decode_stay_local() -> None:
    pol = Policy(
        name="t", plans=("single", "handoff"), routing={"prefer": "local", "tpot_target_ms": 40}
    )
    short = decide(RequestFacts(20, 16), pol, LiveState(latency=SLOW_LOCAL))
    assert short.plan == "single" and short.primary == "local" and "decodes" not in short.reason
    fast = {"local": speed("local", 0.1, 0.03), "cloud": speed("cloud", 0.3, 0.01)}
    d = decide(RequestFacts(20, 256), pol, LiveState(latency=fast))
    assert d.plan == "single" and d.primary == "local"


def test_plan_handoff_asked_for_starts_local_even_when_cloud_is_preferred() -> None:
    pol = Policy(name="t", routing={"prefer": "cloud"}).with_plan("handoff")
    d = decide(RequestFacts(20, 8), pol, LiveState())
    assert d.plan == "handoff" and (d.primary, d.fallback) == ("local", "cloud")
    assert "plan=handoff" in d.reason
    no_cont = LiveState(continues=frozenset({"local"}))
    assert decide(RequestFacts(20, 8), pol, no_cont).plan != "handoff"


def test_handoff_needs_the_cloud() -> None:
    pol = Policy(name="t", routing={"prefer": "local"}, privacy={"mode": "keep-local"}).with_plan(
        "handoff"
    )
    d = decide(RequestFacts(20, 256, privacy_kinds=frozenset({"email"})), pol, LiveState())
    assert d.plan == "single" and d.engines == ("local",)
