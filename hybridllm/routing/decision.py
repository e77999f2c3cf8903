"""What `decide()` (`routing.decide`) reads and returns: the request's facts (`RequestFacts`),
the live state of the engines (`LiveState`), and the `Decision`, whose typed fields are what the
code acts on (each of its `reasons` is a `Reason`: a `ReasonCode`, the rule of `decide()` that
spoke, which code and tests read, and words for people, never read back); `RoutePreview` bundles
the three for a preview (`HybridClient.decide()`, `hybridllm explain`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from hybridllm.events import EngineName
from hybridllm.policy import PlanName
from hybridllm.routing.inputs import Prediction

__all__ = [
    "Decision",
    "LiveState",
    "LoadRule",
    "Objective",
    "PlanKind",
    "Reason",
    "ReasonCode",
    "RefusalCause",
    "RequestFacts",
    "RoutePreview",
]

# the plan a decision runs: a plan's name (`PlanName`: built-in or registered), or "refuse"
PlanKind = str
# why no engine may serve: a privacy finding kept the request from the cloud; the budget could
# not cover the cloud request; the engine the caller forced is not allowed; no engine the client
# has is allowed (the policy, no privacy scanner)
RefusalCause = Literal["privacy", "budget", "forced_not_allowed", "no_engine", "context_overflow"]
# the load rule that fired (3.): a swap for the local queue, for the cloud's concurrency queue,
# or for a fallback predicted to meet the deadline; a parallel start of the fallback at once;
# a parallel cloud start the policy holds back until the deadline itself
LoadRule = Literal[
    "local_queue", "cloud_queue", "faster_fallback", "parallel_start", "parallel_held"
]
# why the primary engine was chosen, which is what the race reads: "quality" (the router's score,
# a policy that prefers the cloud, a cascade or speculation: the cloud's answer is wanted, so a
# local backup only rescues it), "latency" (a local-first policy, a deadline prediction, the
# load, the decode speed: the first token wins), "cost" (the router found the local answer good
# enough, or the budget kept the cloud out), "privacy" (a finding or a policy that never leaves
# the device), "availability" (a circuit, an unavailable engine, the only engine left), "caller"
# (the caller forced the engine)
Objective = Literal["quality", "latency", "cost", "privacy", "availability", "caller"]
Atomic = Literal["tools", "json"]
# the rule of `decide()` behind a reason, one code per rule (or per branch of one), in the order
# the rules run (`routing.decide`); the load rules that fire are the `LoadRule`s themselves, and
# the two refusals a reason alone explains keep their `RefusalCause` names
ReasonCode = Literal[
    # 0. a tool call or JSON answer is delivered whole: the plan asked for that splits it is off
    "whole_answer",
    # 1. the engine asked for: forced by the caller; the policy's preference; "auto" without a
    # router score (local first); the router's score against its threshold
    "forced",
    "policy_prefers",
    "no_router_score",
    "router_score",
    "router_tier",
    # 2. which engines may serve: a policy that never leaves the device; privacy (names alone
    # known as public, no scanner, a finding the policy allows, blocks or keeps local); the
    # budget (refused, or local); the cloud circuit (forced anyway, slow but a quality decision,
    # probed, open: local, the only engine); the local circuit (forced anyway, open: cloud, the
    # only engine); an unavailable engine (forced anyway, left out, the only engine); an engine
    # whose context cannot hold the prompt and its output bound (left out; with none left, the
    # refusal of the same name); the engine forced is not allowed; no engine is allowed; the
    # engine asked for is missing
    "policy_no_cloud",
    "privacy_public_names",
    "privacy_names_at_seam",
    "privacy_no_scanner",
    "privacy_allowed",
    "privacy_blocked",
    "privacy_local",
    "budget_refused",
    "budget_local",
    "cloud_circuit_forced",
    "cloud_circuit_slow_quality",
    "cloud_circuit_probe",
    "cloud_circuit_open",
    "cloud_circuit_only_engine",
    "local_circuit_forced",
    "local_circuit_open",
    "local_circuit_only_engine",
    "unavailable_forced",
    "unavailable",
    "unavailable_only_engine",
    "context_overflow",
    "forced_not_allowed",
    "no_engine",
    "wanted_missing",
    # 3. load: a cloud chosen for quality keeps a request predicted past the deadline; a long
    # local queue with no other engine; the rule that fired (`LoadRule`); an unmeasured primary
    # probed; a parallel start that buys nothing
    "quality_keeps",
    "local_queue_only_engine",
    LoadRule,
    "probe",
    "no_parallel_start",
    # 4. decode speed: the handoff asked for (or not possible); a slow local decode: the cloud
    # no faster, a handoff, the cloud, or the local engine kept for the deadline
    "handoff_asked",
    "no_handoff",
    "slow_decode_no_faster",
    "slow_decode_handoff",
    "slow_decode_cloud",
    "slow_decode_deadline",
    # 5. the plan: a fixed hedge, an automatic hedge (or none pays); a quality decision's local
    # rescue, and one held for the cloud's p95 (it cannot make the deadline, and the time a
    # release would save is worth less than the quality at stake); no mid-stream failover;
    # speculation (expected to pay, asked for, does not pay, needs both engines); the cascade
    # (listed under "auto", asked for, cannot run)
    "hedge",
    "auto_hedge",
    "auto_hedge_none",
    "quality_rescue",
    "rescue_no_sooner",
    "no_failover",
    "speculative",
    "speculative_asked",
    "no_speculative",
    "speculative_needs_both",
    "cascade",
    "cascade_asked",
    "no_cascade",
    # a registered plan asked for runs on the engines chosen (`runtime.plans.registry`)
    "registered_plan",
    # a note: how much of the prompt the local engine holds in its cache
    "local_cached",
]


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason of a decision: the rule that spoke (`code`, what code and tests act on) and
    its words for people (`text`, never read back)."""

    code: ReasonCode
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What is known about the request itself."""

    prompt_tokens: int
    max_tokens: int
    router_score: float | None = None  # P(the local answer is wrong); None: no router
    router_threshold: float | None = None  # the cut for this policy (score >= it: cloud)
    # kinds found, e.g. {"email", "api_key"} (never the values); None: the prompt was not scanned
    privacy_kinds: frozenset[str] | None = frozenset()
    # names alone that the privacy judge knew as public figures', dropped from privacy_kinds
    public_names: int = 0
    # names were not looked for (the NER layer still loading): the guard reads them at the
    # cloud seam, so routing does not spend the deadline waiting (`privacy_names_at_seam`)
    names_unread: bool = False
    forced: EngineName | None = None  # the caller named the engine
    # the plan the caller asked for (a call's `plan=`); None: the policy's `plan`, if any
    plan: PlanName | None = None
    # the answer is shown as it comes (`stream()`); False: taken whole (`complete()`), so a
    # cascade may judge the whole local answer
    streamed: bool = True
    # the answer may be a tool call ("tools") or must be JSON ("json"): it is delivered whole,
    # so no plan that splits it or verifies it piece by piece runs; None: plain text
    atomic: Atomic | None = None
    # under `[routing] tiers`: the tier the score falls in (its engine: "local" for the device,
    # else a cloud's name or "cloud") and the step's bounds [low, high); None: no tiers
    router_tier: EngineName | None = None
    tier_span: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class CloudConsidered:
    """A cloud the policy allows, as the client weighed it for one request: the one serving the
    cloud side (`chosen`: where every cloud is out, the first; the decision's reasons say why it
    cannot serve), else the next ones a failure turns to, or why it was passed over (its
    circuit open, or it is unavailable: no usable key, a queue at its bound)."""

    engine: EngineName
    chosen: bool
    passed_over: Literal["circuit_open", "unavailable"] | None = None


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
    # the cloud circuit was opened by deadline misses (slow, not broken): a quality decision
    # still goes to the cloud, with the local engine as its rescue at the deadline
    cloud_circuit_slow: bool = False
    # the local engine's circuit (`runtime.health`): open, a cloud that may serve takes the
    # request; the local engine is still tried when it is the only one left
    local_circuit_open: bool = False
    budget_fits: bool = True  # the worst-case cloud cost fits every cap
    budget_detail: str = ""  # e.g. "day cap 0.50 USD, left 0.01 USD"
    # the engines that can continue a started answer (the engines' `supports_continuation`)
    continues: frozenset[EngineName] = frozenset({"local", "cloud"})
    # engines that cannot take a request now, and why (`EngineInfo.unavailable`)
    unavailable: Mapping[EngineName, str] = field(default_factory=dict)
    # each engine's context window in tokens, where it is known (`EngineInfo.n_ctx`: the
    # local engine's n_ctx, `OpenAIEngine(max_context=)`): a prompt and its output bound that do
    # not fit an engine go elsewhere, before any work
    context: Mapping[EngineName, int] = field(default_factory=dict)
    # this policy's recent requests in this client: (how many started the cloud in parallel,
    # how many there were), for `Policy.parallel_cloud_share`
    parallel_recent: tuple[int, int] = (0, 0)
    # would the speculative plan pay now, and why (None: no speculation state)
    speculation: tuple[bool, str] | None = None
    # the engines that read their own confidence signals (`engines.capabilities.ReadsSignals`)
    reads_signals: frozenset[EngineName] = frozenset()
    has_router: bool = False  # the client has a router (the cascade needs its stage 2)
    # per engine, the requests since it last produced a first token the latency model measured
    # (a prediction that keeps an engine out gets no new sample; past `PROBE_AFTER` the engine
    # is probed: the load rules leave it its place once)
    unmeasured: Mapping[EngineName, int] = field(default_factory=dict)
    # the prompt's leading tokens the local engine holds (live KV cache or a saved state; None:
    # it cannot say): its prediction counts only the rest, and the reasons say so
    local_cached_tokens: int | None = None
    # each cloud the policy allows, in its order: the one serving the cloud side (the state's
    # "cloud" above), the next ones, or why one was passed over (the client's, `HybridClient`)
    clouds: tuple[CloudConsidered, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request runs. Code acts on the typed fields and on the reasons' codes; the
    reasons' words are for people, never read back."""

    plan: PlanKind
    primary: EngineName | None
    fallback: EngineName | None
    deadline_s: float | None
    hedge_s: float | None
    reasons: tuple[Reason, ...]
    failover: bool = False  # a failure mid-answer moves the answer to the other engine
    # engines this request could have used, left out as unavailable: (engine, why)
    unavailable: tuple[tuple[EngineName, str], ...] = ()
    # engines left out because their context cannot hold the prompt and its output bound
    overflowed: tuple[EngineName, ...] = ()
    # the fallback may start ahead of the deadline by its own predicted time to a first token;
    # False: at the deadline itself (a cloud the policy does not start in parallel)
    fallback_lead: bool = True
    refusal: RefusalCause | None = None  # why nothing may serve (plan "refuse")
    by_router: bool = False  # the router's score asked for the cloud
    load: LoadRule | None = None  # the load rule that fired
    load_reason: str = ""  # its words (a parallel start is announced with them)
    # what a cascade judges: the held first tokens ("prefix") or, with nothing streamed and
    # `cascade_judge = "answer"`, the whole local answer; None: not a cascade
    cascade_judge: Literal["prefix", "answer"] | None = None
    objective: Objective = "latency"  # why the primary was chosen (the race reads it)
    # a rescue, not a competitor: the fallback's tokens are held (it may start early, prefill
    # and hold its first tokens) until this many seconds after the call, or until the primary
    # fails; None: the first token wins. Set for a quality decision (the deadline, or the
    # earlier delay the automatic hedge found worth its expected quality loss)
    release_s: float | None = None
    # the engine this request probes: predicted to miss (or behind a circuit open for slowness)
    # but unmeasured for `routing.decide.PROBE_AFTER` requests, it keeps its place once; the
    # client starts its unmeasured count again (`LatencyModel.probed`)
    probe: EngineName | None = None

    @property
    def fallback_now(self) -> bool:
        """The fallback starts at once, in parallel (the primary is predicted to miss the
        deadline)."""
        return self.load == "parallel_start"

    @property
    def parallel_cloud(self) -> bool:
        """The cloud starts at once beside the local engine (a cloud request paid for)."""
        return self.fallback_now and self.fallback == "cloud"

    @property
    def rescue(self) -> bool:
        """The fallback is a rescue: its tokens wait for `release_s` or the primary's failure."""
        return self.release_s is not None

    @property
    def reason(self) -> str:
        """The reasons' words, joined."""
        return "; ".join(r.text for r in self.reasons)

    @property
    def codes(self) -> tuple[ReasonCode, ...]:
        """The reasons' codes, in order."""
        return tuple(r.code for r in self.reasons)

    @property
    def engines(self) -> tuple[EngineName, ...]:
        """Every engine this decision may send the request to."""
        return tuple(e for e in (self.primary, self.fallback) if e is not None)


class RoutePreview(NamedTuple):
    """Where a request would run and why (`HybridClient.decide()`, `hybridllm explain`): the
    decision, the request's facts and the live state it was decided from (with more than one
    cloud, `state.clouds` says which served the cloud side, and why others did not)."""

    decision: Decision
    facts: RequestFacts
    state: LiveState
