"""`decide()`: where one request runs and why, as a pure function of plain facts.

Inputs: the request's facts (prompt and output tokens, the router's score, the kinds of personal
data found), the policy, and the live state (latency predictions per engine, whether the budget
covers the worst-case cloud cost, the cloud circuit, the local queue). Output: a frozen
`Decision`: the plan, the primary engine, the fallback (or None), the first-token deadline, the
hedge delay, whether the fallback starts at once, and reasons a person can read.

The rules, in order (each one that applies adds a reason):

1. The engine asked for: a forced engine; `prefer`/`fallback_order`; for "auto", the router's
   score against its threshold (score >= threshold: cloud), else local first.
2. Which engines may serve: the client's, the policy's (`allow_cloud`, `fallback_order`), a
   privacy finding (keep-local, or privacy on without a scanner: no cloud; block: refuse), the
   budget (cannot cover the worst case: no cloud, or refuse when `on_exceeded = "fail"` and the
   cloud was asked for), the cloud circuit (open: no cloud, unless forced or the only engine),
   an unavailable engine (`LiveState.unavailable`: a cloud without a usable API key, a local
   queue at its bound): left out with its reason when another engine may serve, else kept (it
   fails at once with its typed error: `CloudUnavailableError`, `QueueFullError`). A cloud left
   out that the request could have used is named in `Decision.unavailable` (the stream says so
   with a `CloudUnavailable` event).
3. Load (with a deadline and two engines): a local queue alone longer than the deadline, or a
   primary predicted past the deadline while the other's p95 meets it, swaps the two; a
   primary predicted past the deadline otherwise keeps its place but the other one starts in
   parallel at once (predictive start: the first token wins). A cloud started that way is a
   cloud request paid for even when the local engine wins, and the reason says so; the policy
   may forbid it (`parallel_cloud = false`) or cap its share of the policy's recent requests
   (`parallel_cloud_share`, against `LiveState.parallel_recent`): then the cloud starts only at
   the deadline itself (`Decision.fallback_lead` False).
4. Decode speed (`decode.py`): with a `tpot_target_ms`, a local primary predicted to decode
   slower than the target on a long answer (max_tokens >= `LONG_ANSWER_TOKENS`) hands the answer
   to the cloud after its first tokens ("handoff", where the policy allows that plan) or gives
   the cloud the request (when the cloud meets the deadline); `plan = "handoff"` (policy or call)
   asks for the handoff outright.
5. The plan: "handoff" (4.); "hedge" when the policy asks for one (a fixed delay, or "auto": the
   delay `routing.hedging` prices against the primary's TTFT distribution once it has a
   history), else "single" (fallback at the deadline or on failure); "refuse" when nothing may
   serve. A failure mid-answer moves the answer to the other engine only when both engines can
   continue a started answer (`LiveState.continues`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from hybridllm.events import EngineName
from hybridllm.policy import Policy
from hybridllm.routing.decode import decode_rule
from hybridllm.routing.hedging import choose_hedge_delay
from hybridllm.routing.inputs import Prediction

PlanKind = Literal["single", "hedge", "handoff", "speculative", "refuse"]
AUTO_HEDGE_MIN_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What is known about the request itself."""

    prompt_tokens: int
    max_tokens: int
    router_score: float | None = None  # P(the local answer is wrong); None: no router
    router_threshold: float | None = None  # the cut for this policy (score >= it: cloud)
    # kinds found, e.g. {"email", "api_key"} (never the values); None: the prompt was not scanned
    privacy_kinds: frozenset[str] | None = frozenset()
    forced: EngineName | None = None  # the caller named the engine
    plan: Literal["speculative"] | None = None  # the caller asked for this plan


