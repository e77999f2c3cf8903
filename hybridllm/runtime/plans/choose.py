"""Which plan runs a decided request: the one place that maps a `Decision` (and a call's
`plan=`) to a plan function, so the client stays a thin shell around it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.events import EngineName
from hybridllm.policy import Policy
from hybridllm.routing.decide import Decision
from hybridllm.runtime.plans.cascade import cascade_for
from hybridllm.runtime.plans.handoff import handoff_plan
from hybridllm.runtime.plans.race import race
from hybridllm.runtime.plans.single import single
from hybridllm.runtime.plans.speculative import plan_for as speculative_plan
from hybridllm.runtime.stream import RequestRun

if TYPE_CHECKING:
    from hybridllm.runtime.gather import Routing

__all__ = ["Plan", "choose_plan"]

Plan = Callable[[RequestRun], Awaitable[None]]


def choose_plan(
    decision: Decision,
    engines: dict[EngineName, Engine],
    request: GenerationRequest,
    policy: Policy,
    fallback_ttft_s: float | None,
    plan: str | None,
    routing: Routing,
) -> Plan:
    """The plan for this request. `engines` are the ones this request may use (the cloud one
    already bound to the request's guard context)."""
    assert decision.primary is not None
    cascaded = cascade_for(plan, decision, engines, request, policy, routing.router)
    if cascaded is not None:
        return cascaded
    target = engines[decision.primary]
    stall_s = None if policy.routing.stall_ms is None else policy.routing.stall_ms / 1000.0
    if decision.plan == "speculative":
        return speculative_plan(routing, engines, request, decision, policy)
    if decision.plan == "handoff":
        return handoff_plan(decision, engines, request, policy)
    if decision.fallback is None:
        return partial(
            single,
            engine=target,
            request=request,
            reason=decision.reason,
            retries=policy.routing.retries,
            deadline_s=decision.deadline_s,
            stall_s=stall_s,
        )
    return partial(
        race,
        primary=target,
        fallback=engines[decision.fallback],
        request=request,
        deadline_s=decision.deadline_s,
        reason=decision.reason,
        hedge_s=decision.hedge_s,
        stall_s=stall_s,
        # with fallback_now the load rule's reason is the last one (no hedge follows it)
        fallback_now=decision.reasons[-1] if decision.fallback_now else None,
        fallback_ttft_s=fallback_ttft_s,
        failover=decision.failover,
    )
