"""Speculative sampling keeps the cloud's distribution: statistical tests with fixed seeds
(deterministic), synthetic p and q, and vLLM-shaped answers (the documented `prompt_logprobs`
shape, built here from a known synthetic vocabulary, named as such)."""

from __future__ import annotations

import functools
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from hybridllm.engines.nucleus import Dist, nucleus_of_logits, sample
from hybridllm.runtime.plans.speculative.dialect_vllm import TOP, read_sampled
from hybridllm.runtime.plans.speculative.sampling import accept, nucleus_of_top
from hybridllm.runtime.plans.speculative.verifier import Round, Sampling

V = 60  # a synthetic vocabulary


def direct_p(logits: np.ndarray, t: float, top_p: float) -> dict[int, float]:
    """softmax(logits / t) cut to the top_p nucleus, computed over the whole vocabulary."""
    w = np.exp(logits / t - (logits / t).max())
    p = w / w.sum()
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    end = int(np.flatnonzero(cum >= top_p)[0])
    keep = order[: end + 1]
    return {int(i): float(p[i] / p[keep].sum()) for i in keep}


def raw_logprobs(logits: np.ndarray) -> np.ndarray:
    return logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))


def peaked(seed: int) -> np.ndarray:
    """Logits with a few likely tokens and a long flat tail (a confident position)."""
    g = np.random.default_rng(seed)
    z = g.normal(0.0, 1.0, V)
    z[g.choice(V, 5, replace=False)] += np.array([9.0, 8.2, 7.8, 7.0, 6.0])
    return z


def chisquare(observed: Any, expected: Any) -> Any:
    """scipy's test, imported where a test runs it (scipy.stats takes ~0.8 s to import, paid by
    every worker that collects this file otherwise)."""
    from scipy.stats import chisquare as test

    return test(observed, expected)


def chi2_pvalue(counts: Counter[Any], expected: dict[Any, float], n: int) -> float:
    keys = sorted(expected, key=lambda k: -expected[k])
    obs = [counts.get(k, 0) for k in keys]
    extra = n - sum(obs)  # anything committed outside p's support
    assert extra == 0, f"{extra} draws outside p's support"
    return float(chisquare(obs, [expected[k] * n for k in keys]).pvalue)


def test_the_acceptance_rule_commits_tokens_distributed_as_p_not_q() -> None:
    p = Dist(np.array([3, 1, 4, 0]), np.array([0.4, 0.3, 0.2, 0.1]))
    q = Dist(np.array([1, 5, 3, 4]), np.array([0.5, 0.2, 0.2, 0.1]))  # 5: not in p; 0: not in q
    rng, n = random.Random(1234), 40_000
    out: Counter[int] = Counter()
    drafted: Counter[int] = Counter()
    for _ in range(n):
        x = sample(q, rng)
        drafted[x] += 1
        y = accept(p, q, x, rng)
        out[x if y is None else y] += 1
    expected = {int(t): float(v) for t, v in zip(p.ids, p.probs, strict=True)}
    assert chi2_pvalue(out, expected, n) > 1e-3
    assert drafted[5] > 0 and out[5] == 0  # drafted outside p's support, never committed
    # the same test has the power to tell: the drafts themselves (q) are far from p
    seen = [drafted[k] for k in (3, 1, 4, 0)]
    assert chisquare(seen, [e * sum(seen) for e in (0.4, 0.3, 0.2, 0.1)]).pvalue < 1e-9


def test_a_nucleus_inside_the_returned_top_is_p_exactly_and_a_wide_one_is_refused() -> None:
    for seed in range(5):
        z = peaked(seed)
        lp = raw_logprobs(z)
        top = sorted(((i, float(lp[i])) for i in range(V)), key=lambda kv: -kv[1])[:TOP]
        for t, top_p in ((0.8, 0.9), (1.3, 0.8), (0.5, 0.95)):
            got = nucleus_of_top(top, t, top_p, V)
            want = direct_p(z, t, top_p)
            assert isinstance(got, Dist), got
            assert dict(zip(got.ids.tolist(), got.probs.tolist(), strict=True)) == pytest.approx(
                want, rel=1e-9
            )
    flat = np.zeros(V)  # every token equally likely: no 20 tokens hold 90%
    top = [(i, float(raw_logprobs(flat)[i])) for i in range(TOP)]
    assert "not inside" in str(nucleus_of_top(top, 0.8, 0.9, V))
    assert "top_p = 1" in str(nucleus_of_top(top, 0.8, 1.0, V))
    # q locally, over the whole vocabulary, is the same processing
    q = nucleus_of_logits(peaked(9), 0.7, 0.9)
    assert dict(zip(q.ids.tolist(), q.probs.tolist(), strict=True)) == pytest.approx(
        direct_p(peaked(9), 0.7, 0.9), rel=1e-9
    )


