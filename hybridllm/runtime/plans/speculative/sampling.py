"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the rule that keeps the
cloud's sampling distribution above temperature 0, and the cloud's distribution it needs, exactly.

The distributions. Both sides sample from the same processing of the model's logits z: the
request's temperature T, then its top_p nucleus (`engines.nucleus`, where `Dist` lives: the
local engine's drafter builds q there, and the served model samples there).

- Locally (`engines.nucleus.nucleus_of_logits`) the whole vocabulary is at hand: q is exact.
- The cloud answers with its top N raw log-probabilities l_i = z_i - logsumexp(z) per position
  (vLLM's default `--logprobs-mode raw_logprobs`; N at most its `--max-logprobs`, 20 by
  default; hybridllm serve-model the same). Tempering them is exact up to a constant:
  softmax(z / T)_i is proportional to exp(l_i / T). What is unknown is the rest of the
  vocabulary, the tail, of raw mass R = 1 - sum(exp(l_i)), each of its tokens at most
  m = exp(l_N). Its tempered weight S = sum_tail exp(l_j / T) is bounded with a = 1 / T:
  a >= 1: x^a <= x * m^(a - 1), so S <= R * m^(a - 1);
  a < 1: x^a is concave, so S is largest spread evenly over the V - N tail tokens:
  S <= (V - N)^(1 - a) * R^a (V: the vocabulary size).
  The tempered normaliser is therefore Z in [Z_top, Z_top + S_max]. The nucleus ends at the
  first k whose cumulative weight reaches top_p * Z; that index grows with Z, so when it is the
  same k at both ends of the interval (and k <= N), the nucleus is exactly the top k tokens and
  p restricted to it, renormalised over them, is exact: Z no longer enters. Otherwise
  (`nucleus_of_top` returns the reason) p is not known at that position and the plan must not
  guess: it commits what was decided before that position and streams plainly. With top_p = 1
  the support is the whole vocabulary, never covered by N entries: such requests do not
  speculate. R is raised by 1e-6 against the float32 rounding of the returned values, which
  only makes the check stricter.

The rule (`accept`). A drafted token x ~ q is kept with probability min(1, p(x) / q(x));
otherwise the token is drawn from norm(max(0, p - q)). Either way the position's token is
distributed as p. When every drafted token is kept, the next token (the bonus token) is the
cloud's own draw at the position after the draft, so every round commits at least one token;
its sampler must be p's processing (temperature and top_p only: vLLM's defaults, and
hybridllm serve-model's `/v1/completions`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import numpy as np

from hybridllm.engines.nucleus import Dist, nucleus_end, sample

_FLOAT_SLACK = 1e-6  # raw tail mass added against float32 rounding of returned logprobs


def nucleus_of_top(
    top: Iterable[tuple[int, float]], temperature: float, top_p: float, vocab: int
) -> Dist | str:
    """The cloud's distribution p from its top N raw log-probabilities at one position, or why
    it is not determined by them (see the module for the bound on the unknown tail)."""
    pairs = sorted(dict(top).items(), key=lambda kv: -kv[1])
    if not pairs:
        return "no log-probabilities for this position"
    if top_p >= 1.0:
        return "top_p = 1: the distribution covers the whole vocabulary"
    ids = np.array([t for t, _ in pairs], dtype=np.int64)
    lp = np.array([v for _, v in pairs], dtype=np.float64)
    a = 1.0 / temperature
    raw_tail = max(0.0, 1.0 - float(np.exp(lp).sum())) + _FLOAT_SLACK
    n_tail = max(0, vocab - len(pairs))
    if n_tail == 0:
        log_s = -math.inf
    elif a >= 1.0:
        log_s = math.log(raw_tail) + (a - 1.0) * float(lp[-1]) - a * float(lp[0])
    else:
        log_s = (1.0 - a) * math.log(n_tail) + a * math.log(raw_tail) - a * float(lp[0])
    w = np.exp(a * (lp - lp[0]))
    cum = np.cumsum(w)
    z_lo = float(cum[-1])
    z_hi = z_lo + math.exp(log_s) if log_s > -math.inf else z_lo
    lo, hi = nucleus_end(cum, top_p * z_lo), nucleus_end(cum, top_p * z_hi)
    if hi is None:
        share = z_lo / z_hi
        return (
            f"the nucleus (top_p {top_p:g}) is not inside the {len(pairs)} returned tokens "
            f"(they hold at least {share:.3f} of the tempered mass)"
        )
    if lo != hi:
        return "the nucleus boundary depends on the mass outside the returned tokens"
    return Dist(ids[: hi + 1], w[: hi + 1] / float(cum[hi]))


def accept(p: Dist, q: Dist, x: int, rng: random.Random) -> int | None:
    """None when the drafted `x` (drawn from q) is kept, else the token drawn in its place
    from norm(max(0, p - q)): either way the position's token is distributed as p."""
    px, qx = p.prob(x), q.prob(x)
    if qx <= 0.0:
        raise ValueError(f"token {x} was drafted but has no probability under the draft")
    if rng.random() < min(1.0, px / qx):
        return None
    q_on_p = np.array([q.prob(int(t)) for t in p.ids], dtype=np.float64)
    residual = np.maximum(0.0, p.probs - q_on_p)
    if float(residual.sum()) <= 0.0:  # p <= q everywhere on p's support: only by rounding
        return sample(p, rng)
    return sample(Dist(p.ids, residual / residual.sum()), rng)