@dataclass(frozen=True, slots=True)
class LiveState:
    """What is known about the engines right now."""

    available: frozenset[EngineName] = frozenset({"local", "cloud"})
    latency: Mapping[EngineName, Prediction] = field(default_factory=dict)
    local_queue_s: float = 0.0
    # the wait for a slot under the cloud engine's concurrency limit (or a 429's Retry-After);
    # already in the cloud's latency prediction, named here for the reason
    cloud_queue_s: float = 0.0
    cloud_circuit_open: bool = False
    budget_fits: bool = True  # the worst-case cloud cost fits every cap
    budget_detail: str = ""  # e.g. "day cap 0.50 USD, left 0.01 USD"
    # the engines that can continue a started answer (the engines' `supports_continuation`)
    continues: frozenset[EngineName] = frozenset({"local", "cloud"})
    # engines that cannot take a request now, and why (`EngineInfo.unavailable`)
    unavailable: Mapping[EngineName, str] = field(default_factory=dict)
    # this policy's recent requests in this client: (how many started the cloud in parallel,
    # how many there were), for `Policy.parallel_cloud_share`
    parallel_recent: tuple[int, int] = (0, 0)
    # would the speculative plan pay now, and why (None: no speculation state)
    speculation: tuple[bool, str] | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    plan: PlanKind
    primary: EngineName | None
    fallback: EngineName | None
    deadline_s: float | None
    hedge_s: float | None
    # start the fallback at once, in parallel (the primary is predicted to miss the deadline);
    # the last reason then says so
    fallback_now: bool
    reasons: tuple[str, ...]
    failover: bool = False  # a failure mid-answer moves the answer to the other engine
    # engines this request could have used, left out as unavailable: (engine, why)
    unavailable: tuple[tuple[EngineName, str], ...] = ()
    # the fallback may start ahead of the deadline by its own predicted time to a first token;
    # False: at the deadline itself (a cloud the policy does not start in parallel)
    fallback_lead: bool = True

    @property
    def parallel_cloud(self) -> bool:
        """The cloud starts at once beside the local engine (a cloud request paid for)."""
        return self.fallback_now and self.fallback == "cloud"

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def engines(self) -> tuple[EngineName, ...]:
        """Every engine this decision may send the request to."""
        return tuple(e for e in (self.primary, self.fallback) if e is not None)


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def _refuse(reasons: list[str], deadline: float | None) -> Decision:
    return Decision("refuse", None, None, deadline, None, False, tuple(reasons))


def decide(facts: RequestFacts, policy: Policy, state: LiveState) -> Decision:
    reasons: list[str] = []
    deadline = (
        None
        if policy.routing.ttft_deadline_ms is None
        else policy.routing.ttft_deadline_ms / 1000.0
    )
    allowed: list[EngineName] = [e for e in policy.order if e in state.available]
    want = _wanted(facts, policy, reasons)
    explained = _restrict(facts, policy, state, allowed, want, reasons)
    if explained is None:
        return _refuse(reasons, deadline)
    left_out = _unavailable(facts, state, allowed, reasons)
    explained = explained or any(e == "cloud" for e, _ in left_out)
    decision = _serve(facts, policy, state, allowed, want, explained, reasons, deadline)
    decision = _speculative(decision, facts, policy, state, reasons)
    if left_out and decision.primary is not None:
        decision = replace(decision, unavailable=left_out)
    return decision


