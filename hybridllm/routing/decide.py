"""`decide()`: where one request runs and why, as a pure function of plain facts.

Inputs: the request's facts (prompt and output tokens, the router's score, the kinds of personal
data found, the plan asked for, whether the answer is streamed), the policy, and the live state
(latency predictions per engine, whether the budget covers the worst-case cloud cost, the
circuits, the local queue, which engines read their own signals, the router's presence). Output:
a frozen `Decision` (these types: `routing/decision.py`). Code acts on its typed fields only:
the plan, the primary engine, the fallback (or None), the first-token deadline, the hedge delay,
the load rule that fired (`LoadRule`; `fallback_now`: the fallback starts at once), whether the
router's score asked for the cloud (`by_router`), a refusal's cause (`RefusalCause`), and each
reason's `code` (`ReasonCode`: the rule that spoke). A reason's words are for people, never read
back: rewording one changes no error type and no plan.

The rules, in order (each one that applies adds a reason, with its code):

1. The engine asked for: a forced engine; `prefer`/`fallback_order`; for "auto", the router's
   score against its threshold (score >= threshold: cloud), else local first.
2. Which engines may serve: the client's, the policy's (`allow_cloud`, `fallback_order`), a
   privacy finding (keep-local, or privacy on without a scanner: no cloud; block: refuse), the
   budget (cannot cover the worst case: no cloud, or refuse when `on_exceeded = "fail"` and the
   cloud was asked for), the cloud circuit (open: no cloud, unless forced or the only engine),
   the local circuit (open: the cloud serves where it may, unless the local engine is forced or
   the only one), an unavailable engine (`LiveState.unavailable`: a cloud without a usable API
   key, a local queue at its bound): left out with its reason when another engine may serve,
   else kept (it fails at once with its typed error: `CloudUnavailableError`, `QueueFullError`).
   A cloud left out that the request could have used is named in `Decision.unavailable` (the
   stream says so with a `CloudUnavailable` event).
3. Load (with a deadline and two engines): a local queue alone longer than the deadline, or a
   primary predicted past the deadline while the other's p95 meets it, swaps the two; a
   primary predicted past the deadline otherwise keeps its place but the other one, where it is
   predicted sooner, starts in parallel at once (predictive start: the first token wins). A
   cloud started that way is a cloud request paid for even when the local engine wins, and the
   reason says so; the policy
   may forbid it (`[hedge] parallel_cloud = false`) or cap its share of the policy's recent requests
   (`parallel_cloud_share`, against `LiveState.parallel_recent`): then the cloud starts only at
   the deadline itself (`Decision.fallback_lead` False).
4. Decode speed (`decode_speed.py`): with a `tpot_target_ms`, a local primary predicted to decode
   slower than the target on a long answer (max_tokens >= `LONG_ANSWER_TOKENS`) hands the answer
   to the cloud after its first tokens ("handoff", where the policy allows that plan) or gives
   the cloud the request (when the cloud meets the deadline); `plan = "handoff"` asks for the
   handoff outright.
5. The plan: "handoff" (4.); "hedge" when the policy asks for one (a fixed delay, or "auto": the
   delay `routing.hedging.hedge_delay` prices against the primary's TTFT distribution once it
   has a history), else "single" (fallback at the deadline or on failure); "speculative" (asked for,
   or listed and expected to pay: local drafts, cloud verifies); "cascade" (asked for, or listed
   under `prefer = "auto"`, where the local engine reads its own signals and there is a router:
   the local engine holds its first tokens, or under `complete()` with `cascade_judge =
   "answer"` its whole answer, and the router's stage 2 decides who answers); "refuse" when
   nothing may serve. The plan asked for is the call's `plan=` (`RequestFacts.plan`), else the
   policy's `plan`. A failure mid-answer moves the answer to the other engine only when both
   engines can continue a started answer (`LiveState.continues`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal, NamedTuple

from hybridllm.events import EngineName
from hybridllm.policy import PLAN_NAMES, SPLITTING_PLANS, PlanName, Policy
from hybridllm.routing.decision import (
    Decision,
    LiveState,
    LoadRule,
    Objective,
    PlanKind,
    Reason,
    RefusalCause,
    RequestFacts,
    RoutePreview,
)
from hybridllm.routing.decode_speed import decode_rule
from hybridllm.routing.hedging import hedge_delay, quality_price_s

# an engine the load rules have kept from a first token this many requests is probed: the rules
# leave it its place once (the deadline race still rescues it), so a prediction never locks it out
PROBE_AFTER = 8

# the decision's types live in `routing.decision`; importable from here too, as before
__all__ = ["Decision", "LiveState", "RequestFacts", "RoutePreview", "decide"]

# what took the cloud out of the engines that may serve (a refusal's cause comes from it)
_Removal = Literal["policy", "privacy", "no_scanner", "budget", "circuit"]


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def _refuse(reasons: list[Reason], deadline: float | None, cause: RefusalCause) -> Decision:
    return Decision("refuse", None, None, deadline, None, tuple(reasons), refusal=cause)


def _cause(removed: _Removal | None, otherwise: RefusalCause) -> RefusalCause:
    """A refusal's cause: the privacy finding or the budget that took the cloud out, else
    `otherwise`."""
    return removed if removed == "privacy" or removed == "budget" else otherwise


def decide(facts: RequestFacts, policy: Policy, state: LiveState) -> Decision:
    reasons: list[Reason] = []
    deadline_ms = policy.routing.ttft_deadline_ms
    deadline = None if deadline_ms is None else deadline_ms / 1000.0
    allowed: list[EngineName] = [e for e in policy.order if e in state.available]
    asked = facts.plan if facts.plan is not None else policy.plan
    policy, asked = _whole_answer(facts, policy, asked, reasons)
    want, by_router, objective = _wanted(facts, policy, reasons)
    refused, removed = _restrict(facts, policy, state, allowed, want, reasons, objective)
    if refused:
        return _refuse(reasons, deadline, _cause(removed, "no_engine"))
    too_long = _too_long(facts, state, allowed, reasons)
    loud = policy.sampling.overflow == "error"  # the policy asks for the error, not a detour
    if too_long and (loud or not allowed):  # no engine left can hold it: an error at once
        refused_for = _refuse(reasons, deadline, "context_overflow")
        return replace(refused_for, overflowed=too_long)
    local_off = _local_circuit(facts, state, allowed, reasons)
    left_out = _unavailable(facts, state, allowed, reasons)
    # a reason already says why an engine is missing (`no <engine> engine` would repeat it)
    absence_noted = (
        removed is not None or local_off or bool(too_long) or any(e == "cloud" for e, _ in left_out)
    )
    if want not in allowed:  # the engine asked for is out: what took it out is the objective
        objective = "availability" if removed is None else _REMOVED_FOR[removed]
    decision = _serve(
        facts, policy, state, allowed, (want, objective), absence_noted, reasons, deadline, asked
    )
    if decision.primary is None:
        return replace(decision, refusal=_cause(removed, decision.refusal or "no_engine"))
    decision = replace(decision, by_router=by_router)
    decision = _speculative(decision, facts, policy, state, reasons, asked)
    decision = _cascade(decision, facts, policy, state, reasons, asked)
    decision = _registered(decision, reasons, asked)
    if too_long:
        decision = replace(decision, overflowed=too_long)
    if left_out:
        decision = replace(decision, unavailable=left_out)
    return _note_cached(decision, facts, state)


def _registered(decision: Decision, reasons: list[Reason], asked: PlanName | None) -> Decision:
    """A registered plan asked for (`runtime.plans.registry`) runs on the engines the decision
    chose (its primary, and its fallback where it has one)."""
    if asked is None or asked in PLAN_NAMES or decision.plan not in ("single", "hedge"):
        return decision
    reasons.append(Reason("registered_plan", f"plan={asked}, a registered plan -> {asked}"))
    return replace(decision, plan=asked, reasons=tuple(reasons))


def _note_cached(decision: Decision, facts: RequestFacts, state: LiveState) -> Decision:
    """Say how much of the prompt the local engine holds, where it may serve (words only)."""
    held = state.local_cached_tokens
    if not held or "local" not in decision.engines:
        return decision
    note = f"local holds {held} of the prompt's {facts.prompt_tokens} tokens in its KV cache"
    return replace(decision, reasons=(*decision.reasons, Reason("local_cached", note)))


def _whole_answer(
    facts: RequestFacts, policy: Policy, asked: PlanName | None, reasons: list[Reason]
) -> tuple[Policy, PlanName | None]:
    """0. A tool call or a JSON answer is delivered whole (`runtime.checked`): the handoff
    would split it, the speculative plan verifies text piece by piece, and the cascade judges
    a text prefix, so none of them runs; the race (with its failover) and the single plan do.
    Returns the policy without those plans, and the plan asked for unless it was one."""
    if facts.atomic is None:
        return policy, asked
    if asked in SPLITTING_PLANS:
        what = "may be a tool call" if facts.atomic == "tools" else "is JSON"
        text = f"plan={asked}, but the answer {what}, delivered whole -> no {asked}"
        reasons.append(Reason("whole_answer", text))
        asked = None
    plans = tuple(p for p in policy.plans if p not in SPLITTING_PLANS)
    plan = None if policy.plan in SPLITTING_PLANS else policy.plan
    return policy.model_copy(update={"plans": plans, "plan": plan}), asked


# the objective of a decision whose wanted engine was taken out, by what took it out
_REMOVED_FOR: dict[_Removal, Objective] = {
    "policy": "privacy",
    "privacy": "privacy",
    "no_scanner": "privacy",
    "budget": "cost",
    "circuit": "availability",
}


def _serve(
    facts: RequestFacts,
    policy: Policy,
    state: LiveState,
    allowed: list[EngineName],
    wanted: tuple[EngineName, Objective],
    absence_noted: bool,
    reasons: list[Reason],
    deadline: float | None,
    asked: PlanName | None,
) -> Decision:
    """3. and 4.: the serving engine, its fallback, the load rules and the plan."""
    want, objective = wanted
    picked = _pick(facts, allowed, want, absence_noted, reasons, deadline)
    if isinstance(picked, Decision):
        return replace(picked, objective=objective)
    if deadline is None:
        load = picked
    else:
        load = _load(picked, deadline, policy, state, reasons, objective)
    if load.rule in _SWAPS:
        objective = "latency"
    primary, fallback, handoff = load.primary, load.fallback, False
    if fallback is not None and load.rule != "parallel_start":  # 4. decode speed
        primary, fallback, handoff = decode_rule(
            facts.max_tokens,
            policy,
            primary,
            fallback,
            state.latency,
            state.continues,
            deadline,
            reasons,
            asked,
        )
    if (primary, fallback) != (load.primary, load.fallback) or handoff:
        objective = "latency"  # the decode speed moved the answer
    rescue = _rescues(objective, primary, fallback)
    hedge_s, release_s = None, None
    if load.rule != "parallel_start" and not handoff:
        wrong = _wrong_p(facts) if rescue else None
        hedged = hedge_delay(
            policy, primary, fallback, state, reasons, deadline, load.early_start, asked, wrong
        )
        hedge_s = hedged.delay_s
        if hedged.delivers:  # an automatic hedge priced with the quality it may lose
            release_s = hedge_s
    if rescue and release_s is None:
        _rescue_reason(fallback, deadline, reasons)
        price_s = quality_price_s(policy, _wrong_p(facts))
        release_s = (
            math.inf
            if deadline is None
            else _rescue_release(primary, fallback, deadline, price_s, state, reasons)
        )
    plan: PlanKind = "handoff" if handoff else "hedge" if hedge_s is not None else "single"
    failover = _failover(primary, fallback, state, reasons)
    return Decision(
        plan,
        primary,
        fallback,
        deadline,
        hedge_s,
        tuple(reasons),
        failover,
        fallback_lead=load.early_start,
        load=load.rule,
        load_reason=load.why,
        objective=objective,
        release_s=release_s,
        probe=_probed(load, state),
    )


def _probed(load: _Load, state: LiveState) -> EngineName | None:
    """The engine this request probes (its unmeasured count starts again), or None."""
    if load.probe:
        return load.primary
    if "cloud" in (load.primary, load.fallback) and _probes_slow_cloud(state):
        return "cloud"
    return None


# the load rules that give the request to the other engine (the objective becomes latency)
_SWAPS: frozenset[LoadRule | None] = frozenset({"local_queue", "cloud_queue", "faster_fallback"})


def _rescues(objective: Objective, primary: EngineName, fallback: EngineName | None) -> bool:
    """Is the fallback a rescue, not a competitor (a cloud chosen for quality, local behind)?"""
    return objective == "quality" and (primary, fallback) == ("cloud", "local")


def _wrong_p(facts: RequestFacts) -> float:
    """P(the local answer is wrong): the router's score, else 1 (nothing says the local answer
    will do: the policy asked for the cloud's)."""
    return 1.0 if facts.router_score is None else facts.router_score


