"""A toy plan, "shout", in one file: the primary engine's answer in capitals, with its own
policy table (`[shout] suffix = "!"`). It exists to show that a plan is one module and one
registration line (tests/unit/test_records.py runs it through `stream()`, `decide()`, a policy
with its table, the trace export and `stats()`); nothing else in hybridllm names it."""

from __future__ import annotations

from functools import partial

from pydantic import BaseModel, ConfigDict

from hybridllm.events import Chunk, Delta, Finish
from hybridllm.runtime.plans.registry import Plan, PlanContext, register
from hybridllm.runtime.stream import RequestRun


class ShoutTable(BaseModel):
    """`[shout]`: what the shouted answer ends with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    suffix: str = ""


async def shout(run: RequestRun, ctx: PlanContext) -> None:
    engine, finishes = ctx.primary, []
    table = ctx.table
    suffix = table.suffix if isinstance(table, ShoutTable) else ""

    def handle(chunk: Chunk) -> None:
        if isinstance(chunk, Finish):
            finishes.append(chunk)
        elif isinstance(chunk, Delta):
            run.deliver(engine.name, Delta(chunk.text.upper(), chunk.t))
        else:
            run.deliver(engine.name, chunk)

    run.route(engine, ctx.decision.reason)
    await run.relay(engine, ctx.request, handle)
    if suffix and finishes:
        run.deliver(engine.name, Delta(suffix, finishes[-1].t))
    run.complete(engine.name, finishes[-1] if finishes else None)


def build_shout(ctx: PlanContext) -> Plan:
    return partial(shout, ctx=ctx)


register("shout", build_shout, splits=False, table=ShoutTable)
