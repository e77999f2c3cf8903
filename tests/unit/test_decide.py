"""`decide()`: properties over random facts, policies and live states (hypothesis), the reasons'
codes of the main cases (what tests act on), and their readable words."""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import pytest
from hypothesis import given, settings, strategies as st

from hybridllm import Cap, GuardedEngine, ModelPrice, Policy, Prices, SQLiteLedger, errors
from hybridllm.engines.base import GenerationRequest
from hybridllm.events import EngineName
from hybridllm.policy import BudgetTable
from hybridllm.routing import Decision, LiveState, Reason, ReasonCode, RequestFacts, decide
from hybridllm.routing.decision import LoadRule, RefusalCause
from hybridllm.routing.inputs import Prediction
from hybridllm.testing import ScriptedEngine

ENGINES: tuple[EngineName, ...] = ("local", "cloud")
CODES = frozenset(get_args(ReasonCode))


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
        budget=BudgetTable(on_exceeded=draw(st.sampled_from(["local", "fail"]))),
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
    assert d.reasons and all(r.text.strip() for r in d.reasons)
    assert set(d.codes) <= CODES and all(str(r) == r.text for r in d.reasons)
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
        assert p.hedge.parallel_cloud and "parallel_start" in d.codes
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
        assert d.plan == "refuse" and "privacy_blocked" in d.codes
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
        assert d.fallback == "cloud", d.reasons
        assert d.load in ("parallel_start", "parallel_held"), d.reasons
        assert d.load in d.codes
        # started in parallel at once, or held back by the policy to the deadline itself
        assert d.fallback_now or not d.fallback_lead
        assert d.fallback_now == ("parallel_held" not in d.codes)


# ---- the reasons of the main cases, by their codes ----------------------------------------------

CHAT = Policy(name="chat", routing={"prefer": "auto", "ttft_deadline_ms": 500})
BOTH = LiveState(latency={"local": pred("local", 0.2), "cloud": pred("cloud", 0.3, 0.45)})


def test_router_score_picks_the_engine() -> None:
    hard = decide(RequestFacts(50, 64, router_score=0.81, router_threshold=0.62), CHAT, BOTH)
    assert hard.primary == "cloud" and hard.fallback == "local"
    assert "router_score" in hard.codes
    easy = decide(RequestFacts(50, 64, router_score=0.2, router_threshold=0.62), CHAT, BOTH)
    assert easy.primary == "local" and "router_score" in easy.codes


def test_privacy_finding_keeps_the_request_local() -> None:
    pol = CHAT.with_(privacy={"mode": "keep-local"})
    d = decide(RequestFacts(50, 64, 0.9, 0.5, frozenset({"email"})), pol, BOTH)
    assert d.engines == ("local",) and "privacy_local" in d.codes


def test_budget_goes_local_or_refuses() -> None:
    state = LiveState(budget_fits=False, budget_detail="day cap 0.50 USD, left 0.01 USD")
    cloudy = Policy(name="b", routing={"prefer": "cloud"})
    d = decide(RequestFacts(50, 64), cloudy, state)
    assert d.engines == ("local",)
    assert "budget_local" in d.codes
    strict = cloudy.model_copy(update={"budget": BudgetTable(on_exceeded="fail")})
    refused = decide(RequestFacts(50, 64), strict, state)
    assert refused.plan == "refuse" and "budget_refused" in refused.codes


def test_local_queue_past_the_deadline_goes_to_the_cloud() -> None:
    state = LiveState(latency=BOTH.latency, local_queue_s=2.1)
    d = decide(RequestFacts(50, 64), CHAT, state)
    assert (d.primary, d.fallback) == ("cloud", "local") and not d.fallback_now
    assert "local_queue" in d.codes


def test_long_local_prefill_swaps_when_the_cloud_meets_the_deadline() -> None:
    state = LiveState(latency={"local": pred("local", 0.9), "cloud": pred("cloud", 0.3, 0.45)})
    d = decide(RequestFacts(1000, 64), CHAT, state)
    assert d.primary == "cloud" and "faster_fallback" in d.codes