def _rescue_reason(
    fallback: EngineName | None, deadline: float | None, reasons: list[Reason]
) -> None:
    if deadline is None:
        text = f"quality: {fallback} answers only if the cloud fails"
    else:
        text = (
            f"quality: {fallback} is a rescue (it may prefill early; its tokens are held until "
            f"the {_ms(deadline)} deadline passes without a cloud token, or the cloud fails)"
        )
    reasons.append(Reason("quality_rescue", text))


def _rescue_release(
    primary: EngineName,
    fallback: EngineName | None,
    deadline: float,
    price_s: float,
    state: LiveState,
    reasons: list[Reason],
) -> float:
    """When a rescue's held tokens go out without a cloud token: at the deadline. A rescue that
    cannot make the deadline itself, released at its first token, would take the quality
    answer's place for the time it saves; where the cloud is expected within one deadline of it
    and that time is worth less than the quality it may lose (`price_s`: P(local wrong) x the
    policy's `quality_weight_ms`), it is held for the cloud's p95 time to a first token, at most
    one deadline past its own expected one (a stalled cloud is still rescued, there)."""
    mine = state.latency.get(primary)
    theirs = None if fallback is None else state.latency.get(fallback)
    if mine is None or theirs is None or theirs.ttft_s <= deadline:
        return deadline
    saved = mine.ttft_s - theirs.ttft_s
    if saved >= deadline or saved >= price_s:
        return deadline
    release = max(deadline, min(mine.ttft_p95_s, theirs.ttft_s + deadline))
    text = (
        f"{fallback} predicted at {_ms(theirs.ttft_s)}, past the {_ms(deadline)} deadline, and "
        f"{primary} at {_ms(mine.ttft_s)}: the time a release at its first token would save is "
        f"worth less than the answer's quality ({_ms(price_s)}) -> its tokens are held until "
        f"{_ms(release)} ({primary}'s p95 {_ms(mine.ttft_p95_s)}, at most a deadline past "
        f"{fallback}'s own)"
    )
    reasons.append(Reason("rescue_no_sooner", text))
    return release


