"""Figures of a whole local answer, for the cascade's "answer" judge (router stage 2).

The first eight answer tokens of a step-by-step solution or of a function are the start of the
working or boilerplate ("To solve this...", "```python\\ndef"): they say little about whether the
answer is right (on gsm8k, AUC 0.50 for every first-token figure). Under `complete()` the cascade
may write the whole local answer first and judge it (`cascade_judge = "answer"`); these are the
figures that only a whole answer has, beside the log-probability summary over all its tokens:

- `answer_len`: log(1 + the answer's tokens), the end-of-generation token not counted.
- `answer_ended`: 1 if the model ended the answer itself, 0 if `max_tokens` cut it (a looping
  or runaway answer).
- `tail_lp_mean`, `tail_lp_min`: the log-probabilities of the answer's last `TAIL` tokens, the
  end token not counted: where a solution states its result.
- `repeat_share`: the share of the answer's token 4-grams that already occurred in it (loops).

The labeller (`scripts/label_local_signals.py --whole`) reads the labelled local answers through
the model and computes them here, and the cascade computes them here from the answer it decoded,
so stage 2's "answer" models see at run time what they were trained on. Pure numpy, no model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

TAIL = 8
GRAM = 4
ANSWER_NAMES = ("answer_len", "answer_ended", "tail_lp_mean", "tail_lp_min", "repeat_share")


def whole_figures(
    tokens: Sequence[int] | None, logprobs: Sequence[float], ended: bool
) -> dict[str, float]:
    """The `ANSWER_NAMES` figures of an answer: its token ids and their log-probabilities
    (both hold the end-of-generation token last when `ended`); without the ids (None),
    `repeat_share` is NaN."""
    if tokens is not None and len(tokens) != len(logprobs):
        raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} log-probabilities")
    n = max(len(logprobs) - 1, 0) if ended else len(logprobs)  # the end token not counted
    lps = np.asarray(list(logprobs[:n]), dtype=np.float64)
    out = dict.fromkeys(ANSWER_NAMES, math.nan)
    out["answer_len"] = math.log1p(n)
    out["answer_ended"] = 1.0 if ended else 0.0
    if lps.size:
        tail = lps[-TAIL:]
        out["tail_lp_mean"] = float(tail.mean())
        out["tail_lp_min"] = float(tail.min())
    if tokens is not None:
        out["repeat_share"] = repeat_share(list(tokens[:n]))
    return out


def repeat_share(tokens: Sequence[int], n: int = GRAM) -> float:
    """The share of the `n`-grams of `tokens` that occurred earlier in them (0 for fewer than
    two n-grams)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < 2:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    again = 0
    for g in grams:
        again += g in seen
        seen.add(g)
    return again / len(grams)
