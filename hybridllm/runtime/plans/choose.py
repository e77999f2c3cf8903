"""Which plan runs a decided request: the one place that maps a `Decision` to a plan function,
so the client stays a thin shell around it. The plan itself is chosen by `decide()`; this only
builds what `Decision.plan` names."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING

# the plans that register in their own modules (importing them registers them)
import hybridllm.runtime.plans.cascade  # noqa: F401
import hybridllm.runtime.plans.handoff  # noqa: F401
import hybridllm.runtime.plans.speculative.plan  # noqa: F401
from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.events import EngineName
from hybridllm.policy import Policy
from hybridllm.routing.decision import Decision
from hybridllm.runtime.plans.race import race
from hybridllm.runtime.plans.registry import Plan, PlanContext, plan_spec, register
from hybridllm.runtime.plans.single import single

if TYPE_CHECKING:
    from hybridllm.runtime.gather import Gatherer

__all__ = ["Plan", "choose_plan"]


def choose_plan(
    decision: Decision,
    engines: dict[EngineName, Engine],
    request: GenerationRequest,
    policy: Policy,
    fallback_ttft_s: float | None,
    routing: Gatherer,
    backups: tuple[Engine, ...] = (),
    backup_ttft_s: tuple[float | None, ...] = (),
) -> Plan:
    """The plan for this request: the registered plan `decision.plan` names, built from the
    request's `PlanContext` (`engines`: the ones it may use, the cloud already bound to the
    request's guard context). A registered plan whose capabilities the primary lacks runs as
    the decision's own single or hedge plan would."""
    ctx = PlanContext(
        decision, engines, request, policy, fallback_ttft_s, routing, backups, backup_ttft_s
    )
    spec = plan_spec(decision.plan)
    if spec is None or not spec.fits(ctx):
        spec = _builtin_hedge if decision.fallback is not None or backups else _builtin_single
    return spec.build(ctx)


def _single(ctx: PlanContext) -> Plan:
    request = _with_call_bounds(ctx.decision, ctx.request, ctx.policy)
    if ctx.decision.fallback is not None or ctx.backups:
        return _race(ctx)
    return partial(
        single, engine=ctx.primary, request=request, reason=ctx.decision.reason, stall_s=ctx.stall_s
    )


def _race(ctx: PlanContext) -> Plan:
    """The race; with no fallback of the decision's own, the first backup cloud is it (started
    on the primary's failure, or at the deadline)."""
    decision, backups, predicted = ctx.decision, ctx.backups, ctx.backup_ttft_s
    if decision.fallback is not None:
        fallback = ctx.engines[decision.fallback]
    else:
        fallback, backups, predicted = backups[0], backups[1:], predicted[1:]
    return partial(
        race,
        primary=ctx.primary,
        fallback=fallback,
        backups=backups,
        backup_ttft_s=predicted,
        request=_with_call_bounds(decision, ctx.request, ctx.policy),
        deadline_s=decision.deadline_s,
        reason=decision.reason,
        hedge_s=decision.hedge_s,
        stall_s=ctx.stall_s,
        fallback_now=decision.fallback_now,
        parallel_reason=decision.load_reason,  # a parallel start says the load rule's words
        fallback_ttft_s=ctx.fallback_ttft_s,
        failover=decision.failover,
        release_s=decision.release_s,
    )


# the decision's own plans ("single" is the race when the decision has a fallback, as "hedge"
# is); the others register in their own modules
_builtin_single = register("single", _single, builtin=True)
_builtin_hedge = register("hedge", _single, builtin=True)


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