def test_unknown_cloud_latency_starts_both_at_once() -> None:
    state = LiveState(latency={"local": pred("local", 0.9)})
    d = decide(RequestFacts(1000, 64), CHAT, state)
    assert (d.primary, d.fallback, d.fallback_now) == ("local", "cloud", True)
    assert "parallel_start" in d.codes
    assert d.parallel_cloud and d.codes[-1] == "parallel_start"


def test_slow_cloud_swaps_to_local() -> None:
    pol = Policy(
        name="c", routing={"prefer": "cloud", "ttft_deadline_ms": 500, "objective": "latency"}
    )
    state = LiveState(latency={"local": pred("local", 0.2, 0.3), "cloud": pred("cloud", 2.0)})
    d = decide(RequestFacts(50, 64), pol, state)
    assert (d.primary, d.fallback) == ("local", "cloud")
    assert "faster_fallback" in d.codes


def test_open_circuit_goes_local_at_once() -> None:
    pol = Policy(name="c", routing={"prefer": "cloud", "ttft_deadline_ms": 500})
    d = decide(RequestFacts(50, 64), pol, LiveState(cloud_circuit_open=True))
    assert d.engines == ("local",) and "cloud_circuit_open" in d.codes


def words(d: Decision, code: ReasonCode) -> str:
    """The words of the one reason with `code`."""
    (text,) = [r.text for r in d.reasons if r.code == code]
    return text


def test_the_main_cases_keep_their_readable_words() -> None:
    """The words are for people (the codes above say which rule spoke): each main case still
    reads as it did, figures included."""
    hard = decide(RequestFacts(50, 64, router_score=0.81, router_threshold=0.62), CHAT, BOTH)
    assert words(hard, "router_score") == "router score 0.81 >= threshold 0.62 -> cloud"
    pol = CHAT.with_(privacy={"mode": "keep-local"})
    found = decide(RequestFacts(50, 64, 0.9, 0.5, frozenset({"email"})), pol, BOTH)
    assert words(found, "privacy_local") == "privacy: email found -> local only"
    state = LiveState(budget_fits=False, budget_detail="day cap 0.50 USD, left 0.01 USD")
    poor = decide(RequestFacts(50, 64), Policy(name="b", routing={"prefer": "cloud"}), state)
    assert words(poor, "budget_local") == (
        "budget: cannot cover the cloud request (day cap 0.50 USD, left 0.01 USD) -> local"
    )
    queued = LiveState(latency=BOTH.latency, local_queue_s=2.1)
    assert words(decide(RequestFacts(50, 64), CHAT, queued), "local_queue") == (
        "local queue 2100 ms > deadline 500 ms -> cloud"
    )
    late = decide(RequestFacts(1000, 64), CHAT, LiveState(latency={"local": pred("local", 0.9)}))
    assert words(late, "parallel_start") == (
        "local is preferred but predicted at 900 ms against the 500 ms deadline: the cloud "
        "starts in parallel now (it costs a cloud request; the first token wins)"
    )
    assert late.reason == "; ".join(r.text for r in late.reasons)  # the words, joined


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
        name="t",
        routing={"prefer": "cloud", "ttft_deadline_ms": 600, "objective": "latency"},
        hedge={"after_ms": "auto"},
    )
    state = LiveState(latency={"cloud": heavy("cloud", CLOUD_TAIL), "local": pred("local", 0.05)})
    d = decide(RequestFacts(10, 8), pol, state)
    assert d.plan == "hedge" and d.hedge_s is not None and d.hedge_s < 0.1
    assert "auto_hedge" in d.codes and d.fallback == "local"


def test_auto_hedge_with_a_dear_cloud_backup_waits_or_skips() -> None:
    local = heavy("local", [0.1 + 0.002 * i for i in range(20)], ttft=0.12)  # a tight local
    pol = Policy(
        name="t", routing={"prefer": "local", "ttft_deadline_ms": 600}, hedge={"after_ms": "auto"}
    )
    d = decide(
        RequestFacts(10, 8), pol, LiveState(latency={"local": local, "cloud": pred("cloud", 0.2)})
    )
    assert d.plan == "single" and "auto_hedge_none" in d.codes