def _pick(
    facts: RequestFacts,
    allowed: list[EngineName],
    want: EngineName,
    absence_noted: bool,
    reasons: list[Reason],
    deadline: float | None,
) -> Decision | _Load:
    """The engine that serves and its fallback, before load; a forced engine (alone) or a
    refusal is already the decision."""
    if facts.forced is not None:
        if facts.forced not in allowed:
            reasons.append(
                Reason("forced_not_allowed", f"engine={facts.forced} is not allowed -> refused")
            )
            return _refuse(reasons, deadline, "forced_not_allowed")
        return Decision("single", facts.forced, None, deadline, None, tuple(reasons))
    if not allowed:
        reasons.append(Reason("no_engine", "no engine this client has is allowed -> refused"))
        return _refuse(reasons, deadline, "no_engine")
    preferred = want
    if want not in allowed:
        preferred = allowed[0]
        if not absence_noted:
            reasons.append(Reason("wanted_missing", f"no {want} engine -> {preferred}"))
    others = [e for e in allowed if e != preferred]
    return _Load(preferred, others[0] if others else None)


def _failover(
    primary: EngineName, fallback: EngineName | None, state: LiveState, reasons: list[Reason]
) -> bool:
    """May a failure mid-answer move the answer to the other engine (both can continue)?"""
    if fallback is None:
        return False
    cannot = [e for e in (primary, fallback) if e not in state.continues]
    if cannot:
        text = f"no mid-stream failover: {' and '.join(cannot)} cannot continue an answer"
        reasons.append(Reason("no_failover", text))
    return not cannot


