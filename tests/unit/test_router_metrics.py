"""PGR / APGR / CPT on small cases computed by hand (RouteLLM's definitions)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybridllm.training.metrics import apgr, apgr_interval, cpt, routing_curve, summarize

# four prompts: gains (cloud - local) are +1, +1, 0, -1; local-only 2/4, cloud-only 3/4
LOCAL = [False, False, True, True]
CLOUD = [True, True, True, False]


def test_perfect_order_curve_pgr_apgr_cpt() -> None:
    c = routing_curve([0.9, 0.8, 0.2, 0.1], LOCAL, CLOUD)
    assert c.q_weak == pytest.approx(0.5) and c.q_strong == pytest.approx(0.75)
    assert list(c.quality) == pytest.approx([0.5, 0.75, 1.0, 1.0, 0.75])
    assert list(c.pgr) == pytest.approx([0.0, 1.0, 2.0, 2.0, 1.0])
    # trapezoids over steps of 1/4: (0+1)/2 + (1+2)/2 + (2+2)/2 + (2+1)/2 = 5.5, times 1/4
    assert apgr(c) == pytest.approx(5.5 / 4)
    assert cpt(c, 0.5) == pytest.approx(0.125)  # halfway along the first step
    assert cpt(c, 1.0) == pytest.approx(0.25)
    assert cpt(c, 0.0) == 0.0


def test_reversed_order() -> None:
    c = routing_curve([0.1, 0.2, 0.8, 0.9], LOCAL, CLOUD)
    # sends the -1 prompt first, then the 0, then the two +1
    assert list(c.quality) == pytest.approx([0.5, 0.25, 0.25, 0.5, 0.75])
    assert list(c.pgr) == pytest.approx([0.0, -1.0, -1.0, 0.0, 1.0])
    assert apgr(c) == pytest.approx((-0.5 - 1.0 - 0.5 + 0.5) / 4)
    assert cpt(c, 0.5) == pytest.approx(0.875)
    assert cpt(c, 1.5) is None


def test_ties_give_the_expected_value_and_all_tied_is_random() -> None:
    tied = routing_curve([0.5, 0.5, 0.5, 0.5], LOCAL, CLOUD)
    assert list(tied.pgr) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert apgr(tied) == pytest.approx(0.5)
    assert cpt(tied, 0.8) == pytest.approx(0.8)
    # a tie between the +1 and the -1 prompt: each first with probability 1/2
    c = routing_curve([0.9, 0.7, 0.7, 0.1], [False, False, True, True], [True, True, False, True])
    # gains sorted: +1, then (+1, -1) tied -> 0, 0; then 0
    assert list(c.quality) == pytest.approx([0.5, 0.75, 0.75, 0.75, 0.75])


def test_random_router_on_larger_data_matches_the_line() -> None:
    rng = np.random.default_rng(0)
    local, cloud = rng.random(200) < 0.3, rng.random(200) < 0.6
    s = summarize(routing_curve(np.zeros(200), local, cloud))
    assert s.apgr == pytest.approx(0.5)
    assert s.pgr[0.3] == pytest.approx(0.3)
    assert s.cpt[0.95] == pytest.approx(0.95)


def test_equal_engines_make_pgr_undefined() -> None:
    c = routing_curve([0.3, 0.2], [True, False], [True, False])
    assert math.isnan(apgr(c))
    assert cpt(c, 0.5) is None


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        routing_curve([], [], [])
    with pytest.raises(ValueError):
        routing_curve([0.1], [True, False], [True])


def test_apgr_interval_brackets_the_estimate() -> None:
    rng = np.random.default_rng(1)
    local, cloud = rng.random(120) < 0.3, rng.random(120) < 0.7
    gain = cloud.astype(float) - local
    informative = gain + rng.normal(0, 0.5, 120)
    ci = apgr_interval(informative, local, cloud)
    assert ci is not None
    point = apgr(routing_curve(informative, local, cloud))
    assert ci[0] < point < ci[1] and ci[0] > 0.5  # a useful router is clearly above random
    assert apgr_interval([0.1, 0.2], [True, False], [True, False]) is None


def test_report_blocks_are_told_apart_by_kind_not_by_title() -> None:
    """`evaluate`'s blocks say which prompts they cover in `kind` (and `source`): the reports
    pick them by that, whatever their titles say."""
    import numpy as np

    from hybridllm.training.evaluate import Block, Row, format_report, format_sources
    from hybridllm.training.metrics import CPT_TARGETS, SHOWN_SHARES, Curve, Summary

    summary = Summary(
        10, 0.4, 0.7, 0.6, dict.fromkeys(SHOWN_SHARES, 0.5), dict.fromkeys(CPT_TARGETS, 0.5)
    )
    row = Row("router", summary, Curve(np.zeros(11), np.zeros(11)))
    blocks = [
        Block("all of it", [row]),
        Block("a title that does not start with the word", [row], "source", "mmlu"),
        Block("neither does this one", [row], "left_out", "gsm8k"),
    ]
    sources = format_sources(blocks).splitlines()[2:]
    assert [line.split()[0] for line in sources] == ["mmlu"]
    report = format_report(blocks)
    assert "== all of it" in report and "== neither does this one" in report
    assert "a title that does not start" not in report
