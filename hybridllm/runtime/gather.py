"""Gather the facts and the live state for `decide()` (the impure half of routing).

`Gatherer` holds what a client routes with (the latency model and the optional router, budget
gate and privacy scan) and turns one request into `RequestFacts` + `LiveState`: prompt tokens
(`engines.base.count_prompt_tokens`: the local engine's tokenizer once it is loaded, else the
script-aware estimate; for the local engine less the prefix it shares with the previous local
prompt, which llama.cpp keeps in its KV cache; the budget asks about `prompt_token_bound`, the
upper bound its reservation will hold), which engines can continue a started answer, the router's
score and the policy's threshold, the kinds of personal data found, each engine's predicted
latency (the latency model once it knows the engine, else the engine's own estimate), the local
queue, the budget verdict, the cloud and local circuits, which engines read their own signals
(`engines.capabilities.ReadsSignals`) and whether there is a router (for the cascade), the
engines that cannot take a request now (`EngineInfo.unavailable`: a cloud without a usable key,
a local queue at its bound), and how many of the policy's last `PARALLEL_WINDOW` requests
started a cloud request that did not serve the answer (for `Policy.parallel_cloud_share`: each
decided request, not a preview, is noted here as it is decided, by its parallel start, and again
when it ends, if a cloud request it started was cancelled: a hedge or rescue that lost).

The client's gates live here too: `GuardBudget` answers routing's `BudgetGate` from the cloud
guard's ledger, `privacy_kinds` its `PrivacyScan` (the NER layer only for a request that could
reach the cloud, or under privacy "block"), and `policy_caps` turns a policy's `[budget]`
into ledger caps. Routing sees only the protocols; this room imports both sides.
"""

from __future__ import annotations

import functools
import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from hybridllm import errors
from hybridllm.engines.base import (
    Engine,
    EngineInfo,
    GenerationRequest,
    count_prompt_tokens,
    prompt_token_bound,
)
from hybridllm.engines.capabilities import (
    Drafts,
    KnowsCache,
    LimitsConcurrency,
    ReadsSignals,
    VerifiesAtEndpoint,
    Wraps,
)
from hybridllm.events import EngineName
from hybridllm.guard.budget import Cap, Period
from hybridllm.guard.guarded import GuardedEngine
from hybridllm.guard.privacy import kinds, tool_texts
from hybridllm.guard.privacy_ner import default_scanner, ner_wanted
from hybridllm.policy import PlanName, Policy, Tenant
from hybridllm.routing.decide import decide
from hybridllm.routing.decision import (
    Atomic,
    Decision,
    LiveState,
    RequestFacts,
    RoutePreview,
)
from hybridllm.routing.inputs import BudgetGate, BudgetVerdict, Prediction, PrivacyScan, Scorer
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.plans.speculative.outlook import SpeculationState
from hybridllm.runtime.trim import trim_to_fit

# how many recent local prompts routing assumes the local engine still holds (live or saved)
LOCAL_PROMPTS = 16
# how many of a policy's recent requests `Policy.parallel_cloud_share` is measured over
PARALLEL_WINDOW = 20


@dataclass
class CloudStart:
    """One decided request in its policy's window: did it start a cloud request beside another
    engine (at once, or cancelled once the other won)? Set at the decision, then at the end."""

    extra: bool


def prompt_text(messages: Sequence[Mapping[str, str]]) -> str:
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


def uncached_share(text: str, last: str | Sequence[str] | None) -> float:
    """The share of `text` the local engine must prefill if its KV cache, or one of its saved
    states (`engines.llama.kvstore`), holds `last` (a previous local prompt, or several): the
    longest common prefix is reused."""
    held = [last] if isinstance(last, str) else list(last or ())
    if not text or not held:
        return 1.0
    best = max(len(os.path.commonprefix([text, h])) for h in held)
    return 1.0 - best / len(text)


