"""The plans: the ways one request can run, each an async function of a `RequestRun`.

- `single`: one engine, start to finish, with retries before the first token (`single.py`);
- `race`: the first-token deadline race, with hedging and mid-stream failover (`race.py`);
- `handoff`: the local engine starts, the cloud continues the answer (`handoff.py`).
- `speculative`: the local model drafts, the cloud verifies (`speculative/`, a room of its own:
  the plan, its rounds, the verifier dialects and the sampling rule).

A new plan (speculative: local drafts, cloud verifies; cascade: local confidence decides) is a
module here beside them, named below.
"""

from __future__ import annotations

from hybridllm.runtime.plans.handoff import build_handoff, handoff
from hybridllm.runtime.plans.race import fallback_lead_s, race
from hybridllm.runtime.plans.single import single
from hybridllm.runtime.plans.speculative.plan import build_speculative

__all__ = ["build_handoff", "build_speculative", "fallback_lead_s", "handoff", "race", "single"]