def test_private_preset_never_leaves_the_device() -> None:
    from hybridllm.policy import resolve_policy

    d = decide(RequestFacts(10, 8, privacy_kinds=frozenset()), resolve_policy("private"), BOTH)
    assert d.engines == ("local",) and "policy_no_cloud" in d.codes


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
    assert "slow_decode_handoff" in d.codes
    assert "handoff_asked" not in d.codes  # the speed handed off; no plan asked for it


def test_slow_local_decode_without_handoff_gives_the_cloud_the_request() -> None:
    pol = Policy(
        name="t", routing={"prefer": "local", "tpot_target_ms": 40, "ttft_deadline_ms": 500}
    )
    d = decide(RequestFacts(20, 256), pol, LiveState(latency=SLOW_LOCAL))
    assert d.plan == "single" and d.primary == "cloud" and d.codes[-1] == "slow_decode_cloud"


def test_slow_local_decode_keeps_local_when_the_cloud_misses_the_deadline() -> None:
    pol = Policy(
        name="t", routing={"prefer": "local", "tpot_target_ms": 40, "ttft_deadline_ms": 200}
    )
    d = decide(RequestFacts(20, 256), pol, LiveState(latency=SLOW_LOCAL))
    assert d.primary == "local" and "slow_decode_deadline" in d.codes


def test_short_answers_and_fast_local_decode_stay_local() -> None:
    pol = Policy(
        name="t", plans=("single", "handoff"), routing={"prefer": "local", "tpot_target_ms": 40}
    )
    short = decide(RequestFacts(20, 16), pol, LiveState(latency=SLOW_LOCAL))
    assert short.plan == "single" and short.primary == "local"
    assert not any(c.startswith("slow_decode") for c in short.codes)
    fast = {"local": speed("local", 0.1, 0.03), "cloud": speed("cloud", 0.3, 0.01)}
    d = decide(RequestFacts(20, 256), pol, LiveState(latency=fast))
    assert d.plan == "single" and d.primary == "local"


def test_plan_handoff_asked_for_starts_local_even_when_cloud_is_preferred() -> None:
    pol = Policy(name="t", routing={"prefer": "cloud"}).with_plan("handoff")
    d = decide(RequestFacts(20, 8), pol, LiveState())
    assert d.plan == "handoff" and (d.primary, d.fallback) == ("local", "cloud")
    assert "handoff_asked" in d.codes
    no_cont = LiveState(continues=frozenset({"local"}))
    assert decide(RequestFacts(20, 8), pol, no_cont).plan != "handoff"


def test_handoff_needs_the_cloud() -> None:
    pol = Policy(name="t", routing={"prefer": "local"}, privacy={"mode": "keep-local"}).with_plan(
        "handoff"
    )
    d = decide(RequestFacts(20, 256, privacy_kinds=frozenset({"email"})), pol, LiveState())
    assert d.plan == "single" and d.engines == ("local",)


# ---- typed fields: code acts on them, never on the reasons (issue 24) ---------------------------

REFUSALS: list[tuple[RequestFacts, Policy, LiveState, RefusalCause]] = [
    # a privacy finding under "block"
    (
        RequestFacts(9, 8, privacy_kinds=frozenset({"email"})),
        Policy(privacy={"mode": "block"}),
        LiveState(),
        "privacy",
    ),
    # keep-local with only a cloud engine
    (
        RequestFacts(9, 8, privacy_kinds=frozenset({"iban"})),
        Policy(privacy={"mode": "keep-local"}),
        LiveState(available=frozenset({"cloud"})),
        "privacy",
    ),
    # the budget, with on_exceeded = "fail"
    (
        RequestFacts(9, 8),
        Policy(budget=BudgetTable(on_exceeded="fail"), routing={"prefer": "cloud"}),
        LiveState(budget_fits=False),
        "budget",
    ),
    # a forced cloud the budget cannot cover
    (RequestFacts(9, 8, forced="cloud"), Policy(), LiveState(budget_fits=False), "budget"),
    # a forced cloud the policy keeps off
    (
        RequestFacts(9, 8, forced="cloud"),
        Policy(routing={"allow_cloud": False}),
        LiveState(),
        "forced_not_allowed",
    ),
    # a cloud-only client under a device-only policy
    (
        RequestFacts(9, 8),
        Policy(routing={"allow_cloud": False}),
        LiveState(available=frozenset({"cloud"})),
        "no_engine",
    ),
]