def _wanted(
    facts: RequestFacts, policy: Policy, reasons: list[Reason]
) -> tuple[EngineName, bool, Objective]:
    """The engine the caller, the policy or the router asks for, before any constraint,
    whether the router's score asked for the cloud, and why (the objective): the cloud is
    asked for its quality; the local engine for speed, or for cost where the router says its
    answer will do."""
    if facts.forced is not None:
        reasons.append(Reason("forced", f"engine={facts.forced} forced by the caller"))
        return facts.forced, False, "caller"
    if policy.routing.prefer != "auto" or policy.routing.fallback_order is not None:
        first = policy.order[0]
        reasons.append(Reason("policy_prefers", f"policy {policy.name!r} prefers {first}"))
        objective = policy.routing.objective
        if objective is None:
            objective = "quality" if first == "cloud" else "latency"
        return first, False, objective
    score, cut = facts.router_score, facts.router_threshold
    if score is None or cut is None:
        text = f"policy {policy.name!r} prefers auto, no router score -> local first"
        reasons.append(Reason("no_router_score", text))
        return "local", False, "latency"
    if facts.router_tier is not None and facts.tier_span is not None:
        tier, (low, high) = facts.router_tier, facts.tier_span
        text = f"router score {score:.2f} in [{low:.2f}, {high:.2f}) -> tier {tier}"
        reasons.append(Reason("router_tier", text))
        by_router = tier != "local"
        return ("cloud" if by_router else "local"), by_router, "quality" if by_router else "cost"
    want: EngineName = "cloud" if score >= cut else "local"
    rel = ">=" if score >= cut else "<"
    reasons.append(
        Reason("router_score", f"router score {score:.2f} {rel} threshold {cut:.2f} -> {want}")
    )
    return want, want == "cloud", "quality" if want == "cloud" else "cost"