def _serve(
    facts: RequestFacts,
    policy: Policy,
    state: LiveState,
    allowed: list[EngineName],
    want: EngineName,
    explained: bool,
    reasons: list[str],
    deadline: float | None,
) -> Decision:
    """3. and 4.: the serving engine, its fallback, the load rules and the plan."""

    # the engine that serves
    if facts.forced is not None:
        if facts.forced not in allowed:
            reasons.append(f"engine={facts.forced} is not allowed -> refused")
            return _refuse(reasons, deadline)
        return Decision("single", facts.forced, None, deadline, None, False, tuple(reasons))
    if not allowed:
        reasons.append("no engine this client has is allowed -> refused")
        return _refuse(reasons, deadline)
    preferred = want
    if want not in allowed:
        preferred = allowed[0]
        if not explained:
            reasons.append(f"no {want} engine -> {preferred}")
    others = [e for e in allowed if e != preferred]
    primary, fallback = preferred, (others[0] if others else None)

    # 3. load: who can meet the deadline
    fallback_now, lead = False, True
    if deadline is not None and fallback is not None:
        primary, fallback, fallback_now, lead = _load(
            primary, fallback, deadline, policy, state, reasons
        )
    elif deadline is not None and primary == "local" and state.local_queue_s > deadline:
        reasons.append(
            f"local queue {_ms(state.local_queue_s)} > deadline {_ms(deadline)}, "
            "but no other engine is allowed -> local"
        )

    # 4. decode speed: hand off to the cloud, or give it the request
    handoff = False
    if fallback is not None and not fallback_now:
        primary, fallback, handoff = decode_rule(
            facts.max_tokens, policy, primary, fallback, state.latency, state.continues,
            deadline, reasons,
        )  # fmt: skip

    # 5. the plan
    hedge_s = None
    if not fallback_now and not handoff:
        hedge_s = _hedge(policy, primary, fallback, state, reasons, deadline, lead)
    plan: PlanKind = "handoff" if handoff else "hedge" if hedge_s is not None else "single"
    failover = fallback is not None
    cannot = [e for e in (primary, fallback) if e is not None and e not in state.continues]
    if failover and cannot:
        failover = False
        why = f"no mid-stream failover: {' and '.join(cannot)} cannot continue an answer"
        # a parallel start's reason stays the last one (the plan announces the start with it)
        reasons.insert(len(reasons) - 1 if fallback_now else len(reasons), why)
    return Decision(
        plan, primary, fallback, deadline, hedge_s, fallback_now, tuple(reasons), failover,
        fallback_lead=lead,
    )  # fmt: skip


def _wanted(facts: RequestFacts, policy: Policy, reasons: list[str]) -> EngineName:
    """The engine the caller, the policy or the router asks for, before any constraint."""
    if facts.forced is not None:
        reasons.append(f"engine={facts.forced} forced by the caller")
        return facts.forced
    if policy.routing.prefer != "auto" or policy.routing.fallback_order is not None:
        want = policy.order[0]
        reasons.append(f"policy {policy.name!r} prefers {want}")
        return want
    score, cut = facts.router_score, facts.router_threshold
    if score is None or cut is None:
        reasons.append(f"policy {policy.name!r} prefers auto, no router score -> local first")
        return "local"
    want = "cloud" if score >= cut else "local"
    rel = ">=" if score >= cut else "<"
    reasons.append(f"router score {score:.2f} {rel} threshold {cut:.2f} -> {want}")
    return want


def _restrict(
    facts: RequestFacts,
    policy: Policy,
    state: LiveState,
    allowed: list[EngineName],
    want: EngineName,
    reasons: list[str],
) -> bool | None:
    """1. Remove the cloud from `allowed` for the policy, privacy, budget and circuit. Returns
    None to refuse, True when a reason already explains the cloud's removal."""

    def drop(reason: str) -> bool:
        reasons.append(reason)
        if "cloud" in allowed:
            allowed.remove("cloud")
        return True

    explained = False
    if not policy.cloud_allowed and "cloud" in state.available:
        explained = drop(f"policy {policy.name!r}: never leaves the device -> local")
    kinds = facts.privacy_kinds
    if kinds is None and policy.privacy.mode != "off":
        explained = drop("privacy: no detector to scan the prompt -> local only")
    elif kinds and policy.privacy.mode == "off":
        reasons.append(f"privacy: {', '.join(sorted(kinds))} found, but the policy allows it")
    elif kinds:
        found = ", ".join(sorted(kinds))
        if policy.privacy.mode == "block":
            reasons.append(f"privacy: {found} found -> blocked by the policy")
            return None
        explained = drop(f"privacy: {found} found -> local only")
    if "cloud" in allowed and not state.budget_fits:
        detail = f" ({state.budget_detail})" if state.budget_detail else ""
        if policy.budget.on_exceeded == "fail" and want == "cloud":
            reasons.append(f"budget: cannot cover the cloud request{detail} -> refused")
            return None
        explained = drop(f"budget: cannot cover the cloud request{detail} -> local")
    if "cloud" in allowed and state.cloud_circuit_open:
        if facts.forced == "cloud":
            reasons.append("cloud circuit open, but engine=cloud forced -> cloud")
        elif "local" in allowed:
            explained = drop("cloud circuit open -> local")
        else:  # nothing else could answer: try it rather than fail without trying
            reasons.append("cloud circuit open, but no other engine -> cloud")
    return explained