@dataclass
class Gatherer:
    latency: LatencyModel = field(default_factory=LatencyModel)
    router: Scorer | None = None
    budget: BudgetGate | None = None
    privacy: PrivacyScan | None = None
    # whether `privacy` would read names at once (False while the NER pipelines load)
    ner_ready: Callable[[], bool] = field(default=lambda: True)
    # the recent local prompts: what the local engine's KV cache and its saved states likely
    # hold (newest last; a bounded guess at the engine's store, see `note_local`)
    local_prompts: deque[str] = field(default_factory=lambda: deque(maxlen=LOCAL_PROMPTS))
    # per policy name, its last PARALLEL_WINDOW decided requests: did each start a cloud request
    # beside another engine (in parallel, or cancelled once the other won)?
    parallel: dict[str, deque[CloudStart]] = field(default_factory=dict)
    # the speculative plan's verifiers and measured outlook (set by the client)
    speculation: SpeculationState = field(default_factory=SpeculationState)

    def parallel_recent(self, policy: str) -> tuple[int, int]:
        """(parallel cloud starts, requests) among the policy's recent requests."""
        recent = self.parallel.get(policy, ())
        return sum(r.extra for r in recent), len(recent)

    def note_decision(self, policy: str, decision: Decision) -> CloudStart | None:
        """A request under `policy` was decided (and will run): count its parallel start, and
        start the count of a probed engine afresh (`LatencyModel.probed`). The entry returned
        is marked again when the request ends (`CloudStart.extra`)."""
        if decision.primary is None:
            return None
        if decision.probe is not None:
            self.latency.probed(decision.probe)
        window = self.parallel.setdefault(policy, deque(maxlen=PARALLEL_WINDOW))
        window.append(entry := CloudStart(decision.parallel_cloud))
        return entry

    def note_local(self, messages: Sequence[Mapping[str, str]]) -> None:
        """The local engine ran this prompt: its prefix is in the KV cache now, and stays in a
        saved state once another prompt takes the cache."""
        text = prompt_text(messages)
        kept = [p for p in self.local_prompts if not text.startswith(p)]  # extended: replaced
        self.local_prompts.clear()
        self.local_prompts.extend([*kept, text])

    @property
    def last_local_prompt(self) -> str | None:
        return self.local_prompts[-1] if self.local_prompts else None

    def local_tokens(
        self, facts: RequestFacts, request: GenerationRequest, cached: int | None = None
    ) -> float:
        """The prompt tokens the local engine would have to prefill: less what it says it holds
        (`cached`), else less the longest prefix shared with its recent prompts."""
        if cached is not None:
            return max(0.0, facts.prompt_tokens - cached)
        share = uncached_share(prompt_text(request.messages), self.local_prompts)
        return facts.prompt_tokens * share

    @staticmethod
    def local_cached(
        request: GenerationRequest, engines: Mapping[EngineName, Engine]
    ) -> int | None:
        """What the local engine says it holds of this prompt (None: it cannot say)."""
        local = engines.get("local")
        if local is None or not _declares(local, KnowsCache):
            return None
        return cast(KnowsCache, local).cached_tokens(request.messages)

    def seed_from(self, engines: Mapping[EngineName, Engine]) -> None:
        """Use warm-up figures (prefill rate, step time) as the latency model's priors."""
        for name, engine in engines.items():
            info = engine.info()
            tps, decode_tps = info.prefill_tps, info.decode_tps
            if tps is not None and tps > 0:
                tpot = 1.0 / decode_tps if decode_tps else None
                self.latency.seed(name, prefill_tps=tps, tpot_s=tpot, overhead_s=tpot)

    def trimmed(
        self,
        request: GenerationRequest,
        policy: Policy,
        engines: Mapping[EngineName, Engine],
    ) -> tuple[GenerationRequest, int]:
        """`request` cut to the local context where the policy says `[sampling] overflow =
        "trim"` (`runtime.trim`), and how many messages were dropped (0: none)."""
        local = engines.get("local")
        n_ctx = None if local is None else local.info().n_ctx
        if policy.sampling.overflow != "trim" or local is None or n_ctx is None:
            return request, 0
        return trim_to_fit(request, n_ctx=n_ctx, count=lambda m: count_prompt_tokens(m, (local,)))

    def facts(
        self,
        request: GenerationRequest,
        policy: Policy,
        forced: EngineName | None,
        engines: Mapping[EngineName, Engine] | None = None,
        *,
        preview: bool = False,
    ) -> RequestFacts:
        """The request's facts: its prompt tokens, the router's score and threshold, the kinds
        of personal data found. The costly part of admission: `HybridClient` runs this on a
        worker thread for a long prompt or with the NER layer. `preview` (nothing is sent, no
        deadline runs): names are read even while the NER pipelines load."""
        score = cut = tier = span = None
        if self.router is not None and forced is None and _uses_router(policy):
            score = self.router.score(request.messages)
            if policy.routing.tiers is not None:
                tier, span, cut = _tier(self.router, policy, score)
            else:
                cut = policy.routing.router_threshold
            if cut is None:
                cut = self.router.threshold(
                    cloud_share=policy.routing.target_cloud_share,
                    quality_floor=policy.routing.quality_floor,
                )
        kinds: frozenset[str] | None = frozenset()
        unread = False
        if policy.privacy.mode != "off":
            if self.privacy is None:
                kinds = None
            else:
                deep, unread = self._deep(policy, forced, engines, preview)
                extra = tuple(tool_texts(request.tools))  # the tool definitions it sends
                kinds = frozenset(self.privacy(request.messages, deep=deep, extra=extra))
        return RequestFacts(
            prompt_tokens=count_prompt_tokens(request.messages, (engines or {}).values()),
            max_tokens=request.max_tokens,
            router_score=score,
            router_threshold=cut,
            router_tier=tier,
            tier_span=span,
            privacy_kinds=kinds,
            names_unread=unread,
            forced=forced,
            atomic=_atomic(request),
        )

    def _deep(
        self,
        policy: Policy,
        forced: EngineName | None,
        engines: Mapping[EngineName, Engine] | None,
        preview: bool,
    ) -> tuple[bool, bool]:
        """Whether routing's privacy scan reads names (the NER layer), and whether it left them
        unread. A request that stays local, or a local-first policy, pays for the patterns
        alone. So does a keep-local request while the NER pipelines still load (seconds, at a
        client's start): routing does not spend the request's deadline waiting, and the guard's
        scan reads the names at the cloud seam, off the loop, beside the local engine's work."""
        bound = _cloud_bound(policy, forced, engines) and not _local_first(policy)
        deep = ner_wanted(policy.privacy) and (policy.privacy.mode == "block" or bound)
        if deep and policy.privacy.mode == "keep-local" and not preview and not self.ner_ready():
            return False, True
        return deep, False

    def state(
        self,
        facts: RequestFacts,
        request: GenerationRequest,
        policy: Policy,
        engines: Mapping[EngineName, Engine],
        breakers: Mapping[EngineName, CircuitBreaker],
        preview: bool = False,
    ) -> LiveState:
        """The live state for `decide()`. A request (`preview=False`) takes a half-open
        circuit's probe when it is let through; a preview only reads the circuits."""
        infos = {name: engine.info() for name, engine in engines.items()}
        waits = {name: _wait(info, request) for name, info in infos.items()}
        cached = self.local_cached(request, engines)
        clean = facts.privacy_kinds == frozenset()
        cloud_ok = "cloud" in engines and policy.cloud_allowed and clean
        fits, detail = True, ""
        if cloud_ok and self.budget is not None:
            # what the reservation will hold
            bound = prompt_token_bound(request.messages, request.tools)
            cloud = engines["cloud"].name
            payer = (request.user, request.tenant)
            verdict = self.budget.check(policy, bound, facts.max_tokens, cloud, *payer)
            fits, detail = verdict.fits, verdict.detail
        cloud_ok = cloud_ok and fits and not infos["cloud"].unavailable
        cloud_breaker = breakers.get("cloud")
        circuit_open = cloud_ok and _open(cloud_breaker, preview)
        # the local circuit matters only where a cloud could take the request instead
        local_ok = "local" in engines and cloud_ok and not circuit_open
        return LiveState(
            available=frozenset(engines),
            latency=self.predictions(facts, request, engines, waits, cached),
            local_cached_tokens=cached,
            local_queue_s=waits.get("local", 0.0),
            cloud_queue_s=waits.get("cloud", 0.0),
            cloud_circuit_open=circuit_open,
            cloud_circuit_slow=circuit_open and cloud_breaker is not None and cloud_breaker.slow,
            local_circuit_open=local_ok and _open(breakers.get("local"), preview),
            budget_fits=fits,
            budget_detail=detail,
            continues=frozenset(n for n, i in infos.items() if i.supports_continuation),
            unavailable={n: i.unavailable for n, i in infos.items() if i.unavailable},
            context={n: i.n_ctx for n, i in infos.items() if i.n_ctx},
            parallel_recent=self.parallel_recent(policy.name),
            speculation=self.speculation_outlook(request, policy, engines),
            reads_signals=frozenset(n for n, e in engines.items() if _declares(e, ReadsSignals)),
            has_router=self.router is not None,
            unmeasured={n: self.latency.unmeasured.get(e.name, 0) for n, e in engines.items()},
        )

    def predictions(
        self,
        facts: RequestFacts,
        request: GenerationRequest,
        engines: Mapping[EngineName, Engine],
        waits: Mapping[EngineName, float],
        cached: int | None = None,
    ) -> dict[EngineName, Prediction]:
        """Each engine's predicted latency: the latency model's once it knows the engine, else
        the engine's own estimate."""
        latency: dict[EngineName, Prediction] = {}
        for name, engine in engines.items():
            q = waits[name]  # the cloud's: its concurrency limit's queue, a 429's Retry-After
            local = name == "local"
            n = self.local_tokens(facts, request, cached) if local else facts.prompt_tokens
            if self.latency.knows(engine.name):  # by the engine's own name, not its side
                latency[name] = self.latency.predict(engine.name, n, facts.max_tokens, queue_s=q)
            else:
                own = engine.predict_ttft_s(request)
                if own is not None:
                    latency[name] = Prediction(name, own, own, own, own, 0.0, q, source="engine")
        return latency

    def speculation_outlook(
        self, request: GenerationRequest, policy: Policy, engines: Mapping[EngineName, Engine]
    ) -> tuple[bool, str] | None:
        """Would the speculative plan pay for this request now, and why."""
        spec = self.speculation
        if "cloud" not in engines or "local" not in engines:
            return None
        sampled = request.temperature > 0
        if sampled and request.top_p >= 1.0:
            return False, "temperature > 0 with top_p = 1 (speculative sampling needs top_p < 1)"
        cloud, local = engines["cloud"], engines["local"]
        verifies = _declares(cloud, VerifiesAtEndpoint)
        key = cast(VerifiesAtEndpoint, cloud).verification_endpoint() if verifies else None
        if key is None:
            return False, "the cloud engine cannot verify drafts"
        if not _declares(local, Drafts):
            return False, "the local engine cannot draft"
        probed = spec.known(key)
        if probed is None:
            return True, "the cloud's verification dialect is probed on this request"
        if probed.verifier is None:
            return False, probed.reason
        if sampled and not (probed.verifier.samples and probed.verifier.token_level):
            return (
                False,
                f"temperature > 0 needs raw token-level log-probabilities ({probed.reason})",
            )
        # the latency model's figure (its prior until the cloud has streamed here)
        return spec.outlook(key).pays(self.latency.engine(cloud.name).tpot()[0])

    def decide(
        self,
        request: GenerationRequest,
        policy: Policy,
        engines: Mapping[EngineName, Engine],
        breakers: Mapping[EngineName, CircuitBreaker],
        forced: EngineName | None = None,
        *,
        preview: bool = False,
        plan: PlanName | None = None,
        streamed: bool = True,
        facts: RequestFacts | None = None,
    ) -> RoutePreview:
        """Gather and decide. `preview`: nothing will be sent, so leave the circuits as they are
        (a request's caller counts its cloud start: `note_decision`). `plan`: the plan the
        caller asks; `streamed` False: the answer is taken whole (`complete()`). `facts`: the
        request's facts when gathered already (off the event loop)."""
        if facts is None:
            facts = self.facts(request, policy, forced, engines, preview=preview)
        facts = replace(facts, plan=plan, streamed=streamed)
        state = self.state(facts, request, policy, engines, breakers, preview)
        decision = decide(facts, policy, state)
        if not preview:
            if decision.primary is not None and decision.primary in engines:
                _announce(engines[decision.primary], request)
        return RoutePreview(decision, facts, state)