def _restrict(
    facts: RequestFacts,
    policy: Policy,
    state: LiveState,
    allowed: list[EngineName],
    want: EngineName,
    reasons: list[Reason],
    objective: Objective,
) -> tuple[bool, _Removal | None]:
    """1. Remove the cloud from `allowed` for the policy, privacy, budget and circuit (one
    opened for slowness keeps a quality decision: its local rescue covers the deadline).
    Returns (refuse now, what removed the cloud, or None)."""
    removed: _Removal | None = None

    def drop(why: _Removal, reason: Reason) -> _Removal:
        reasons.append(reason)
        if "cloud" in allowed:
            allowed.remove("cloud")
        return why

    if not policy.cloud_allowed and "cloud" in state.available:
        text = f"policy {policy.name!r}: never leaves the device -> local"
        removed = drop("policy", Reason("policy_no_cloud", text))
    kinds = facts.privacy_kinds
    if facts.public_names and not kinds:
        text = f"privacy: {_names(facts.public_names)} known to the local model -> public"
        reasons.append(Reason("privacy_public_names", text))
    if facts.names_unread and "cloud" in allowed:
        text = "privacy: names not read yet (NER loading) -> read at the cloud seam"
        reasons.append(Reason("privacy_names_at_seam", text))
    if kinds is None and policy.privacy.mode != "off":
        text = "privacy: no detector to scan the prompt -> local only"
        removed = drop("no_scanner", Reason("privacy_no_scanner", text))
    elif kinds and policy.privacy.mode == "off":
        text = f"privacy: {', '.join(sorted(kinds))} found, but the policy allows it"
        reasons.append(Reason("privacy_allowed", text))
    elif kinds:
        found = ", ".join(sorted(kinds))
        if policy.privacy.mode == "block":
            reasons.append(
                Reason("privacy_blocked", f"privacy: {found} found -> blocked by the policy")
            )
            return True, "privacy"
        removed = drop("privacy", Reason("privacy_local", f"privacy: {found} found -> local only"))
    if "cloud" in allowed and not state.budget_fits:
        detail = f" ({state.budget_detail})" if state.budget_detail else ""
        if policy.budget.on_exceeded == "fail" and want == "cloud":
            text = f"budget: cannot cover the cloud request{detail} -> refused"
            reasons.append(Reason("budget_refused", text))
            return True, "budget"
        text = f"budget: cannot cover the cloud request{detail} -> local"
        removed = drop("budget", Reason("budget_local", text))
    if "cloud" in allowed and state.cloud_circuit_open:
        if facts.forced == "cloud":
            text = "cloud circuit open, but engine=cloud forced -> cloud"
            reasons.append(Reason("cloud_circuit_forced", text))
        elif state.cloud_circuit_slow and objective == "quality" and "local" in allowed:
            text = "cloud circuit open for slowness, but a quality decision -> cloud"
            reasons.append(Reason("cloud_circuit_slow_quality", text))
        elif _probes_slow_cloud(state):
            n = state.unmeasured["cloud"]
            text = f"cloud circuit open for slowness, unmeasured {n} requests -> probed"
            reasons.append(Reason("cloud_circuit_probe", text))
        elif "local" in allowed:
            removed = drop("circuit", Reason("cloud_circuit_open", "cloud circuit open -> local"))
        else:  # nothing else could answer: try it rather than fail without trying
            text = "cloud circuit open, but no other engine -> cloud"
            reasons.append(Reason("cloud_circuit_only_engine", text))
    return False, removed


