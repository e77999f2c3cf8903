"""`hybridllm explain`: print where a prompt would go under a policy, and why. Nothing is sent.

The decision comes from the client's own gather (`hybridllm.runtime.gather.Gatherer`) and the
pure `decide()`, with the live state stated on the command line: offline engines that send
nothing, the clouds by name (`--cloud NAME`, repeated; a policy may name them), the local
queue (`--queue-s`), the cloud circuits (`--cloud-circuit`: every cloud's; `--open-circuit
NAME`: one engine's), the budget
(`--budget-exhausted`), privacy findings (`--found`, added to what the client's own scan finds).
So the printed decision is the one `HybridClient.decide()` makes for the same prompt, policy and
state, including the router: its score for the prompt (or `--router-score`) against the
threshold the policy asks for (`router_threshold`, or from the router's calibration for
`target_cloud_share` / `quality_floor`; `--threshold` states one instead). The router is the
shipped artifact (or `--router DIR`), loaded only if the decision needs it; `--no-router`
decides without one. The stated local engine reads its own signals, as the real one does, so a
policy that runs the cascade shows it (plan "cascade"). Latency predictions come from the latency
model's priors; `--local-model` loads the local engine to use its warm-up figures (a short
prefill and a few decode steps; no answer is generated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import AsyncGenerator, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hybridllm.engines.base import EngineInfo, GenerationRequest, Message
from hybridllm.errors import ConfigError
from hybridllm.events import Chunk, EngineName
from hybridllm.guard.privacy import kinds as kinds_of
from hybridllm.guard.privacy_ner import NER_KINDS, default_scanner
from hybridllm.guard.privacy_rules import DETECTORS
from hybridllm.policy import Policy, Tenant, resolve_policy
from hybridllm.routing.decision import (
    CloudConsidered,
    Decision,
    LiveState,
    RequestFacts,
    RoutePreview,
)
from hybridllm.routing.inputs import BudgetVerdict, Prediction, PrivacyScan, Scorer
from hybridllm.runtime.gather import Gatherer
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.roster import Roster
from hybridllm.tools import ToolSpec, tool_spec

if TYPE_CHECKING:
    from hybridllm.engines.llama.signals import LocalSignals

PRIVACY_KINDS = frozenset(d.kind for d in DETECTORS) | NER_KINDS


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


# ---- the stated state, in the shapes the client's gather reads --------------------------------


class OfflineEngine:
    """An engine as stated on the command line: its queue wait, and nothing is ever sent."""

    def __init__(self, name: EngineName, expected_wait_s: float = 0.0) -> None:
        self.name: EngineName = name
        self.expected_wait_s = expected_wait_s

    async def start(self) -> None:
        return None

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        raise ConfigError("hybridllm explain sends nothing")
        yield  # an async generator, like every engine's stream

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            model="(offline)",
            expected_wait_s=self.expected_wait_s,
            supports_continuation=True,
        )  # as both real engines do

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return None

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return None  # no tokenizer: the one estimate (engines.base) counts

    async def aclose(self) -> None:
        return None


class OfflineLocalEngine(OfflineEngine):
    """The stated local engine: like the real one, it reads its own confidence signals
    (`engines.capabilities.ReadsSignals`), so the decision shows a cascade where one would
    run; nothing is ever read here."""

    async def signals(
        self,
        messages: Sequence[Message],
        n_answer: int = 8,
        *,
        rotations_within_s: float | None = None,
        rotations_max_s: float | None = None,
    ) -> LocalSignals:
        raise ConfigError("hybridllm explain reads no signals")


def offline_engine(name: EngineName, expected_wait_s: float = 0.0) -> OfflineEngine:
    """The stated engine for `name` (the local one reads its own signals)."""
    kind = OfflineLocalEngine if name == "local" else OfflineEngine
    return kind(name, expected_wait_s)


class StatedRouter:
    """A router whose score is stated (`--router-score`) or the base router's; thresholds for a
    cloud share or a quality floor always come from the base router's calibration."""

    def __init__(self, base: Scorer | None, score: float | None = None) -> None:
        self.base = base
        self.stated = score

    def score(self, messages: Sequence[Mapping[str, str]]) -> float:
        if self.stated is not None:
            return self.stated
        if self.base is None:
            raise ConfigError("no router to score the prompt: state --router-score")
        return self.base.score(messages)

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        if self.base is None:
            how = "target_cloud_share" if cloud_share is not None else "quality_floor"
            raise ConfigError(
                f"the policy reads the router score by {how}, which needs a router's "
                "calibration: give a router (not --no-router) or state --threshold"
            )
        return self.base.threshold(cloud_share=cloud_share, quality_floor=quality_floor)