def _declares(engine: Engine, capability: type) -> bool:
    """Does this engine declare `capability` (a protocol of methods only, in
    `engines.capabilities`)? Asked once per engine class: a runtime protocol check costs tens
    of µs, more than the rest of the decision, and routing asks several per request."""
    return _class_declares(type(engine), capability)


@functools.cache
def _class_declares(kind: type, capability: type) -> bool:
    return issubclass(kind, capability)


def _open(breaker: CircuitBreaker | None, preview: bool) -> bool:
    """Is the circuit open for this request? A request (`preview` False) takes a half-open
    circuit's probe when it is let through; a preview only reads the circuit."""
    if breaker is None:
        return False
    return not (breaker.would_allow() if preview else breaker.allow())


def _cloud_bound(
    policy: Policy, forced: EngineName | None, engines: Mapping[EngineName, Engine] | None
) -> bool:
    """Could this request reach the cloud? Only then does the privacy scan read it deeply (the
    NER layer): a request that stays local pays for the patterns alone."""
    has_cloud = engines is None or "cloud" in engines
    return has_cloud and forced != "local" and policy.cloud_allowed


def _local_first(policy: Policy) -> bool:
    """The policy serves on the device first, the cloud a rescue or a parallel start at most:
    routing reads the patterns alone, and the NER layer runs at the cloud seam (the guard's
    scan, off the loop, beside the local engine's work) only where the cloud is started, so a
    local first token never waits for it (a name found there keeps the cloud out then)."""
    r = policy.routing
    return r.prefer == "local" and (r.fallback_order is None or r.fallback_order[0] == "local")