def _local_circuit(
    facts: RequestFacts, state: LiveState, allowed: list[EngineName], reasons: list[Reason]
) -> bool:
    """An open local circuit leaves the request to the cloud where the cloud may serve; a
    forced local engine, or the only one left, is still tried. True: the local engine is out."""
    if not state.local_circuit_open or "local" not in allowed:
        return False
    if facts.forced == "local":
        text = "local circuit open, but engine=local forced -> local"
        reasons.append(Reason("local_circuit_forced", text))
    elif "cloud" in allowed:
        allowed.remove("local")
        reasons.append(Reason("local_circuit_open", "local circuit open -> cloud"))
        return True
    else:
        text = "local circuit open, but no other engine -> local"
        reasons.append(Reason("local_circuit_only_engine", text))
    return False


def _too_long(
    facts: RequestFacts, state: LiveState, allowed: list[EngineName], reasons: list[Reason]
) -> tuple[EngineName, ...]:
    """Leave out the engines whose context cannot hold the prompt (with room for one output
    token), before any work: they would raise `ContextOverflowError`, so the request goes to one
    that can, a routing fact rather than a failure. An engine that holds the prompt but not all
    of `max_tokens` stays, primary or fallback: it answers what its context leaves (the engines
    bound `max_tokens` so), which beats no answer where the other engine fails. Returns the
    engines left out; where none is left, `decide()` refuses with "context_overflow"."""
    out: list[EngineName] = []
    for engine in list(allowed):
        n_ctx = state.context.get(engine)
        if n_ctx is None or facts.prompt_tokens < n_ctx:
            continue
        allowed.remove(engine)
        out.append(engine)
        where = f"-> {allowed[0]}" if allowed else "and no other engine can hold it"
        text = (
            f"{engine}: a prompt of {facts.prompt_tokens} tokens does not fit its context of "
            f"{n_ctx} {where}"
        )
        reasons.append(Reason("context_overflow", text))
    return tuple(out)


def _unavailable(
    facts: RequestFacts, state: LiveState, allowed: list[EngineName], reasons: list[Reason]
) -> tuple[tuple[EngineName, str], ...]:
    """Leave out the engines that cannot take a request now while another may serve; one that
    is forced or the last one left stays (it fails at once, with its typed error)."""
    left_out: list[tuple[EngineName, str]] = []
    for engine in list(allowed):
        why = state.unavailable.get(engine)
        if why is None:
            continue
        if facts.forced == engine:
            text = f"{engine}: {why}, but engine={engine} forced -> {engine} (fails)"
            reasons.append(Reason("unavailable_forced", text))
        elif len(allowed) > 1:
            allowed.remove(engine)
            reasons.append(Reason("unavailable", f"{engine}: {why} -> {allowed[0]}"))
            left_out.append((engine, why))
        else:
            text = f"{engine}: {why}, and no other engine -> {engine} (fails)"
            reasons.append(Reason("unavailable_only_engine", text))
    return tuple(left_out)


def _probes_slow_cloud(state: LiveState) -> bool:
    """A cloud circuit open for slowness lets a request probe the cloud once it has gone
    `PROBE_AFTER` requests without a measured first token (its timer may be long)."""
    return state.cloud_circuit_slow and state.unmeasured.get("cloud", 0) >= PROBE_AFTER


class _Load(NamedTuple):
    """The engines after the load rules: who serves, who follows, the rule that fired (with its
    words), and whether the fallback may start ahead of the deadline."""

    primary: EngineName
    fallback: EngineName | None
    rule: LoadRule | None = None
    why: str = ""
    early_start: bool = True  # the fallback may start ahead of the deadline, by its TTFT
    probe: bool = False  # the primary keeps its place as a probe (`PROBE_AFTER`)