class ArtifactRouter:
    """The router artifact at `path` (None: the shipped one), loaded on first use."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._router: Scorer | None = None

    def _loaded(self) -> Scorer:
        if self._router is None:
            from hybridllm.routing.router import Router

            self._router = Router.load(self.path)
        return self._router

    def score(self, messages: Sequence[Mapping[str, str]]) -> float:
        return self._loaded().score(messages)

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        return self._loaded().threshold(cloud_share=cloud_share, quality_floor=quality_floor)


class _Exhausted:
    def check(
        self,
        policy: Policy,
        prompt_tokens: int,
        max_tokens: int,
        engine: EngineName = "cloud",
        user: str | None = None,
        tenant: Tenant | None = None,
    ) -> BudgetVerdict:
        return BudgetVerdict(False, "stated exhausted on the command line")


def _scan_with(stated: frozenset[str]) -> PrivacyScan:
    def privacy(
        messages: Sequence[Mapping[str, Any]],
        *,
        deep: bool = True,
        extra: Iterable[tuple[str, str]] = (),
    ) -> Collection[str]:
        found = default_scanner().scan(messages, deep=deep, extra=extra)
        return {*kinds_of(found), *stated}  # the client's scan, plus the stated findings

    return privacy


def with_threshold(policy: Policy, threshold: float | None) -> Policy:
    """The policy reading the router score against a stated threshold instead of its own."""
    if threshold is None:
        return policy
    cut = {"router_threshold": threshold, "target_cloud_share": None, "quality_floor": None}
    return policy.with_(routing=cut)


def _check(
    queue_s: float,
    router_score: float | None,
    router_threshold: float | None,
    privacy_kinds: frozenset[str] | None,
    max_tokens: int | None,
) -> None:
    if not (math.isfinite(queue_s) and queue_s >= 0):
        raise ConfigError(f"the local queue wait (--queue-s) must be >= 0 seconds, not {queue_s}")
    for name, flag, p in (
        ("router score", "--router-score", router_score),
        ("router threshold", "--threshold", router_threshold),
    ):
        if p is not None and not 0.0 <= p <= 1.0:
            raise ConfigError(f"the {name} ({flag}) must be within 0..1, not {p}")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max_tokens (--max-tokens) must be at least 1, not {max_tokens}")
    unknown = sorted((privacy_kinds or frozenset()) - PRIVACY_KINDS)
    if unknown:
        raise ConfigError(
            f"unknown privacy finding kind (--found) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(PRIVACY_KINDS))}"
        )


# ---- the decision -----------------------------------------------------------------------------


def explain(
    prompt: str,
    policy: Policy,
    *,
    engines: Sequence[EngineName] = ("local", "cloud"),
    latency: LatencyModel | None = None,
    queue_s: float = 0.0,
    cloud_circuit_open: bool = False,
    open_circuits: Collection[EngineName] = (),
    router: Scorer | None = None,
    router_score: float | None = None,
    router_threshold: float | None = None,
    privacy_kinds: frozenset[str] | None = frozenset(),
    budget_fits: bool = True,
    max_tokens: int | None = None,
    answer: Literal["text", "tools", "json"] = "text",
) -> RoutePreview:
    """Decide for `prompt` as a `HybridClient` with these engines, router and state would.

    `engines`: by name, "local" the device's, every other one a cloud (the policy may name
    them: `prefer`, `fallback_order`, `tiers`; a name the list lacks is a `PolicyError`).
    `cloud_circuit_open`: every cloud's circuit is open; `open_circuits`: these engines'.
    `router_score` states the score in place of `router`'s; `router_threshold` replaces the
    policy's reading of the score. `privacy_kinds`: findings added to the client's own scan
    (None: no scanner, as a client without one). Engines the latency model does not know yet
    are predicted from its priors (they stand for a warm-up). `answer`: "tools" (the answer may
    call a tool) or "json" (a JSON response format): a whole answer, as `tools=` or
    `response_format=` make it."""
    _check(queue_s, router_score, router_threshold, privacy_kinds, max_tokens)
    offline = {e: offline_engine(e, queue_s if e == "local" else 0.0) for e in engines}
    roster = Roster.of(offline, device="local" if "local" in offline else None)
    policy = with_threshold(policy, router_threshold)
    bound = roster.bind(policy)  # a name the engines lack: PolicyError
    latency = latency or LatencyModel()
    for name in engines:
        if not latency.knows(name):
            latency.seed(name)  # the prior as it is
    scorer = router if router_score is None else StatedRouter(router, router_score)
    routing = Gatherer(
        latency=latency,
        router=scorer,
        budget=None if budget_fits else _Exhausted(),
        privacy=None if privacy_kinds is None else _scan_with(privacy_kinds),
    )
    breakers = {e: CircuitBreaker(name=e) for e in engines}
    for name in roster.clouds if cloud_circuit_open else open_circuits:
        if name in breakers:
            breakers[name].opened_at = time.monotonic()
    request = GenerationRequest(
        messages=({"role": "user", "content": prompt},),
        max_tokens=bound.sampling.max_tokens if max_tokens is None else max_tokens,
        tools=_answer_spec(answer),
    )
    order = roster.cloud_order(policy)

    def usable(name: EngineName) -> bool:
        return breakers[name].would_allow()

    first = roster.by_side(offline, order[0] if order else None)
    facts = routing.facts(request, bound, None, first)
    tiers = bound.routing.tiers
    if tiers is not None and facts.router_tier not in (None, "local"):
        order = roster.tiered(order, tiers, facts.router_tier or "")
    cloud = roster.pick_cloud(order, usable)
    sides = roster.by_side(offline, cloud)
    by_side = {side: breakers[e.name] for side, e in sides.items()}
    route = routing.decide(request, bound, sides, by_side, facts=facts)
    clouds = roster.considered(order, cloud, lambda n: not usable(n), lambda _: False)
    return route._replace(state=dataclasses.replace(route.state, clouds=clouds))


def _answer_spec(answer: str) -> ToolSpec | None:
    """What `--answer` stands for: a tool the answer may call, or a JSON response format."""
    if answer == "tools":
        return tool_spec([{"type": "function", "function": {"name": "example_tool"}}], None, None)
    return tool_spec(None, None, {"type": "json_object"}) if answer == "json" else None


# ---- output -----------------------------------------------------------------------------------


def _threshold_source(policy: Policy) -> str:
    if policy.routing.router_threshold is not None:
        return "router_threshold"
    if policy.routing.target_cloud_share is not None:
        return f"target_cloud_share {policy.routing.target_cloud_share:g}"
    if policy.routing.quality_floor is not None:
        return f"quality_floor {policy.routing.quality_floor:g}"
    return "given"  # facts gathered elsewhere (e.g. `decide()` called with a score)


def render(decision: Decision, facts: RequestFacts, state: LiveState, policy: Policy) -> str:
    lines = [f"policy    {policy.name}: {policy.description}".rstrip(": ")]
    limits = []
    if policy.routing.ttft_deadline_ms is not None:
        limits.append(f"first token within {policy.routing.ttft_deadline_ms:.0f} ms")
    if policy.routing.tpot_target_ms is not None:
        limits.append(f"TPOT target {policy.routing.tpot_target_ms:.0f} ms")
    limits.append(f"max {facts.max_tokens} output tokens")
    lines.append("          " + ", ".join(limits))
    lines.append(f"prompt    about {facts.prompt_tokens} tokens (length estimate)")
    if facts.atomic is not None:
        what = "may be a tool call" if facts.atomic == "tools" else "must be JSON"
        lines.append(f"answer    {what}: delivered whole, checked against its schema")
    if facts.router_score is not None and facts.router_threshold is not None:
        lines.append(
            f"router    score {facts.router_score:.3f}, threshold {facts.router_threshold:.3f} "
            f"({_threshold_source(policy)})"
        )
    if facts.router_tier is not None and facts.tier_span is not None:
        low, high = facts.tier_span
        lines.append(f"tier      {facts.router_tier} (scores {low:.3f} to {high:.3f})")
    if state.clouds:
        lines.append("clouds    " + ", ".join(_considered(c) for c in state.clouds))
    if decision.primary is None:
        lines.append("decision  REFUSED")
    else:
        how = f"{decision.plan}: {decision.primary}"
        if decision.fallback is not None:
            when = "at the deadline or on failure"
            if decision.fallback_now:
                when = "in parallel, at once"
            elif not decision.fallback_lead:
                when = "only at the deadline (no parallel start) or on failure"
            if decision.hedge_s is not None:
                when = f"after {_ms(decision.hedge_s)} (hedge)"
            how += f", then {decision.fallback} {when}"
        lines.append(f"decision  {how}")
        lines.append(f"objective {decision.objective}{_held(decision)}")
    lines.append("why")
    lines += [f"  - {r.text}" for r in decision.reasons]
    lines.append("predicted")
    for name, p in sorted(state.latency.items()):
        lines.append("  " + _prediction(name, p))
    return "\n".join(lines)


def _considered(cloud: CloudConsidered) -> str:
    """One cloud as weighed: serving the cloud side, passed over (why), or next in line."""
    if cloud.chosen:
        return f"{cloud.engine} (serves the cloud side)"
    if cloud.passed_over is not None:
        return f"{cloud.engine} (passed over: {cloud.passed_over.replace('_', ' ')})"
    return f"{cloud.engine} (next on failure)"


def _finite(x: float) -> float | str:
    """A number for JSON: infinity as "inf" (JSON has none)."""
    return "inf" if math.isinf(x) else x


def _held(decision: Decision) -> str:
    """How a rescue's tokens are held, in words ("" for a race the first token wins)."""
    at = decision.release_s
    if at is None:
        return ""
    if math.isinf(at):
        return f" ({decision.fallback} is a rescue: it answers only if {decision.primary} fails)"
    return f" ({decision.fallback} is a rescue: its tokens are held until {_ms(at)})"