def _announce(engine: Engine, request: GenerationRequest) -> None:
    """The request goes to `engine` first: an engine with a concurrency limit counts it in its
    queue's forecast from now on (`ConcurrencyLimit.expect`), so the next decisions of a burst
    made at once see it before it reaches the queue."""
    inner = cast(Wraps, engine).wrapped() if _declares(engine, Wraps) else engine
    if isinstance(inner, LimitsConcurrency):
        inner.limit.expect(request.priority)


def _wait(info: EngineInfo, request: GenerationRequest) -> float:
    """The engine's expected queue wait for this request's priority class."""
    by_class = info.wait_by_priority
    return info.expected_wait_s if by_class is None else by_class[request.priority]


def tier_cuts(router: Scorer, policy: Policy) -> tuple[float, ...]:
    """The router scores where a policy's tiers step up: its `tier_bounds`, or its
    `tier_shares` read on the router's calibration (the score above which that share lies)."""
    r = policy.routing
    if r.tier_bounds is not None:
        return r.tier_bounds
    return tuple(router.threshold(cloud_share=share) for share in r.tier_shares or ())


def _tier(
    router: Scorer, policy: Policy, score: float
) -> tuple[EngineName, tuple[float, float], float]:
    """The tier `score` falls in (its engine), that step's bounds [low, high), and the score
    from which a request leaves the device (0: every tier is a cloud)."""
    tiers = policy.routing.tiers or ()
    cuts = tier_cuts(router, policy)
    step = sum(1 for c in cuts if score >= c)
    edges = (0.0, *cuts, math.inf)
    leaves = cuts[0] if tiers[0] == "local" else 0.0
    return tiers[step], (edges[step], edges[step + 1]), leaves