def _load(
    start: _Load,
    deadline: float,
    policy: Policy,
    state: LiveState,
    reasons: list[Reason],
    objective: Objective,
) -> _Load:
    """3. Swap the engines, or start both at once, when the primary cannot make the deadline. A
    cloud chosen for quality keeps the request: the local engine is its rescue (never a swap or
    a competitor), and an engine the rules have kept from a first token for `PROBE_AFTER`
    requests is probed (left its place once). A cloud whose own concurrency queue makes it
    miss the deadline gives even a quality decision to the local engine (the wait is known, not
    a draw from a tail: the rescue would answer anyway)."""
    primary, fallback = start.primary, start.fallback
    if _rescues(objective, primary, fallback) and not _cloud_queue_misses(deadline, state):
        return _quality_keeps(start, deadline, state, reasons)
    if primary == "local" and state.local_queue_s > deadline:
        queue = f"local queue {_ms(state.local_queue_s)} > deadline {_ms(deadline)}"
        if fallback is None:
            text = f"{queue}, but no other engine is allowed -> local"
            reasons.append(Reason("local_queue_only_engine", text))
            return start
        return _fired(reasons, _Load(fallback, primary, "local_queue", f"{queue} -> {fallback}"))
    if fallback is None:
        return start
    if primary == "cloud" and _cloud_queue_misses(deadline, state):
        why = (
            f"cloud queue {_ms(state.cloud_queue_s)} (concurrency limit) puts its TTFT at "
            f"{_ms(state.latency['cloud'].ttft_s)} > deadline {_ms(deadline)} -> {fallback}"
        )
        return _fired(reasons, _Load(fallback, primary, "cloud_queue", why))
    # a cloud the policy never starts in parallel waits for the deadline itself
    early_start = fallback != "cloud" or policy.hedge.parallel_cloud
    mine = state.latency.get(primary)
    if mine is None or mine.ttft_s <= deadline:
        return _Load(primary, fallback, early_start=early_start)
    unmeasured = state.unmeasured.get(primary, 0)
    if unmeasured >= PROBE_AFTER:
        text = (
            f"{primary} predicted at {_ms(mine.ttft_s)} against the {_ms(deadline)} deadline, "
            f"but unmeasured for {unmeasured} requests -> probed (the deadline still rescues)"
        )
        reasons.append(Reason("probe", text))
        return _Load(primary, fallback, early_start=early_start, probe=True)
    theirs = state.latency.get(fallback)
    if theirs is not None and theirs.ttft_p95_s <= deadline:
        why = (
            f"{primary} predicted TTFT {_ms(mine.ttft_s)} > deadline {_ms(deadline)}, "
            f"{fallback} p95 {_ms(theirs.ttft_p95_s)} meets it -> {fallback}"
        )
        return _fired(reasons, _Load(fallback, primary, "faster_fallback", why))
    missed = (
        f"{primary} is preferred but predicted at {_ms(mine.ttft_s)} against the "
        f"{_ms(deadline)} deadline"
    )
    if theirs is not None and theirs.ttft_s >= mine.ttft_s:  # a parallel start buys nothing
        text = f"{missed}, and {fallback} no sooner ({_ms(theirs.ttft_s)}): no parallel start"
        reasons.append(Reason("no_parallel_start", text))
        return _Load(primary, fallback, early_start=early_start)
    held = None if fallback != "cloud" else _parallel_cloud_held(policy, state)
    if held is not None:
        why = f"{missed}; {held}: the cloud starts only at the deadline"
        return _fired(reasons, _Load(primary, fallback, "parallel_held", why, early_start=False))
    if fallback == "cloud":
        now = "the cloud starts in parallel now (it costs a cloud request; the first token wins)"
    else:
        now = "the local engine starts in parallel now (the first token wins)"
    return _fired(reasons, _Load(primary, fallback, "parallel_start", f"{missed}: {now}"))


def _quality_keeps(start: _Load, deadline: float, state: LiveState, reasons: list[Reason]) -> _Load:
    """A cloud chosen for quality keeps the request whatever its predicted TTFT or queue; the
    local engine starts ahead of the deadline by its own TTFT, as a rescue."""
    cloud = state.latency.get("cloud")
    if cloud is not None and cloud.ttft_s > deadline:
        text = (
            f"cloud predicted at {_ms(cloud.ttft_s)} against the {_ms(deadline)} deadline, "
            "but chosen for quality -> cloud keeps it"
        )
        reasons.append(Reason("quality_keeps", text))
    return _Load(start.primary, start.fallback, early_start=True)


def _fired(reasons: list[Reason], load: _Load) -> _Load:
    """The load rule that fired, with its words among the reasons (its code: the rule)."""
    if load.rule is not None:
        reasons.append(Reason(load.rule, load.why))
    return load


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
        name = policy.name
        return f"policy {name!r} forbids a parallel cloud start ([hedge] parallel_cloud = false)"
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