def _unavailable(
    facts: RequestFacts, state: LiveState, allowed: list[EngineName], reasons: list[str]
) -> tuple[tuple[EngineName, str], ...]:
    """Leave out the engines that cannot take a request now while another may serve; one that
    is forced or the last one left stays (it fails at once, with its typed error)."""
    left_out: list[tuple[EngineName, str]] = []
    for engine in list(allowed):
        why = state.unavailable.get(engine)
        if why is None:
            continue
        if facts.forced == engine:
            reasons.append(f"{engine}: {why}, but engine={engine} forced -> {engine} (fails)")
        elif len(allowed) > 1:
            allowed.remove(engine)
            reasons.append(f"{engine}: {why} -> {allowed[0]}")
            left_out.append((engine, why))
        else:
            reasons.append(f"{engine}: {why}, and no other engine -> {engine} (fails)")
    return tuple(left_out)


def _load(
    primary: EngineName,
    fallback: EngineName,
    deadline: float,
    policy: Policy,
    state: LiveState,
    reasons: list[str],
) -> tuple[EngineName, EngineName, bool, bool]:
    """Swap the engines, or start both at once, when the primary cannot make the deadline.
    Returns (primary, fallback, start the fallback at once, may it start ahead of the
    deadline)."""
    if primary == "local" and state.local_queue_s > deadline:
        reasons.append(
            f"local queue {_ms(state.local_queue_s)} > deadline {_ms(deadline)} -> {fallback}"
        )
        return fallback, primary, False, True
    if primary == "cloud" and _cloud_queue_misses(deadline, state):
        cloud = state.latency["cloud"]
        reasons.append(
            f"cloud queue {_ms(state.cloud_queue_s)} (concurrency limit) puts its TTFT at "
            f"{_ms(cloud.ttft_s)} > deadline {_ms(deadline)} -> {fallback}"
        )
        return fallback, primary, False, True
    # a cloud the policy never starts in parallel waits for the deadline itself
    lead = fallback != "cloud" or policy.hedge.parallel_cloud
    mine = state.latency.get(primary)
    if mine is None or mine.ttft_s <= deadline:
        return primary, fallback, False, lead
    theirs = state.latency.get(fallback)
    if theirs is not None and theirs.ttft_p95_s <= deadline:
        reasons.append(
            f"{primary} predicted TTFT {_ms(mine.ttft_s)} > deadline {_ms(deadline)}, "
            f"{fallback} p95 {_ms(theirs.ttft_p95_s)} meets it -> {fallback}"
        )
        return fallback, primary, False, True
    missed = (
        f"{primary} is preferred but predicted at {_ms(mine.ttft_s)} against the "
        f"{_ms(deadline)} deadline"
    )
    held = None if fallback != "cloud" else _parallel_cloud_held(policy, state)
    if held is not None:
        reasons.append(f"{missed}; {held}: the cloud starts only at the deadline")
        return primary, fallback, False, False
    if fallback == "cloud":
        now = "the cloud starts in parallel now (it costs a cloud request; the first token wins)"
    else:
        now = "the local engine starts in parallel now (the first token wins)"
    reasons.append(f"{missed}: {now}")
    return primary, fallback, True, True


def _cloud_queue_misses(deadline: float, state: LiveState) -> bool:
    """The cloud would meet the deadline but for its queue, and the local engine is expected
    to answer sooner than the cloud (or has no prediction)."""
    cloud, local = state.latency.get("cloud"), state.latency.get("local")
    if state.cloud_queue_s <= 0 or cloud is None or cloud.ttft_s <= deadline:
        return False
    return cloud.ttft_s - state.cloud_queue_s <= deadline and (
        local is None or local.ttft_s < cloud.ttft_s
    )


