"""Gather the facts and the live state for `decide()` (the impure half of routing).

`Routing` holds what a client routes with (the latency model and the optional router, budget
gate and privacy scan) and turns one request into `RequestFacts` + `LiveState`: prompt tokens
(a cheap length estimate, no tokenizer on the event loop), the router's score and the policy's
threshold, the kinds of personal data found, each engine's predicted latency (the latency model
once it knows the engine, else the engine's own estimate), the local queue, the budget verdict
and the cloud circuit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.events import EngineName
from hybridllm.health import CircuitBreaker
from hybridllm.latency import LatencyModel, Prediction
from hybridllm.policy import Policy
from hybridllm.routing.decide import Decision, LiveState, RequestFacts, decide
from hybridllm.routing.inputs import BudgetGate, PrivacyScan, Scorer


def estimate_prompt_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """About 4 characters per token plus a few template tokens per message."""
    return sum(4 + len(m.get("content", "")) // 4 for m in messages) + 3


@dataclass
class Routing:
    latency: LatencyModel = field(default_factory=LatencyModel)
    router: Scorer | None = None
    budget: BudgetGate | None = None
    privacy: PrivacyScan | None = None

    def seed_from(self, engines: Mapping[EngineName, Engine]) -> None:
        """Use warm-up figures (prefill rate, step time) as the latency model's priors."""
        for name, engine in engines.items():
            tps = getattr(engine, "prefill_tps", None)
            tpot = getattr(engine, "tpot_s", None)
            if isinstance(tps, float) and tps > 0:
                overhead = tpot if isinstance(tpot, float) else None
                self.latency.seed(name, prefill_tps=tps, tpot_s=tpot, overhead_s=overhead)

    def facts(
        self, request: GenerationRequest, policy: Policy, forced: EngineName | None
    ) -> RequestFacts:
        score = cut = None
        if self.router is not None and forced is None and _uses_router(policy):
            score = self.router.score(request.messages)
            cut = policy.router_threshold
            if cut is None:
                cut = self.router.threshold(
                    cloud_share=policy.target_cloud_share, quality_floor=policy.quality_floor
                )
        kinds: frozenset[str] | None = frozenset()
        if policy.privacy != "off":
            if self.privacy is None:
                kinds = None
            else:
                text = "\n".join(m.get("content", "") for m in request.messages)
                kinds = frozenset(self.privacy(text))
        return RequestFacts(
            prompt_tokens=estimate_prompt_tokens(request.messages),
            max_tokens=request.max_tokens,
            router_score=score,
            router_threshold=cut,
            privacy_kinds=kinds,
            forced=forced,
        )

    def state(
        self,
        facts: RequestFacts,
        request: GenerationRequest,
        policy: Policy,
        engines: Mapping[EngineName, Engine],
        breakers: Mapping[EngineName, CircuitBreaker],
    ) -> LiveState:
        queue = 0.0
        local = engines.get("local")
        if local is not None:
            queue = local.info().expected_wait_s
        latency: dict[EngineName, Prediction] = {}
        for name, engine in engines.items():
            q = queue if name == "local" else 0.0
            if self.latency.knows(name):
                latency[name] = self.latency.predict(
                    name, facts.prompt_tokens, facts.max_tokens, queue_s=q
                )
            else:
                own = engine.predict_ttft_s(request)
                if own is not None:
                    latency[name] = Prediction(name, own, own, own, own, 0.0, q, source="engine")
        clean = facts.privacy_kinds == frozenset()
        cloud_ok = "cloud" in engines and policy.cloud_allowed and clean
        fits, detail = True, ""
        if cloud_ok and self.budget is not None:
            verdict = self.budget.check(policy, facts.prompt_tokens, facts.max_tokens)
            fits, detail = verdict.fits, verdict.detail
        circuit_open = False
        if cloud_ok and fits and "cloud" in breakers:
            circuit_open = not breakers["cloud"].allow()  # may take the half-open probe
        return LiveState(
            available=frozenset(engines),
            latency=latency,
            local_queue_s=queue,
            cloud_circuit_open=circuit_open,
            budget_fits=fits,
            budget_detail=detail,
        )

    def decide(
        self,
        request: GenerationRequest,
        policy: Policy,
        engines: Mapping[EngineName, Engine],
        breakers: Mapping[EngineName, CircuitBreaker],
        forced: EngineName | None = None,
    ) -> tuple[Decision, RequestFacts, LiveState]:
        facts = self.facts(request, policy, forced)
        state = self.state(facts, request, policy, engines, breakers)
        return decide(facts, policy, state), facts, state


def _uses_router(policy: Policy) -> bool:
    """The router decides only where the policy leaves the choice open ("auto", no fixed order,
    the cloud allowed) and says how to read the score (a threshold, a cloud share or a floor)."""
    stated = (policy.router_threshold, policy.target_cloud_share, policy.quality_floor)
    return (
        policy.prefer == "auto"
        and policy.fallback_order is None
        and policy.cloud_allowed
        and any(v is not None for v in stated)
    )