def _speculative(
    decision: Decision,
    facts: RequestFacts,
    policy: Policy,
    state: LiveState,
    reasons: list[Reason],
    plan: PlanName | None,
) -> Decision:
    """5. The speculative plan, when asked for or allowed and expected to pay."""
    asked = plan == "speculative"
    if not asked and "speculative" not in policy.plans:
        return decision
    if facts.forced is not None or set(decision.engines) != {"local", "cloud"}:
        if asked:
            text = "plan=speculative needs both engines allowed -> " + decision.plan
            reasons.append(Reason("speculative_needs_both", text))
            return replace(decision, reasons=tuple(reasons))
        return decision
    pays, why = state.speculation or (False, "no speculation state")
    if not asked and not pays:
        reasons.append(Reason("no_speculative", f"no speculative plan: {why}"))
        return replace(decision, reasons=tuple(reasons))
    by = "expected to pay" if not asked else f"asked by the {_asker(facts)}"
    text = f"speculative: {by} ({why}); local drafts, cloud verifies"
    reasons.append(Reason("speculative_asked" if asked else "speculative", text))
    return _planned(decision, "speculative", "cloud", reasons, failover="local" in state.continues)


def _planned(
    decision: Decision,
    plan: PlanKind,
    primary: EngineName,
    reasons: list[Reason],
    **extra: Any,
) -> Decision:
    """`decision` taken over by a plan of both engines (speculative, cascade): `primary` serves
    first, the other engine is its fallback; no hedge, no load rule of its own."""
    return replace(
        decision,
        plan=plan,
        primary=primary,
        fallback="local" if primary == "cloud" else "cloud",
        hedge_s=None,
        reasons=tuple(reasons),
        fallback_lead=True,
        load=None,
        load_reason="",
        objective="quality",  # the cloud's answer is what both plans deliver or verify
        release_s=None,
        **extra,
    )


def _asker(facts: RequestFacts) -> str:
    return "caller" if facts.plan is not None else "policy"


def _cascade(
    decision: Decision,
    facts: RequestFacts,
    policy: Policy,
    state: LiveState,
    reasons: list[Reason],
    plan: PlanName | None,
) -> Decision:
    """5. The cascade (`runtime/plans/cascade.py`): the local engine holds its first tokens
    while the router's stage 2 reads its confidence. Asked for (`plan = "cascade"`), or listed
    in the policy's plans under `prefer = "auto"`; it runs where both engines may serve, the
    local one reads its own signals, there is a router, and the local engine is in play by
    choice (serving first, or moved to the cloud by the router's score alone: not by load,
    privacy, budget or a circuit)."""
    if plan not in ("cascade", None) or "cascade" not in (*policy.plans, plan):
        return decision
    if plan is None and policy.routing.prefer != "auto":
        return decision
    missing = _cascade_missing(decision, state)
    if missing is not None:
        if plan == "cascade":
            text = f"plan=cascade, but {missing} -> {decision.plan}"
            reasons.append(Reason("no_cascade", text))
            return replace(decision, reasons=tuple(reasons))
        return decision
    judge = "prefix" if facts.streamed else policy.cascade.judge
    held = f"its first tokens (up to {policy.cascade.hold_tokens})"
    if judge == "answer":
        held = "its whole answer (nothing is streamed)"
    by = "expected by the policy" if plan is None else f"asked by the {_asker(facts)}"
    text = (
        f"cascade ({by}): the local engine holds {held} while the router reads its confidence; "
        "confident -> local goes on, else -> cloud"
    )
    reasons.append(Reason("cascade" if plan is None else "cascade_asked", text))
    return _planned(decision, "cascade", "local", reasons, cascade_judge=judge)


def _cascade_missing(decision: Decision, state: LiveState) -> str | None:
    """What keeps the cascade from running, in words; None: nothing."""
    if not state.has_router:
        return "the client has no router"
    if "local" not in state.reads_signals:
        return "the local engine cannot read its own signals"
    if set(decision.engines) != {"local", "cloud"}:
        return "it needs both engines allowed"
    if decision.primary != "local" and not decision.by_router:
        return "the cloud serves first for a reason other than the router's score"
    return None


def _names(n: int) -> str:
    return "a name alone" if n == 1 else f"{n} names alone"
