"""The automatic hedge delay: a pure function of the primary's TTFT distribution, the backup's,
the hedge's price and the deadline.

A hedge started `d` seconds after the call gives the request the first token of
`min(T_primary, d + T_backup)`. Started early it cuts the tail but runs on most requests; started
late it is cheap and useless. `choose_hedge_delay` picks the `d` that minimises

    L(d) = Q99(min(T_p, d + T_b)) + price * F(d) + weight * W(d)

over the empirical distributions (the latency model's residuals around this request's
prediction, `Prediction.ttft_samples`): the expected p99 TTFT, plus `price` (seconds of p99 one
fired hedge must buy) times F(d), the share of requests that fire the hedge, plus `weight`
times W(d), the expected seconds of the backup's work until the request's first token
(`min(T_p - d, T_b)` on a fired hedge: it is cancelled at the primary's first token, or its own
token serves). `cap` is when the deadline race starts the backup anyway (the deadline less the
backup's lead): F and W count only what a hedge adds to that, so "no hedge" is the `d = cap`
candidate, it costs nothing, and a hedge must beat it.

A quality decision (the cloud chosen for its answer, `Decision.objective`) holds its local
rescue until the deadline `R`: without a hedge the local engine starts at `cap` and its first
token is delivered at `max(R, cap + T_b)` at the earliest. A hedge at `d` delivers the local
answer from `d` on, and each local answer delivered before the deadline costs the quality it
expects to lose: `P(local wrong)` (the router's score; 1 without one) times `quality_s` (the
policy's `[hedge] quality_weight_ms`). The loss adds `quality_s * P(wrong) * E(d)`, where `E(d)`
is the share of requests whose local answer the hedge delivers before the deadline (the rescue
delivers none). Every such answer counts, also where the samples say the cloud would have
missed the deadline anyway: that is a prediction, and a prediction that the cloud will be late
is what handed quality decisions to the local engine before (issue 25). An easy prompt (a low
`P(wrong)`) may hedge early; a hard one waits for the deadline, where the rescue is the only
answer in time.

The policy sets the terms: a local hedge costs device time only (`weight` =
`hedge_device_weight`, `price` 0); a cloud hedge costs a cloud request paid for, whether it wins
or loses (`price` = `hedge_cloud_price_ms`, `weight` 0). In a heavy tail the p99 falls one ms
for each ms the hedge moves earlier, so a cheap hedge goes early (a device that is free hedges
at once) and a dear one waits where the primary's density is low (past its body), or not at
all.

`hedge_delay` is the hedge step of `decide()`: the policy's fixed delay, or "auto" (also for
`plan = "hedge"` without a delay), priced here once the primary has `AUTO_HEDGE_MIN_SAMPLES`
requests of history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from hybridllm.events import EngineName
from hybridllm.routing.decision import Reason

if TYPE_CHECKING:
    from hybridllm.policy import PlanName, Policy
    from hybridllm.routing.decision import LiveState
    from hybridllm.routing.inputs import Prediction

AUTO_HEDGE_MIN_SAMPLES = 5  # an automatic hedge waits for this much of the primary's history
TAIL_QUANTILE = 0.99
BACKUP_POINTS = 5  # the backup's distribution, reduced to this many quantiles (speed)
CANDIDATES = 24  # delays tried: 0, the primary's quantiles, the cap


@dataclass(frozen=True, slots=True)
class HedgeChoice:
    delay_s: float | None  # None: no hedge pays (the deadline, or a failure, starts the backup)
    tail_s: float  # the expected p99 TTFT with this choice
    baseline_tail_s: float  # ... without a hedge
    fire_rate: float  # the share of requests that start the hedge (beyond the deadline's own)
    # the backup starts at `delay_s` but its tokens stay held until `hold_s` (a rescue made
    # ready sooner: its own TTFT is longer than the lead the deadline race gives it)
    held: bool = False


def lead_s(predicted_s: float, deadline_s: float, *, rescue: bool = False) -> float:
    """How long before the deadline a fallback starts: its predicted time to a first token, so
    that token can still land by the deadline, at most half the deadline, so that a fallback
    which cannot make the deadline anyway does not run alongside every request. A rescue (a
    quality decision's held local engine, `backup_ttft_s`) takes its whole predicted time, at
    most the whole deadline: it must be ready when the deadline passes, and one that cannot be
    starts at once, so that it is as little late as the device allows (held, it parks at its
    first token: its cost is its prefill). The race starts its fallback by this lead
    (`runtime.plans.race`); the automatic hedge prices against it."""
    predicted_s = max(0.0, predicted_s)
    if rescue:
        return min(predicted_s, deadline_s)
    return min(predicted_s, deadline_s / 2)


def backup_ttft_s(prediction: Prediction, *, rescue: bool) -> float:
    """The backup's time to a first token that its lead is measured by: the expected one for a
    competitor; for a rescue, the p95, or more where backups started late ran slower than
    predicted (`Prediction.rescue_ttft_s`): a rescue parks at its first token, so starting it
    early costs device work, never latency."""
    if not rescue:
        return prediction.ttft_s
    return max(prediction.ttft_p95_s, prediction.rescue_ttft_s or 0.0)


def quantile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted `xs` (0.0 for none)."""
    if not xs:
        return 0.0
    return xs[max(0, min(len(xs) - 1, math.ceil(q * len(xs)) - 1))]


def _tail(
    primary: Sequence[float], backup: Sequence[float], start_s: float, q: float, hold_s: float = 0.0
) -> float:
    """The `q` TTFT with the backup started at `start_s`, its tokens held until `hold_s`."""
    return quantile(sorted(min(p, max(hold_s, start_s + b)) for p in primary for b in backup), q)


def _survival(primary: Sequence[float], d: float) -> float:
    return sum(p > d for p in primary) / len(primary)


def _work(primary: Sequence[float], backup: Sequence[float], d: float) -> float:
    """Expected seconds the backup, started at `d`, runs until the request's first token."""
    total = sum(min(p - d, b) for p in primary if p > d for b in backup)
    return total / (len(primary) * len(backup))


def _early(primary: Sequence[float], backup: Sequence[float], d: float, hold: float) -> float:
    """The share of requests whose backup answer, started at `d` and not held, is delivered
    before `hold` (the deadline) and before the primary's."""
    won = sum(d + b < min(p, hold) for p in primary for b in backup)
    return won / (len(primary) * len(backup))


def choose_hedge_delay(
    primary: Sequence[float],
    backup: Sequence[float],
    *,
    price_s: float = 0.0,
    weight: float = 0.0,
    cap_s: float | None = None,
    q: float = TAIL_QUANTILE,
    hold_s: float | None = None,
    quality_s: float = 0.0,
) -> HedgeChoice:
    """The hedge delay minimising the expected `q` TTFT plus `price_s` per hedge fired plus
    `weight` per second of the backup's work plus `quality_s` per backup answer delivered
    (see the module). `primary`, `backup`: TTFT samples in seconds (not empty); `cap_s`: when
    the backup starts anyway (None: never); `hold_s`: without a hedge, the backup's tokens are
    held until then (a quality decision's rescue, its deadline; None: not held)."""
    if not primary or not backup:
        raise ValueError("choose_hedge_delay needs TTFT samples of both engines")
    p = sorted(primary)
    b = sorted(backup)
    if len(b) > BACKUP_POINTS:
        b = [quantile(b, (i + 0.5) / BACKUP_POINTS) for i in range(BACKUP_POINTS)]
    cap = math.inf if cap_s is None else max(0.0, cap_s)
    base_fire = _survival(p, cap) if cap_s is not None else 0.0
    base_work = _work(p, b, cap) if cap_s is not None and weight else 0.0
    hold = 0.0 if hold_s is None else hold_s
    baseline = _tail(p, b, cap, q, hold)
    best = HedgeChoice(None, baseline, baseline, 0.0)
    best_loss = baseline
    levels = {0.0, *(quantile(p, i / CANDIDATES) for i in range(1, CANDIDATES))}
    for d in sorted((x for x in levels if x < cap), reverse=True):  # later first: ties wait
        fire = _survival(p, d) - base_fire
        cost = price_s * fire + (weight * (_work(p, b, d) - base_work) if weight else 0.0)
        tail = _tail(p, b, d, q)
        options = [(tail + cost + quality_s * _early(p, b, d, hold), tail, False)]
        if hold_s is not None:  # or started at d and still held until the deadline
            held_tail = _tail(p, b, d, q, hold)
            options.append((held_tail + cost, held_tail, True))
        loss, tail, held = min(options, key=lambda o: (o[0], not o[2]))  # ties: held
        if loss < best_loss - 1e-3:  # at least a ms better than waiting longer
            best, best_loss = HedgeChoice(d, tail, baseline, fire, held), loss
    return best


# ---- the hedge step of `decide()` ------------------------------------------------------------


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


class HedgeStart(NamedTuple):
    """The hedge of a decision: when the backup starts (None: no hedge), and whether its tokens
    are delivered from then on (an automatic hedge of a quality decision, priced with the quality
    it may lose); False: a quality decision's rescue holds them until the deadline."""

    delay_s: float | None
    delivers: bool = False


def hedge_delay(
    policy: Policy,
    primary: EngineName,
    fallback: EngineName | None,
    state: LiveState,
    reasons: list[Reason],
    deadline: float | None,
    early_start: bool,
    asked: PlanName | None,
    wrong_p: float | None = None,
) -> HedgeStart:
    """The hedge delay: the policy's, or "auto" (also for `plan = "hedge"` without a delay,
    as `Policy.with_plan` sets it); None: no hedge. `early_start`: the fallback starts ahead
    of the deadline by its TTFT, so an "auto" delay must leave it that much. `wrong_p`: a
    quality decision's P(the local answer is wrong), its rescue held until the deadline (None:
    the first token wins)."""
    delay = policy.hedge.after_ms
    if delay is None and asked == "hedge":
        delay = "auto"
    if fallback is None or delay is None or "hedge" not in (*policy.plans, asked):
        return HedgeStart(None)
    if delay != "auto":
        hedge_s = delay / 1000.0
        held = " (its tokens held: a rescue)" if wrong_p is not None else ""
        text = f"hedge: {fallback} starts after {_ms(hedge_s)} without a token{held}"
        reasons.append(Reason("hedge", text))
        return HedgeStart(hedge_s)
    auto = _auto_hedge(policy, primary, fallback, state, reasons, deadline, early_start, wrong_p)
    if auto is None:
        return HedgeStart(None)
    return HedgeStart(auto.delay_s, delivers=wrong_p is not None and not auto.held)


def quality_price_s(policy: Policy, wrong_p: float) -> float:
    """What a local answer delivered in the cloud's place is expected to cost, in seconds of
    waiting: P(local wrong) x the policy's `[hedge] quality_weight_ms`."""
    return wrong_p * policy.hedge.quality_weight_ms / 1000.0


def _auto_hedge(
    policy: Policy,
    primary: EngineName,
    fallback: EngineName,
    state: LiveState,
    reasons: list[Reason],
    deadline: float | None,
    early_start: bool,
    wrong_p: float | None = None,
) -> HedgeChoice | None:
    """The hedge delay `routing.hedging` prices against the primary's TTFT history (for a
    quality decision, `wrong_p` given, also against the quality a local answer may lose)."""
    mine, theirs = state.latency.get(primary), state.latency.get(fallback)
    if mine is None or mine.samples < AUTO_HEDGE_MIN_SAMPLES or not mine.ttft_samples:
        return None  # not enough history yet: the deadline alone applies
    if theirs is None:
        return None
    backup = theirs.ttft_samples or (theirs.ttft_s,)
    price = weight = 0.0
    if fallback == "local":
        weight = policy.hedge.device_weight
        cost = f"device time until the first token x {weight:g}"
    else:
        price = policy.hedge.cloud_price_ms / 1000.0
        cost = f"a cloud request priced at {_ms(price)}"
    cap = None
    if deadline is not None:  # when the race starts the backup anyway
        rescue = wrong_p is not None
        lead = lead_s(backup_ttft_s(theirs, rescue=rescue), deadline, rescue=rescue)
        cap = deadline - (lead if early_start else 0.0)
    quality_s = 0.0
    if wrong_p is not None:
        quality_s = quality_price_s(policy, wrong_p)
        weight_ms = policy.hedge.quality_weight_ms
        cost += f"; a local answer delivered costs P(wrong) {wrong_p:.2f} x {weight_ms:g} ms"
    c = choose_hedge_delay(
        mine.ttft_samples,
        backup,
        price_s=price,
        weight=weight,
        cap_s=cap,
        hold_s=deadline if wrong_p is not None else None,
        quality_s=quality_s,
    )
    if c.delay_s is None:
        text = (
            f"auto hedge: none pays ({primary} p99 TTFT {_ms(c.baseline_tail_s)}; a {fallback} "
            f"hedge costs {cost})"
        )
        reasons.append(Reason("auto_hedge_none", text))
        return None
    held = f", held until the {_ms(deadline)} deadline" if c.held and deadline is not None else ""
    text = (
        f"auto hedge: {fallback} starts after {_ms(c.delay_s)} without a token{held} (expected "
        f"p99 TTFT {_ms(c.tail_s)} against {_ms(c.baseline_tail_s)}, on {c.fire_rate:.0%} more "
        f"requests; a hedge costs {cost})"
    )
    reasons.append(Reason("auto_hedge", text))
    return c
