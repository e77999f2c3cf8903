"""Which plan runs a decided request: the one place that maps a `Decision` to a plan function,
so the client stays a thin shell around it. The plan itself is chosen by `decide()`; this only
builds what `Decision.plan` names."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.events import EngineName
from hybridllm.policy import Policy
from hybridllm.routing.decision import Decision
from hybridllm.runtime.plans.cascade import build_cascade
from hybridllm.runtime.plans.handoff import build_handoff
from hybridllm.runtime.plans.race import race
from hybridllm.runtime.plans.single import single
from hybridllm.runtime.plans.speculative.plan import build_speculative
from hybridllm.runtime.stream import RequestRun

if TYPE_CHECKING:
    from hybridllm.runtime.gather import Gatherer

__all__ = ["Plan", "choose_plan"]

Plan = Callable[[RequestRun], Awaitable[None]]


def choose_plan(
    decision: Decision,
    engines: dict[EngineName, Engine],
    request: GenerationRequest,
    policy: Policy,
    fallback_ttft_s: float | None,
    routing: Gatherer,
) -> Plan:
    """The plan for this request. `engines` are the ones this request may use (the cloud one
    already bound to the request's guard context)."""
    assert decision.primary is not None
    target = engines[decision.primary]
    stall_s = None if policy.routing.stall_ms is None else policy.routing.stall_ms / 1000.0
    if decision.plan == "cascade":
        assert routing.router is not None  # decide() chooses the cascade only with a router
        return build_cascade(decision, engines, request, policy, routing.router)
    if decision.plan == "speculative":
        return build_speculative(routing, engines, request, decision, policy)
    if decision.plan == "handoff":
        return build_handoff(decision, engines, request, policy)
    request = _with_call_bounds(decision, request, policy)
    if decision.fallback is None:
        return partial(
            single,
            engine=target,
            request=request,
            reason=decision.reason,
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
        # a parallel start is announced with the load rule's own words
        fallback_now=decision.load_reason if decision.fallback_now else None,
        fallback_ttft_s=fallback_ttft_s,
        failover=decision.failover,
        release_s=decision.release_s,
    )


def _with_call_bounds(
    decision: Decision, request: GenerationRequest, policy: Policy
) -> GenerationRequest:
    """Where the local engine serves first and the cloud can answer instead, a local call below
    the policy's `[tools] min_call_confidence` or `min_tool_fit` is not delivered
    (`runtime.checked`): the request goes to the cloud. Elsewhere every valid call stands."""
    spec, table = request.tools, policy.tools
    unbounded = table.min_call_confidence is None and table.min_tool_fit is None
    if spec is None or unbounded or (decision.primary, decision.fallback) != ("local", "cloud"):
        return request
    bounded = dataclasses.replace(
        spec, min_call_confidence=table.min_call_confidence, min_tool_fit=table.min_tool_fit
    )
    return dataclasses.replace(request, tools=bounded)
