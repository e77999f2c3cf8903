"""`hybridllm explain`: print where a prompt would go under a policy, and why. Nothing is sent.

Offline (the default) the live state is stated on the command line (`--queue-s`,
`--cloud-circuit`, `--router-score`, `--budget-exhausted`) and the latency predictions come from
the latency model's priors. `--local-model` loads the local engine to use its warm-up figures
(a short prefill and a few decode steps; no answer is generated).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from hybridllm.engines.base import estimate_prompt_tokens
from hybridllm.events import EngineName
from hybridllm.policy import Policy, resolve_policy
from hybridllm.routing.decide import Decision, LiveState, RequestFacts, decide
from hybridllm.routing.inputs import Prediction
from hybridllm.runtime.latency import LatencyModel


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def explain(
    prompt: str,
    policy: Policy,
    *,
    engines: Sequence[EngineName] = ("local", "cloud"),
    latency: LatencyModel | None = None,
    queue_s: float = 0.0,
    cloud_circuit_open: bool = False,
    router_score: float | None = None,
    router_threshold: float | None = None,
    privacy_kinds: frozenset[str] | None = frozenset(),
    budget_fits: bool = True,
    max_tokens: int | None = None,
) -> tuple[Decision, RequestFacts, LiveState]:
    latency = latency or LatencyModel()
    messages = [{"role": "user", "content": prompt}]
    facts = RequestFacts(
        prompt_tokens=estimate_prompt_tokens(messages),
        max_tokens=policy.max_tokens if max_tokens is None else max_tokens,
        router_score=router_score,
        router_threshold=policy.router_threshold if router_threshold is None else router_threshold,
        privacy_kinds=privacy_kinds,
    )
    predictions = {
        e: latency.predict(
            e, facts.prompt_tokens, facts.max_tokens, queue_s=queue_s * (e == "local")
        )
        for e in engines
    }
    state = LiveState(
        available=frozenset(engines),
        latency=predictions,
        local_queue_s=queue_s,
        cloud_circuit_open=cloud_circuit_open,
        budget_fits=budget_fits,
        budget_detail="" if budget_fits else "stated exhausted on the command line",
    )
    return decide(facts, policy, state), facts, state


def render(decision: Decision, facts: RequestFacts, state: LiveState, policy: Policy) -> str:
    lines = [f"policy    {policy.name}: {policy.description}".rstrip(": ")]
    limits = []
    if policy.ttft_deadline_ms is not None:
        limits.append(f"first token within {policy.ttft_deadline_ms:.0f} ms")
    if policy.tpot_target_ms is not None:
        limits.append(f"TPOT target {policy.tpot_target_ms:.0f} ms")
    limits.append(f"max {facts.max_tokens} output tokens")
    lines.append("          " + ", ".join(limits))
    lines.append(f"prompt    about {facts.prompt_tokens} tokens (length estimate)")
    if decision.primary is None:
        lines.append("decision  REFUSED")
    else:
        how = f"{decision.plan}: {decision.primary}"
        if decision.fallback is not None:
            when = "at once" if decision.fallback_now else "at the deadline or on failure"
            if decision.hedge_s is not None:
                when = f"after {_ms(decision.hedge_s)} (hedge)"
            how += f", then {decision.fallback} {when}"
        lines.append(f"decision  {how}")
    lines.append("why")
    lines += [f"  - {r}" for r in decision.reasons]
    lines.append("predicted")
    for name, p in sorted(state.latency.items()):
        lines.append("  " + _prediction(name, p))
    return "\n".join(lines)


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
            "deadline_s": decision.deadline_s,
            "hedge_s": decision.hedge_s,
            "reasons": list(decision.reasons),
            "prompt_tokens": facts.prompt_tokens,
            "max_tokens": facts.max_tokens,
            "predicted": {
                name: {"ttft_s": p.ttft_s, "ttft_p95_s": p.ttft_p95_s, "total_s": p.total_s}
                for name, p in state.latency.items()
            },
        },
        indent=2,
    )


def run_explain(args: argparse.Namespace) -> int:
    policy = resolve_policy(args.policy, dirs=args.policy_dir)
    latency = LatencyModel()
    if args.local_model:
        _seed_from_engine(latency, args.local_model, args.threads)
    engines: list[EngineName] = []
    if not args.no_local:
        engines.append("local")
    if not args.no_cloud:
        engines.append("cloud")
    privacy: frozenset[str] | None = frozenset(args.found or ())
    decision, facts, state = explain(
        args.prompt,
        policy,
        engines=engines,
        latency=latency,
        queue_s=args.queue_s,
        cloud_circuit_open=args.cloud_circuit == "open",
        router_score=args.router_score,
        router_threshold=args.threshold,
        privacy_kinds=privacy,
        budget_fits=not args.budget_exhausted,
        max_tokens=args.max_tokens,
    )
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