@functools.cache
def ranked(row: bytes) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A row of logits (as bytes: the same row is ranked once): its raw log-probabilities,
    their order, and the top-20 entries as vLLM writes them."""
    lp = raw_logprobs(np.frombuffer(row))
    order = np.argsort(-lp, kind="stable")
    top = {str(int(i)): {"logprob": float(lp[i]), "rank": r + 1} for r, i in enumerate(order[:TOP])}
    return lp, order, top


def answer(ctx: int, draft: list[int], rows: list[np.ndarray], own: int) -> dict[str, Any]:
    """A vLLM-shaped answer: raw top-20 per drafted position (plus the drafted token with its
    rank), and the generated token `own` (the cloud's draw after the draft, as a token id)."""
    plp: list[Any] = [None] + [{"1": {"logprob": -0.1, "rank": 1}}] * (ctx - 1)
    for x, z in zip(draft, rows, strict=True):
        lp, order, top = ranked(z.tobytes())
        e = dict(top)
        e.setdefault(str(x), {"logprob": float(lp[x]),
                              "rank": int(np.flatnonzero(order == x)[0]) + 1})  # fmt: skip
        plp.append(e)
    return {
        "choices": [{"index": 0, "text": "?", "finish_reason": "length", "prompt_logprobs": plp,
                     "logprobs": {"tokens": [f"token_id:{own}"]}}],
        "usage": {"prompt_tokens": ctx + len(draft), "completion_tokens": 1},
    }  # fmt: skip


def test_rounds_of_sampled_drafts_commit_sequences_distributed_as_the_clouds() -> None:
    """Positions 0 and 1 have fixed cloud and draft logits; rounds of k = 2 (and the next
    round, where one commits a single token) produce the first two tokens, the cloud drawing
    the bonus token from its own p; their joint distribution must be p0 x p1 after
    temperature 0.8 and top_p 0.9."""
    t, top_p = 0.8, 0.9
    cloud = [peaked(1), peaked(2), peaked(3), peaked(4)]
    local = [c + np.random.default_rng(10 + i).normal(0, 1.2, V) for i, c in enumerate(cloud)]
    qs = [nucleus_of_logits(z, t, top_p) for z in local]
    rng, n = random.Random(99), 12_000
    joint: Counter[tuple[int, int]] = Counter()
    after = [direct_p(z, t, top_p) for z in cloud]  # the cloud's own draw after a draft
    draws = [(list(p), list(p.values())) for p in after]
    for _ in range(n):
        out: list[int] = []
        while len(out) < 2:
            pos = len(out)
            k = 2
            draft = [sample(qs[pos + j], rng) for j in range(k)]
            own = rng.choices(draws[pos + k][0], weights=draws[pos + k][1])[0]
            data = answer(3, draft, cloud[pos : pos + k], own)
            rd = Round("P", "", [1, 2, 3], draft, ["a"] * k, (), lambda ids: "a" * len(ids),
                       Sampling(t, top_p, rng, qs[pos : pos + k], V))  # fmt: skip
            v = read_sampled(data, rd)
            assert v.switch is None and v.next_id is not None
            out += [*draft[: v.accepted], v.next_id]
        joint[(out[0], out[1])] += 1
    p0, p1 = direct_p(cloud[0], t, top_p), direct_p(cloud[1], t, top_p)
    expected = {(a, b): pa * pb for a, pa in p0.items() for b, pb in p1.items()}
    assert chi2_pvalue(joint, expected, n) > 1e-3


def test_a_position_whose_nucleus_is_not_returned_ends_the_round_there() -> None:
    t, top_p = 0.8, 0.9
    cloud = [peaked(1), np.zeros(V)]  # position 1: flat, its nucleus is not in any top 20
    qs = [nucleus_of_logits(z, t, top_p) for z in cloud]
    rng = random.Random(5)
    x0 = int(qs[0].ids[0])
    rd = Round("P", "", [1, 2], [x0, 7], ["a", "b"], (), lambda ids: "ab"[: len(ids)],
               Sampling(t, top_p, rng, qs, V))  # fmt: skip
    seen = set()
    for _ in range(50):
        v = read_sampled(answer(2, [x0, 7], cloud, 3), rd)
        seen.add(v.switch is not None)
        if v.switch is not None:  # x0 kept, position 1 undecidable: commit x0 only
            assert (v.accepted, v.next_id, v.text) == (1, None, "a")
            assert "drafted position 1" in v.switch and "not inside" in v.switch
    assert True in seen


def test_hybridllm_serve_draws_from_the_same_processing_as_the_rule_assumes() -> None:
    """The server's logits processor: its softmax is softmax(z / T) cut to the nucleus."""
    from hybridllm.engines.llama.served import _processed

    z = peaked(7).astype(np.float32)
    out = _processed(0.8, 0.9, None, z)
    w = np.exp(out - out.max())
    got = {int(i): float(w[i] / w.sum()) for i in np.flatnonzero(w > 0)}
    assert got == pytest.approx(direct_p(z.astype(np.float64), 0.8, 0.9), rel=1e-5)