@pytest.mark.parametrize(("f", "p", "s", "cause"), REFUSALS)
def test_a_refusal_carries_its_typed_cause(
    f: RequestFacts, p: Policy, s: LiveState, cause: RefusalCause
) -> None:
    d = decide(f, p, s)
    assert d.plan == "refuse" and d.primary is None and d.refusal == cause


@pytest.mark.parametrize(("f", "p", "s", "cause"), REFUSALS)
def test_rewording_the_reasons_changes_no_error_type(
    f: RequestFacts, p: Policy, s: LiveState, cause: RefusalCause
) -> None:
    """The refusal's error type comes from `Decision.refusal`: reasons in other words (or none
    a parser would know) give the same type."""
    from hybridllm.runtime.gather import refusal_error

    request = GenerationRequest([{"role": "user", "content": "hi"}])
    d = decide(f, p, s)
    other = tuple(Reason(r.code, f"in other words {i}") for i, r in enumerate(d.reasons))
    reworded = replace(d, reasons=other)
    error = refusal_error(d, f, p, request, None)
    assert type(refusal_error(reworded, f, p, request, None)) is type(error)
    expected = errors.PrivacyBlockedError if cause == "privacy" else errors.RefusedError
    assert type(error) is expected  # no guard here: a budget refusal has no figures to give
    if cause == "budget":  # with a guard whose cap no request fits: the figures come along
        guard = GuardedEngine(
            ScriptedEngine("cloud"),
            privacy="off",
            ledger=SQLiteLedger(),
            prices=Prices(
                models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)}
            ),
            caps=[Cap(None, "request", 1e-6)],
        )
        assert isinstance(refusal_error(d, f, p, request, guard), errors.BudgetExceededError)
        assert isinstance(refusal_error(reworded, f, p, request, guard), errors.BudgetExceededError)


def test_the_parallel_start_is_announced_with_the_load_rules_own_words() -> None:
    """The race announces a parallel start with `Decision.load_reason`, wherever that reason
    stands among the others and however the others read."""
    from functools import partial

    from hybridllm.runtime.gather import Gatherer
    from hybridllm.runtime.plans.choose import choose_plan

    state = LiveState(latency={"local": pred("local", 0.9)}, continues=frozenset({"local"}))
    d = decide(RequestFacts(1000, 64), CHAT, state)
    assert d.load == "parallel_start" and d.fallback_now
    assert "the cloud starts in parallel now" in d.load_reason
    reworded = replace(d, reasons=tuple(Reason(r.code, "in other words") for r in d.reasons))
    engines = {"local": ScriptedEngine("local"), "cloud": ScriptedEngine("cloud")}
    request = GenerationRequest([{"role": "user", "content": "hi"}])
    plan = choose_plan(reworded, dict(engines), request, CHAT, None, Gatherer())
    assert isinstance(plan, partial) and plan.keywords["fallback_now"] is True
    assert plan.keywords["parallel_reason"] == d.load_reason


HELD = {"hedge": {"parallel_cloud": False}}