def _prediction(name: str, p: Prediction) -> str:
    basis = f"{p.samples} requests" if p.samples else "priors"
    return (
        f"{name:<5}  TTFT {_ms(p.ttft_s)} (p95 {_ms(p.ttft_p95_s)}), "
        f"total {_ms(p.total_s)} (p95 {_ms(p.total_p95_s)}), queue {_ms(p.queue_s)}  [{basis}]"
    )


def as_json(decision: Decision, facts: RequestFacts, state: LiveState) -> str:
    return json.dumps(
        {
            "plan": decision.plan,
            "primary": decision.primary,
            "fallback": decision.fallback,
            "fallback_now": decision.fallback_now,
            "fallback_lead": decision.fallback_lead,
            "deadline_s": decision.deadline_s,
            "hedge_s": decision.hedge_s,
            "load_rule": decision.load,
            "by_router": decision.by_router,
            "refusal": decision.refusal,
            "cascade_judge": decision.cascade_judge,
            "objective": decision.objective,
            "release_s": None if decision.release_s is None else _finite(decision.release_s),
            "probe": decision.probe,
            "reasons": [r.text for r in decision.reasons],
            "reason_codes": list(decision.codes),
            "prompt_tokens": facts.prompt_tokens,
            "max_tokens": facts.max_tokens,
            "router_score": facts.router_score,
            "router_threshold": facts.router_threshold,
            "router_tier": facts.router_tier,
            "clouds": [
                {"engine": c.engine, "chosen": c.chosen, "passed_over": c.passed_over}
                for c in state.clouds
            ],
            "privacy_kinds": None if facts.privacy_kinds is None else sorted(facts.privacy_kinds),
            "atomic": facts.atomic,
            "predicted": {
                name: {"ttft_s": p.ttft_s, "ttft_p95_s": p.ttft_p95_s, "total_s": p.total_s}
                for name, p in state.latency.items()
            },
        },
        indent=2,
    )


