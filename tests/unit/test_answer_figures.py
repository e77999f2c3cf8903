"""Figures of a whole local answer (routing/answer_figures.py): pure numpy, no model. The real
engine's figures are checked in tests/integration/test_cascade.py."""

from __future__ import annotations

import math

import pytest

from hybridllm.routing.answer_figures import ANSWER_NAMES, TAIL, repeat_share, whole_figures


def test_an_ended_answer_does_not_count_its_end_token() -> None:
    lps = [-0.1] * 10 + [-3.0, -0.5, -7.0]  # the last one: the end-of-generation token
    f = whole_figures(list(range(13)), lps, ended=True)
    assert set(f) == set(ANSWER_NAMES)
    assert f["answer_len"] == pytest.approx(math.log1p(12)) and f["answer_ended"] == 1.0
    tail = lps[12 - TAIL : 12]  # the last eight text tokens
    assert f["tail_lp_mean"] == pytest.approx(sum(tail) / TAIL)
    assert f["tail_lp_min"] == -3.0  # not the end token's -7
    assert f["repeat_share"] == 0.0


def test_an_answer_cut_by_max_tokens_keeps_every_token() -> None:
    f = whole_figures([5, 6, 7], [-0.2, -0.4, -0.6], ended=False)
    assert f["answer_ended"] == 0.0 and f["answer_len"] == pytest.approx(math.log1p(3))
    assert f["tail_lp_min"] == -0.6 and f["tail_lp_mean"] == pytest.approx(-0.4)


def test_a_looping_answer_repeats_its_four_grams() -> None:
    loop = [1, 2, 3, 4] * 5  # 17 four-grams, the first four new
    assert repeat_share(loop) == pytest.approx(13 / 17)
    assert repeat_share([1, 2, 3, 4, 5, 6]) == 0.0 and repeat_share([1, 2, 3]) == 0.0
    assert whole_figures(loop, [-0.1] * 20, ended=False)["repeat_share"] == pytest.approx(13 / 17)


def test_an_empty_answer_and_missing_token_ids() -> None:
    f = whole_figures([9], [-0.3], ended=True)  # only the end token
    assert f["answer_len"] == 0.0 and math.isnan(f["tail_lp_mean"]) and f["repeat_share"] == 0.0
    g = whole_figures(None, [-0.1, -0.2], ended=False)
    assert math.isnan(g["repeat_share"]) and g["tail_lp_min"] == -0.2
    with pytest.raises(ValueError, match="3 tokens but 2"):
        whole_figures([1, 2, 3], [-0.1, -0.2], ended=False)