@pytest.mark.parametrize(
    ("state", "update", "rule"),
    [
        (LiveState(latency=BOTH.latency, local_queue_s=2.1), {}, "local_queue"),
        (
            LiveState(latency={"local": pred("local", 0.9), "cloud": pred("cloud", 0.3, 0.45)}),
            {},
            "faster_fallback",
        ),
        (LiveState(latency={"local": pred("local", 0.9)}), {}, "parallel_start"),
        (LiveState(latency={"local": pred("local", 0.9)}), HELD, "parallel_held"),
        (BOTH, {}, None),
    ],
)
def test_the_load_rule_that_fired_is_a_typed_field(
    state: LiveState, update: dict[str, object], rule: LoadRule | None
) -> None:
    d = decide(RequestFacts(1000, 64), CHAT.with_(**update), state)
    if rule is None:
        assert d.load is None and d.load_reason == ""
        assert not set(d.codes) & set(get_args(LoadRule))
    else:
        assert d.load == rule and Reason(rule, d.load_reason) in d.reasons
    assert d.fallback_now == (rule == "parallel_start")
    assert d.fallback_lead == (rule != "parallel_held")


def test_by_router_says_the_routers_score_asked_for_the_cloud() -> None:
    hard = decide(RequestFacts(50, 64, router_score=0.81, router_threshold=0.62), CHAT, BOTH)
    easy = decide(RequestFacts(50, 64, router_score=0.2, router_threshold=0.62), CHAT, BOTH)
    cloudy = decide(RequestFacts(50, 64), Policy(routing={"prefer": "cloud"}), BOTH)
    assert hard.by_router and not easy.by_router and not cloudy.by_router
    assert cloudy.primary == "cloud"  # the cloud first by preference is not the router's doing


# ---- the cascade, decided here from facts (issue 24) ---------------------------------------------

CASCADING = Policy(
    name="c", plans=("single", "hedge", "cascade"), routing={"router_threshold": 0.5}
)
ABLE = LiveState(latency=BOTH.latency, reads_signals=frozenset({"local"}), has_router=True)


def scored(score: float, **kw: object) -> RequestFacts:
    return RequestFacts(50, 64, router_score=score, router_threshold=0.5, **kw)  # type: ignore[arg-type]


def test_a_policy_listing_the_cascade_runs_it_where_the_local_engine_reads_signals() -> None:
    for score in (0.2, 0.9):  # local first, or moved to the cloud by the router's score alone
        d = decide(scored(score), CASCADING, ABLE)
        assert d.plan == "cascade" and (d.primary, d.fallback) == ("local", "cloud")
        assert d.by_router == (score >= 0.5) and d.cascade_judge == "prefix"
        assert d.failover and d.hedge_s is None and not d.fallback_now


@pytest.mark.parametrize(
    ("facts_", "policy", "state"),
    [
        (scored(0.2), CASCADING, replace(ABLE, has_router=False)),  # no router
        (scored(0.2), CASCADING, replace(ABLE, reads_signals=frozenset())),  # no signals
        (scored(0.2), Policy(name="p", routing={"router_threshold": 0.5}), ABLE),  # not listed
        (scored(0.2), CASCADING.with_(routing={"prefer": "local"}), ABLE),  # not "auto"
        (scored(0.2, forced="local"), CASCADING, ABLE),  # one engine forced
        (scored(0.2, plan="hedge"), CASCADING, ABLE),  # another plan asked for
        (scored(0.2), CASCADING, replace(ABLE, local_queue_s=9.0)),  # load moved it
        (scored(0.2), CASCADING, replace(ABLE, available=frozenset({"local"}))),  # one engine
    ],
)
def test_the_cascade_runs_only_where_its_conditions_hold(
    facts_: RequestFacts, policy: Policy, state: LiveState
) -> None:
    pol = policy.with_(routing={"ttft_deadline_ms": 500})
    assert decide(facts_, pol, state).plan != "cascade"


def test_a_cascade_asked_for_runs_under_any_preference_and_says_when_it_cannot() -> None:
    local_first = CASCADING.with_(routing={"prefer": "local"})
    asked = decide(scored(0.2, plan="cascade"), local_first, ABLE)
    assert asked.plan == "cascade" and "cascade_asked" in asked.codes
    cannot = decide(scored(0.2, plan="cascade"), local_first, replace(ABLE, has_router=False))
    assert cannot.plan == "single" and "no_cascade" in cannot.codes


