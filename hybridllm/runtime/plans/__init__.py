"""The plans: the ways one request can run, each an async function of a `RequestRun`.

Each plan is one module that registers its name and its builder (`registry.register`, one
signature for all: the request's `PlanContext` in, the plan out); `choose.choose_plan` builds
the one a decision names:

- `single`: one engine, start to finish, with retries before the first token (`single.py`);
- `race`: the first-token deadline race, with hedging and mid-stream failover (`race.py`),
  registered as "single" and "hedge" where the decision has a fallback (`choose.py`);
- `handoff`: the local engine starts, the cloud continues the answer (`handoff.py`);
- `cascade`: the local engine starts, its own confidence decides (`cascade.py`);
- `speculative`: the local model drafts, the cloud verifies (`speculative/`, a room of its own:
  the plan, its rounds, the verifier dialects and the sampling rule).

A new plan is a module of its own that calls `register` (see `registry`): nothing else changes.
"""

from __future__ import annotations

from hybridllm.runtime.plans.cascade import build_cascade, cascade
from hybridllm.runtime.plans.handoff import build_handoff, handoff
from hybridllm.runtime.plans.race import fallback_lead_s, race
from hybridllm.runtime.plans.registry import Plan, PlanContext, PlanSpec, plan_spec, register
from hybridllm.runtime.plans.single import single
from hybridllm.runtime.plans.speculative.plan import build_speculative

__all__ = [
    "Plan",
    "PlanContext",
    "PlanSpec",
    "build_cascade",
    "build_handoff",
    "build_speculative",
    "cascade",
    "fallback_lead_s",
    "handoff",
    "plan_spec",
    "race",
    "register",
    "single",
]