def _uses_router(policy: Policy) -> bool:
    """The router decides only where the policy leaves the choice open ("auto", no fixed order,
    the cloud allowed) and says how to read the score (a threshold, a cloud share or a floor)."""
    stated = (
        policy.routing.tiers,
        policy.routing.router_threshold,
        policy.routing.target_cloud_share,
        policy.routing.quality_floor,
    )
    return (
        policy.routing.prefer == "auto"
        and policy.routing.fallback_order is None
        and policy.cloud_allowed
        and any(v is not None for v in stated)
    )


# --- the client's gates, answered by the guard (routing reads them through its protocols) ---


def policy_caps(policy: Policy) -> tuple[Cap, ...]:
    """A policy's `[budget]` as ledger caps scoped to the policy's name."""
    b = policy.budget
    limits: tuple[tuple[Period, float | None], ...] = (
        ("request", b.per_request_usd),
        ("day", b.per_day_usd),
        ("month", b.per_month_usd),
    )
    caps = [Cap(policy.name, period, usd) for period, usd in limits if usd is not None]
    per_user: tuple[tuple[Period, float | None], ...] = (
        ("day", b.per_user_day_usd),
        ("month", b.per_user_month_usd),
    )
    caps += [Cap(policy.name, p, usd, per_user=True) for p, usd in per_user if usd is not None]
    return tuple(caps)


