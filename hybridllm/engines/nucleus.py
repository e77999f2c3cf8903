"""The distribution a model samples from: its logits at the request's temperature T, then its
top_p (the nucleus: tokens by decreasing probability up to and including the first at which the
cumulative probability reaches top_p, renormalised; the llama.cpp and vLLM rule). `Dist` is such
a distribution over its support; `nucleus_of_logits` makes it exactly from a whole vocabulary's
logits; `sample` draws from it.

Shared by the engines (the local drafter's q, `_llama_draft`; the served model's sampler,
`served`) and the speculative plan's sampling rule (`runtime.plans.speculative.sampling`, which
builds the cloud's p from its top N log-probabilities and keeps or replaces drafted tokens):
it lives here, below both rooms, so that the engines need not import the runtime.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

_CANDIDATES = 256  # local nucleus: try the best this many before sorting the whole vocabulary


@dataclass(frozen=True)
class Dist:
    """A distribution over `ids` (probabilities `probs`, summing to 1, best first)."""

    ids: npt.NDArray[np.int64]
    probs: npt.NDArray[np.float64]

    def prob(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0


def nucleus_end(cum: npt.NDArray[np.float64], target: float) -> int | None:
    """The nucleus's last index: the first whose cumulative weight reaches `target` (None:
    none does)."""
    hit = np.flatnonzero(cum >= target)
    return int(hit[0]) if hit.size else None


def nucleus_of_logits(logits: Any, temperature: float, top_p: float) -> Dist:
    """The local distribution q: softmax(logits / T), then the top_p nucleus (exact)."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max()
    w = np.exp(z)
    total = float(w.sum())
    n = min(_CANDIDATES, w.size)
    part = np.argpartition(-w, n - 1)[:n] if n < w.size else np.arange(w.size)
    order = part[np.argsort(-w[part], kind="stable")]
    cum = np.cumsum(w[order])
    end = nucleus_end(cum, top_p * total) if top_p < 1.0 else None
    if end is None:  # the nucleus reaches past the candidates (or top_p = 1): sort it all
        order = np.argsort(-w, kind="stable")
        cum = np.cumsum(w[order])
        end = nucleus_end(cum, top_p * total) if top_p < 1.0 else w.size - 1
        end = w.size - 1 if end is None else end
    ids = order[: end + 1].astype(np.int64)
    return Dist(ids, w[ids] / float(cum[end]))


def sample(dist: Dist, rng: random.Random) -> int:
    """One token drawn from `dist`."""
    cum = np.cumsum(dist.probs)
    i = int(np.searchsorted(cum, rng.random() * float(cum[-1]), side="right"))
    return int(dist.ids[min(i, len(dist.ids) - 1)])
