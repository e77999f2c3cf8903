"""Does the local model pick the same option wherever it stands? (router stage 2)

A small model that does not know a multiple-choice answer picks a letter, not an answer:
Qwen2.5-Coder-0.5B answered "D" 42 times in 1,100 labelled prompts, and was right on 4% of the
prompts whose answer is D. Its option-letter probability (`option_p`) cannot tell that bias from
knowledge; moving the options can. Each rotation moves every option one place down (the last to
the top) and keeps the letters in place; the option-letter distribution after that prompt's
prefill is read back onto the options. Over a whole cycle every option stands once at every
letter, so the letter bias averages out (Zheng et al. 2024, "Large language models are not
robust multiple choice selectors", debias by permutation).

The figures (NaN for a prompt that is not multiple choice):
- `perm_agree`: the share of rotations whose most likely option is the original order's choice.
- `perm_p`: the probability of the original choice, averaged over the original order and the
  rotations.
- `perm_margin`: that average minus the largest average of any other option.

Only the options and what follows them are prefilled again: the question stays in the KV cache.
Synchronous, on the llama thread, like `signals`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

PERM_NAMES = ("perm_agree", "perm_p", "perm_margin")
_OPTION = re.compile(r"^([A-H])\. (.*)$")


def rotations(text: str, letters: Sequence[str], n: int) -> list[tuple[str, list[int]]]:
    """Up to `n` rotations of the options of `text`: (prompt, order), where order[i] is the
    original index of the option now at letter i. [] when the options are not one line each."""
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if _OPTION.match(line)]
    k = len(letters)
    if len(at) != k or at != list(range(at[0], at[0] + k)):
        return []
    contents = [_OPTION.match(lines[i]).group(2) for i in at]  # type: ignore[union-attr]
    out = []
    for r in range(1, min(n, k - 1) + 1):
        order = [(i - r) % k for i in range(k)]
        moved = [f"{letters[i]}. {contents[order[i]]}" for i in range(k)]
        out.append(("\n".join(lines[: at[0]] + moved + lines[at[-1] + 1 :]), order))
    return out


def option_distribution(logits: Any, ids: Sequence[int]) -> list[float]:
    """The option letters' probabilities from a position's logits, normalised over `ids`."""
    x = np.asarray(logits)[list(ids)].astype(np.float64)
    e = np.exp(x - x.max())
    return [float(v) for v in e / e.sum()]


def summarise(original: Sequence[float], rotated: Sequence[Sequence[float]]) -> dict[str, float]:
    """`PERM_NAMES` from the original order's option probabilities and each rotation's, both
    indexed by the original options."""
    nan = float("nan")
    if not original or not rotated:
        return dict.fromkeys(PERM_NAMES, nan)
    choice = int(np.argmax(original))
    probs = np.array([list(original), *[list(r) for r in rotated]], dtype=np.float64)
    mean = probs.mean(axis=0)
    others = np.delete(mean, choice)
    return {
        "perm_agree": float(np.mean([int(np.argmax(r)) == choice for r in rotated])),
        "perm_p": float(mean[choice]),
        "perm_margin": float(mean[choice] - others.max()),
    }


def back_to_original(probs: Sequence[float], order: Sequence[int]) -> list[float]:
    """A rotation's probabilities (by letter) indexed by the original options."""
    out = [0.0] * len(order)
    for i, j in enumerate(order):
        out[j] = probs[i]
    return out