def ner_ready() -> bool:
    """Whether the process's privacy scanner reads names at once (`PrivacyScanner.ready`)."""
    return default_scanner().ready


def privacy_kinds(
    messages: Sequence[Mapping[str, Any]],
    *,
    deep: bool = True,
    extra: Iterable[tuple[str, str]] = (),
) -> tuple[str, ...]:
    """The kinds the process's privacy scanner finds (`deep`: with its NER layer, if on) in the
    messages and the `extra` (location, text) pairs."""
    return kinds(default_scanner().scan(messages, deep=deep, extra=extra))


class GuardBudget:
    """The budget gate routing asks (`BudgetGate`), answered by each cloud guard's ledger (the
    request priced by that cloud's model)."""

    def __init__(self, guards: Mapping[EngineName, GuardedEngine]) -> None:
        self.guards = guards

    def check(
        self,
        policy: Policy,
        prompt_tokens: int,
        max_tokens: int,
        engine: EngineName = "cloud",
        user: str | None = None,
        tenant: Tenant | None = None,
    ) -> BudgetVerdict:
        guard = self.guards.get(engine) or next(iter(self.guards.values()))
        fits, detail = guard.fits(policy.name, prompt_tokens, max_tokens, user, tenant)
        return BudgetVerdict(fits, detail)


def refusal_error(
    decision: Decision,
    facts: RequestFacts,
    policy: Policy,
    request: GenerationRequest,
    guard: GuardedEngine | None,
    context: Mapping[EngineName, int] | None = None,
) -> errors.HybridError:
    """The documented type for a request no engine may serve, from the decision's typed cause
    (`Decision.refusal`): `ContextOverflowError` when no engine it could use can hold the
    prompt and its output bound (`Decision.overflowed`; the largest of their `context`s is
    named), else a `RefusedError` with
    the decision's reasons: `PrivacyBlockedError` when the privacy scan kept it from the cloud,
    `BudgetExceededError` (the guard's, with the cap's figures) when the budget did."""
    sizes = {e: n for e, n in (context or {}).items() if e in decision.overflowed}
    if decision.refusal == "context_overflow" and sizes:
        engine, n_ctx = max(sizes.items(), key=lambda item: item[1])
        return errors.ContextOverflowError(
            engine=engine,
            prompt_tokens=facts.prompt_tokens,
            max_tokens=facts.max_tokens,
            n_ctx=n_ctx,
        )
    reasons = tuple(r.text for r in decision.reasons)
    found = facts.privacy_kinds
    if decision.refusal == "privacy" and found:
        return errors.PrivacyBlockedError(tuple(sorted(found)), reasons=reasons)
    if decision.refusal == "budget" and guard is not None:
        bound = prompt_token_bound(request.messages, request.tools)
        payer = (request.user, request.tenant)
        refusal = guard.refusal(policy.name, bound, request.max_tokens, *payer)
        if refusal is not None:
            return refusal.with_reasons(reasons)
    return errors.RefusedError("request refused", reasons=reasons)


def _atomic(request: GenerationRequest) -> Atomic | None:
    """Whether the answer is delivered whole: it may be a tool call, or must be JSON."""
    spec = request.tools
    if spec is None:
        return None
    if spec.may_call:
        return "tools"
    return "json" if spec.response_format is not None else None