def run_explain(args: argparse.Namespace) -> int:
    policy = resolve_policy(args.policy, dirs=args.policy_dir)
    found = frozenset(args.found or ())
    _check(args.queue_s, args.router_score, args.threshold, found, args.max_tokens)
    latency = LatencyModel()
    if args.local_model:  # after the checks: loading a model takes seconds
        _seed_from_engine(latency, args.local_model, args.threads)
    engines: list[EngineName] = []
    if not args.no_local:
        engines.append("local")
    if not args.no_cloud:
        engines += args.cloud or ["cloud"]
    router = None if args.no_router else ArtifactRouter(args.router)
    decision, facts, state = explain(
        args.prompt,
        policy,
        engines=engines,
        latency=latency,
        queue_s=args.queue_s,
        cloud_circuit_open=args.cloud_circuit == "open",
        open_circuits=args.open_circuit or (),
        router=router,
        router_score=args.router_score,
        router_threshold=args.threshold,
        privacy_kinds=found,
        budget_fits=not args.budget_exhausted,
        max_tokens=args.max_tokens,
        answer=args.answer,
    )
    policy = with_threshold(policy, args.threshold)
    print(as_json(decision, facts, state) if args.json else render(decision, facts, state, policy))
    return 0 if decision.primary is not None else 1


def _seed_from_engine(latency: LatencyModel, model: str, threads: int | None) -> None:
    """Load the local engine (warm-up only, no answer) and take its measured figures."""
    import anyio

    from hybridllm.engines import LlamaCppEngine

    async def warm() -> tuple[float | None, float | None]:
        engine = LlamaCppEngine(model, n_threads=threads)
        try:
            await engine.start()
            return engine.prefill_tps, engine.tpot_s
        finally:
            await engine.aclose()

    tps, tpot = anyio.run(warm)
    latency.seed("local", prefill_tps=tps, tpot_s=tpot, overhead_s=tpot)
