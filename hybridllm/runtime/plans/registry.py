"""The plans, by name: each registers how it is built, with the one signature all plans share.

A plan is one module: a builder that takes the `PlanContext` of a decided request and returns
the plan (an async function of the request's `RequestRun`, which it reports to), and one line
that registers it:

    register("echo", build_echo)                 # splits=True: never for a tool call or JSON
    register("echo", build_echo, table=EchoTable)  # with its own policy table, `[echo]`

From then on a policy's `plans`/`plan` (and its `[echo]` table) and a call's `plan=` may name
it, `decide()` runs it on
the engines it chose when it is asked for (a `registered_plan` reason), and the trace, its
export and `stats()` carry its name. `needs`: the engine capabilities (the protocols of
`engines.capabilities`) it needs of the decision's primary; without them the request runs as
the decision's own plan would have ("single" or "hedge"), so a request never fails for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.events import EngineName
from hybridllm.policy import PlanName, Policy, register_plan_name
from hybridllm.routing.decision import Decision
from hybridllm.runtime.stream import RequestRun

if TYPE_CHECKING:
    from hybridllm.runtime.gather import Gatherer

__all__ = ["Plan", "PlanBuilder", "PlanContext", "PlanSpec", "plan_spec", "register"]

Plan = Callable[[RequestRun], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What every plan is built from: the decision, the engines this request may use (the
    cloud already bound to the request's guard context), the request, its policy, the
    fallback's lead (its predicted time to a first token; None: none) and the client's live
    routing state (the router, the speculative plan's per-endpoint state)."""

    decision: Decision
    engines: dict[EngineName, Engine]
    request: GenerationRequest
    policy: Policy
    fallback_ttft_s: float | None
    routing: Gatherer
    # the policy's other clouds that can serve now, in its order (bound to the request's
    # context): where the serving cloud fails, the next one goes on before the device
    backups: tuple[Engine, ...] = ()
    backup_ttft_s: tuple[float | None, ...] = ()  # their predicted times to a first token

    @property
    def primary(self) -> Engine:
        assert self.decision.primary is not None  # decide() names one for every plan it runs
        return self.engines[self.decision.primary]

    @property
    def table(self) -> BaseModel | None:
        """The plan's own policy table (`register(table=)`), as this request's policy sets it;
        None: the plan declared none."""
        return self.policy.plan_table(self.decision.plan)

    @property
    def stall_s(self) -> float | None:
        """The policy's inter-token limit in seconds (None: none)."""
        ms = self.policy.routing.stall_ms
        return None if ms is None else ms / 1000.0


PlanBuilder = Callable[[PlanContext], Plan]


@dataclass(frozen=True, slots=True)
class PlanSpec:
    """A registered plan: its name, its builder and the capabilities it needs of its primary."""

    name: PlanName
    build: PlanBuilder
    needs: tuple[type[Any], ...] = ()

    def fits(self, ctx: PlanContext) -> bool:
        return all(isinstance(ctx.primary, cap) for cap in self.needs)


_PLANS: dict[PlanName, PlanSpec] = {}


def register(
    name: PlanName,
    build: PlanBuilder,
    *,
    needs: tuple[type[Any], ...] = (),
    splits: bool = True,
    builtin: bool = False,
    table: type[BaseModel] | None = None,
) -> PlanSpec:
    """Register the plan `name` (see the module); a name already taken is a `PolicyError`.
    `table`: the plan's own policy table (a pydantic model; a policy's `[name]` table, read as
    `PlanContext.table`). `builtin`: one of the policy's own plan names (registered by
    hybridllm itself, whose tables the policy holds)."""
    if not builtin:
        register_plan_name(name, splits=splits, table=table)
    spec = _PLANS[name] = PlanSpec(name, build, needs)
    return spec


def plan_spec(name: PlanName) -> PlanSpec | None:
    """The registered plan of that name (None: none)."""
    return _PLANS.get(name)
