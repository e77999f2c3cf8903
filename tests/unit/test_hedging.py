"""`choose_hedge_delay`: the automatic hedge delay as a pure function of two TTFT distributions,
the hedge's price and the deadline race's own start."""

from __future__ import annotations

import random

import pytest

from hybridllm.routing.hedging import choose_hedge_delay, quantile
from hybridllm.testing.faults import heavy_tail


def cloud_tail(n: int = 48, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    dist = heavy_tail(median_ms=150, p99_ms=3000, spike_probability=0.03, spike_ms=10_000)
    return [dist(rng) / 1000 for _ in range(n)]


LOCAL = [0.05, 0.052, 0.055, 0.06]


def test_a_free_hedge_in_a_heavy_tail_starts_at_once() -> None:
    c = choose_hedge_delay(cloud_tail(), LOCAL, price_s=0.0, cap_s=0.55)
    assert c.delay_s == 0.0 and c.tail_s == pytest.approx(0.06)
    assert c.baseline_tail_s == pytest.approx(0.55 + 0.06)  # the deadline race alone


def test_a_dearer_hedge_waits_longer_and_fires_less() -> None:
    tail = cloud_tail()
    delays, fires = [], []
    for price in (0.0, 1.0, 3.0):
        c = choose_hedge_delay(tail, LOCAL, price_s=price, cap_s=0.55)
        assert c.delay_s is not None
        delays.append(c.delay_s)
        fires.append(c.fire_rate)
    assert delays == sorted(delays) and delays[0] < delays[-1]
    assert fires == sorted(fires, reverse=True)


def test_device_time_priced_dear_makes_a_local_hedge_wait() -> None:
    cheap = choose_hedge_delay(cloud_tail(), LOCAL, weight=0.5, cap_s=0.55)
    dear = choose_hedge_delay(cloud_tail(), LOCAL, weight=50.0, cap_s=0.55)
    assert cheap.delay_s == 0.0
    assert dear.delay_s is None or dear.delay_s > 0.1


def test_no_hedge_pays_against_a_tight_primary() -> None:
    tight = [0.1 + 0.001 * i for i in range(30)]
    c = choose_hedge_delay(tight, [0.2], price_s=1.0, cap_s=0.4)
    assert c.delay_s is None and c.fire_rate == 0.0 and c.tail_s == c.baseline_tail_s


def test_the_choice_never_passes_the_deadline_start() -> None:
    c = choose_hedge_delay(cloud_tail(), LOCAL, price_s=100.0, cap_s=0.3)
    assert c.delay_s is None or c.delay_s < 0.3


def test_without_a_deadline_a_stall_is_hedged() -> None:
    c = choose_hedge_delay(cloud_tail(), LOCAL, price_s=0.5, cap_s=None)
    assert c.delay_s is not None and c.tail_s < 1.0 < c.baseline_tail_s


@pytest.mark.parametrize(("price", "weight"), [(1.0, 0.0), (0.0, 3.0), (0.5, 1.0)])
def test_the_objective_is_minimal_over_a_fine_grid(price: float, weight: float) -> None:
    """The chosen delay is within a few ms of the best one on a 5 ms grid."""
    tail, cap = cloud_tail(), 0.55

    def work(d: float) -> float:
        return sum(min(p - d, b) for p in tail if p > d for b in LOCAL) / (len(tail) * len(LOCAL))

    def loss(d: float) -> float:
        vals = sorted(min(p, d + b) for p in tail for b in LOCAL)
        fire = sum(p > d for p in tail) / len(tail) - sum(p > cap for p in tail) / len(tail)
        return quantile(vals, 0.99) + price * fire + weight * (work(d) - work(cap))

    c = choose_hedge_delay(tail, LOCAL, price_s=price, weight=weight, cap_s=cap)
    best = min(loss(i * 0.005) for i in range(int(cap / 0.005) + 1))
    got = loss(c.delay_s if c.delay_s is not None else cap)
    assert got <= best + 0.02


def test_empty_samples_are_refused() -> None:
    with pytest.raises(ValueError):
        choose_hedge_delay([], [0.1], price_s=0.0)
