"""Decode speed in the decision: `decode_rule()`, the step of `decide()` that reads
`tpot_target_ms`.

A request whose answer is expected to be long (`max_tokens >= LONG_ANSWER_TOKENS`) under a
policy with a decode-speed target, served first by a local engine the latency model predicts
slower than the target (its median TPOT, past the target by more than `DECODE_MARGIN`), while
the cloud decodes faster:

- hands off ("handoff" in the policy's plans, and the cloud can continue a started answer): the
  local engine gives the first tokens at its own TTFT, the cloud continues the answer
  (`runtime/plans/handoff.py`);
- else gives the cloud the request, if the cloud's predicted TTFT meets the deadline (or there
  is none): the local engine becomes the fallback;
- else keeps the local engine (the first token matters more), and says why.

`plan = "handoff"` (a call's `plan=`, else the policy's `plan`) asks for the handoff whatever
the speeds, wherever both engines may serve: the local engine then starts, the cloud continues.
"""

from __future__ import annotations

from collections.abc import Mapping

from hybridllm.events import EngineName
from hybridllm.policy import PlanName, Policy
from hybridllm.routing.decision import Reason
from hybridllm.routing.inputs import Prediction

LONG_ANSWER_TOKENS = 64  # an answer allowed this many tokens or more counts as long
# the local engine counts as too slow only past the target by this factor: a prediction near
# the target (a prior, a noisy median) does not flip the route
DECODE_MARGIN = 1.1


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms"


def decode_rule(
    max_tokens: int,
    policy: Policy,
    primary: EngineName,
    fallback: EngineName,
    latency: Mapping[EngineName, Prediction],
    continues: frozenset[EngineName],
    deadline: float | None,
    reasons: list[Reason],
    asked: PlanName | None,
) -> tuple[EngineName, EngineName, bool]:
    """(primary, fallback, hand off?) after the decode-speed rule; each change adds a reason.
    `asked`: the plan asked for (the call's, else the policy's)."""
    after = f"local starts, cloud continues after {policy.handoff.after_tokens} tokens"
    can = "handoff" in (*policy.plans, asked) and "cloud" in continues
    if asked == "handoff":
        if not can:
            text = "plan=handoff, but the cloud cannot continue an answer -> no handoff"
            reasons.append(Reason("no_handoff", text))
            return primary, fallback, False
        reasons.append(Reason("handoff_asked", f"plan=handoff: {after}"))
        return "local", "cloud", True
    target = policy.routing.tpot_target_ms
    if target is None or primary != "local" or fallback != "cloud":
        return primary, fallback, False
    mine, theirs = latency.get("local"), latency.get("cloud")
    if (
        max_tokens < LONG_ANSWER_TOKENS
        or mine is None
        or mine.tpot_s * 1e3 <= target * DECODE_MARGIN
    ):
        return primary, fallback, False
    slow = (
        f"local decodes at {_ms(mine.tpot_s)}/token, slower than the {target:g} ms target, "
        f"for an answer of up to {max_tokens} tokens"
    )
    if theirs is None or theirs.tpot_s >= mine.tpot_s:
        reasons.append(
            Reason("slow_decode_no_faster", f"{slow}, but the cloud is no faster -> local")
        )
        return primary, fallback, False
    slow += f" (cloud {_ms(theirs.tpot_s)}/token)"
    if can:
        reasons.append(Reason("slow_decode_handoff", f"{slow} -> handoff: {after}"))
        return primary, fallback, True
    if deadline is None or theirs.ttft_s <= deadline:
        reasons.append(Reason("slow_decode_cloud", f"{slow} -> cloud"))
        return "cloud", "local", False
    text = (
        f"{slow}, but the cloud's predicted TTFT {_ms(theirs.ttft_s)} misses the "
        f"{_ms(deadline)} deadline -> local"
    )
    reasons.append(Reason("slow_decode_deadline", text))
    return primary, fallback, False