def _parallel_cloud_held(policy: Policy, state: LiveState) -> str | None:
    """Why the policy keeps the cloud from starting beside the local engine now, or None."""
    if not policy.hedge.parallel_cloud:
        return f"policy {policy.name!r} forbids a parallel cloud start (parallel_cloud = false)"
    cap = policy.hedge.parallel_cloud_share
    if cap is None:
        return None
    started, seen = state.parallel_recent
    if (started + 1) / (seen + 1) <= cap:  # the share, this request included, stays in the cap
        return None
    return (
        f"policy {policy.name!r} caps parallel cloud starts at {cap:.0%} of its requests "
        f"({started} of the last {seen})"
    )


def _hedge(
    policy: Policy,
    primary: EngineName,
    fallback: EngineName | None,
    state: LiveState,
    reasons: list[str],
    deadline: float | None = None,
    lead: bool = True,
) -> float | None:
    if fallback is None or policy.hedge.after_ms is None or "hedge" not in policy.plans:
        return None
    if policy.hedge.after_ms != "auto":
        hedge_s = policy.hedge.after_ms / 1000.0
        reasons.append(f"hedge: {fallback} starts after {_ms(hedge_s)} without a token")
        return hedge_s
    mine, theirs = state.latency.get(primary), state.latency.get(fallback)
    if mine is None or mine.samples < AUTO_HEDGE_MIN_SAMPLES or not mine.ttft_samples:
        return None  # not enough history yet: the deadline alone applies
    if theirs is None:
        return None
    backup = theirs.ttft_samples or (theirs.ttft_s,)
    price = weight = 0.0
    if fallback == "local":
        weight = policy.hedge.device_weight
        cost = f"device time until the first token x {weight:g}"
    else:
        price = policy.hedge.cloud_price_ms / 1000.0
        cost = f"a cloud request priced at {_ms(price)}"
    cap = None
    if deadline is not None:
        cap = deadline - (min(max(0.0, theirs.ttft_s), deadline / 2) if lead else 0.0)
    c = choose_hedge_delay(mine.ttft_samples, backup, price_s=price, weight=weight, cap_s=cap)
    if c.delay_s is None:
        reasons.append(
            f"auto hedge: none pays ({primary} p99 TTFT {_ms(c.baseline_tail_s)}; a {fallback} "
            f"hedge costs {cost})"
        )
        return None
    reasons.append(
        f"auto hedge: {fallback} starts after {_ms(c.delay_s)} without a token (expected p99 "
        f"TTFT {_ms(c.tail_s)} against {_ms(c.baseline_tail_s)}, on {c.fire_rate:.0%} more "
        f"requests; a hedge costs {cost})"
    )
    return c.delay_s


def _speculative(
    decision: Decision, facts: RequestFacts, policy: Policy, state: LiveState, reasons: list[str]
) -> Decision:
    """5. The speculative plan, when asked for or allowed and expected to pay."""
    asked = facts.plan == "speculative"
    if not asked and "speculative" not in policy.plans:
        return decision
    if decision.primary is None:
        return decision
    if facts.forced is not None or set(decision.engines) != {"local", "cloud"}:
        if asked:
            reasons.append("plan=speculative needs both engines allowed -> " + decision.plan)
            return replace(decision, reasons=tuple(reasons))
        return decision
    pays, why = state.speculation or (False, "no speculation state")
    if not asked and not pays:
        reasons.append(f"no speculative plan: {why}")
        return replace(decision, reasons=tuple(reasons))
    reasons.append(
        f"speculative: {'asked by the caller' if asked else 'expected to pay'} ({why}); "
        "local drafts, cloud verifies"
    )
    return Decision(
        "speculative", "cloud", "local", decision.deadline_s, None, False, tuple(reasons),
        failover="local" in state.continues,
    )  # fmt: skip