def test_nothing_streamed_lets_the_cascade_judge_the_whole_answer() -> None:
    whole = CASCADING.with_(cascade={"judge": "answer"})
    assert decide(scored(0.2, streamed=False), whole, ABLE).cascade_judge == "answer"
    assert decide(scored(0.2, streamed=True), whole, ABLE).cascade_judge == "prefix"
    assert decide(scored(0.2, streamed=False), CASCADING, ABLE).cascade_judge == "prefix"


# ---- a policy's `plan` works like a call's `plan=` (issue 24, section 6) -------------------------


def test_a_policys_plan_hedge_hedges_auto_as_the_calls_does() -> None:
    routing = {"prefer": "cloud", "ttft_deadline_ms": 600, "objective": "latency"}
    base = Policy(name="t", routing=routing)
    file_like = Policy(name="t", plan="hedge", routing=routing)
    state = LiveState(latency={"cloud": heavy("cloud", CLOUD_TAIL), "local": pred("local", 0.05)})
    by_policy = decide(RequestFacts(10, 8), file_like, state)
    by_call = decide(RequestFacts(10, 8), base.with_plan("hedge"), state)
    assert by_policy.plan == by_call.plan == "hedge"
    assert by_policy.hedge_s == by_call.hedge_s and by_policy.hedge_s is not None
    assert decide(RequestFacts(10, 8), base, state).plan == "single"  # not asked: no hedge


def test_a_policys_plan_speculative_is_asked_for_as_the_calls_is() -> None:
    listed = Policy(name="s", plans=("single", "speculative"))
    asking = listed.model_copy(update={"plan": "speculative"})
    state = LiveState(speculation=(False, "acceptance 0.20"))
    d = decide(RequestFacts(20, 64), asking, state)
    assert d.plan == "speculative" and "speculative_asked" in d.codes
    assert decide(RequestFacts(20, 64, plan="speculative"), listed, state).plan == "speculative"
    assert decide(RequestFacts(20, 64), listed, state).plan != "speculative"  # only if it pays


def test_a_policys_plan_cascade_runs_under_any_preference_as_the_calls_does() -> None:
    local_first = CASCADING.with_(routing={"prefer": "local"})
    asking = local_first.model_copy(update={"plan": "cascade"})
    d = decide(scored(0.2), asking, ABLE)
    assert d.plan == "cascade" and "cascade_asked" in d.codes
    assert decide(scored(0.2), local_first, ABLE).plan == "single"  # not asked, not "auto"


def test_a_calls_plan_overrides_the_policys() -> None:
    asking = CASCADING.model_copy(update={"plan": "cascade"})
    assert decide(scored(0.2, plan="single"), asking, ABLE).plan == "single"


# ---- the local circuit (issue 24, section 6) -----------------------------------------------------

LOCAL_OPEN = LiveState(latency=BOTH.latency, local_circuit_open=True)


def test_an_open_local_circuit_gives_the_request_to_the_cloud() -> None:
    d = decide(RequestFacts(50, 64), CHAT, LOCAL_OPEN)
    assert (d.primary, d.fallback) == ("cloud", None) and d.plan == "single"
    assert "local_circuit_open" in d.codes
    assert "wanted_missing" not in d.codes  # said once, by the rule


@pytest.mark.parametrize(
    ("facts_", "policy", "state"),
    [
        (RequestFacts(50, 64, forced="local"), CHAT, LOCAL_OPEN),  # forced
        (
            RequestFacts(50, 64),
            Policy(name="l", routing={"allow_cloud": False}),
            LOCAL_OPEN,
        ),  # no cloud
        (
            RequestFacts(50, 64, privacy_kinds=frozenset({"email"})),
            Policy(name="k", privacy={"mode": "keep-local"}),
            LOCAL_OPEN,
        ),  # privacy keeps it
        (RequestFacts(50, 64), CHAT, replace(LOCAL_OPEN, available=frozenset({"local"}))),
    ],
)
def test_an_open_local_circuit_still_tries_the_only_engine_left(
    facts_: RequestFacts, policy: Policy, state: LiveState
) -> None:
    d = decide(facts_, policy, state)
    assert d.engines == ("local",)
    assert {"local_circuit_forced", "local_circuit_only_engine"} & set(d.codes)
