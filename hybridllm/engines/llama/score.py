"""Prompt scoring on a loaded `llama_cpp.Llama`: one forward pass, the KV prefix reused.

`Scorer.score(tokens)` evaluates the part of `tokens` that is not cached yet in llama.cpp
batches that ask for logits at every evaluated position (only the new suffix: the context is
not made with `logits_all`, so plain decoding keeps its one-row output buffer). Each logits row
is reduced at once with numpy, vectorised over the rows of a batch: the log-softmax normaliser,
the top `TOP_K` ids by `argpartition` (never a full sort of the vocabulary), and the logprob and
1-based rank of the token that actually comes next. Nothing is detokenized here.

Rows are kept, per position, for the token sequence last scored (`TOP_K` floats and ids each),
so a verification loop that re-sends the prompt, the committed text and a new draft pays for
the new suffix only: the KV cache keeps the longest common prefix. The first new token's
logprob and rank come from the kept top entries of the last shared position when it is among
them (a greedy verifier's own next token always is); otherwise that position is evaluated
again for its full distribution.

Runs on the llama thread only, like everything that touches the model (`engines/llama/thread.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

TOP_K = 20  # vLLM's default max_logprobs: the most top entries a request may ask for
_ROWS = 32  # rows reduced at once (a 152k vocabulary: 19 MB of float32 temporaries)


@dataclass(frozen=True)
class Scores:
    """The scores of one token sequence of length n.

    Position p (1 <= p < n): `logprob[p]`, `rank[p]`: tokens[p] under the model given tokens[:p];
    `top_ids[p - 1]`, `top_logprobs[p - 1]`: that distribution's best `TOP_K`, best first. Row
    n - 1 of the top arrays is the distribution after the whole sequence (the next token).
    `evaluated`: tokens run through the model for this call; `reused`: positions taken from the
    KV cache."""

    logprob: npt.NDArray[np.float32]
    rank: npt.NDArray[np.int64]
    top_ids: npt.NDArray[np.int64]
    top_logprobs: npt.NDArray[np.float32]
    evaluated: int
    reused: int


def _common_prefix(a: Any, b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


class Scorer:
    """Per-position scores for the Llama `llm`, cached for the last sequence scored."""

    def __init__(self, llm: Any, top_k: int = TOP_K) -> None:
        self.llm = llm
        self.top_k = top_k
        n = llm.n_ctx() + 1
        self._tokens: list[int] = []
        self._logprob = np.full(n, np.nan, dtype=np.float32)
        self._rank = np.zeros(n, dtype=np.int64)
        self._top_ids = np.zeros((n, top_k), dtype=np.int64)
        self._top_lp = np.zeros((n, top_k), dtype=np.float32)
        self.evaluated_total = 0
        self.reused_total = 0

    def score(self, tokens: list[int]) -> Scores:
        """Score `tokens` (at least one), evaluating only what the caches do not hold."""
        llm = self.llm
        n = len(tokens)
        kv = _common_prefix(llm.input_ids[: llm.n_tokens], tokens)
        cached = _common_prefix(self._tokens, tokens)
        start = max(0, min(cached - 1, kv))  # re-run the last shared position, unless
        if 0 < cached < n and kv >= cached:  # the next token is among its kept top entries
            hit = np.flatnonzero(self._top_ids[cached - 1] == tokens[cached])
            if hit.size:
                self._logprob[cached] = self._top_lp[cached - 1, hit[0]]
                self._rank[cached] = hit[0] + 1
                start = cached
        if start == 0 or not llm._ctx.kv_cache_seq_rm(-1, start, -1):
            start = 0
            llm.reset()
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        llm.n_tokens = start
        llm._requires_eval = True  # Llama.generate() must not sample from our last batch
        del self._tokens[start:]
        for i in range(start, n, llm.n_batch):
            self._eval(tokens, i, min(n, i + llm.n_batch))
        self.evaluated_total += n - start
        self.reused_total += start
        return Scores(
            logprob=self._logprob[:n].copy(),
            rank=self._rank[:n].copy(),
            top_ids=self._top_ids[:n].copy(),
            top_logprobs=self._top_lp[:n].copy(),
            evaluated=n - start,
            reused=start,
        )

    def forget(self) -> None:
        """Drop the cached rows (after an abort left the KV cache short of them)."""
        self._tokens.clear()

    def _eval(self, tokens: list[int], lo: int, hi: int) -> None:
        llm = self.llm
        batch = tokens[lo:hi]
        llm._batch.set_batch(batch=batch, n_past=lo, logits_all=True)
        llm._ctx.decode(llm._batch)  # RuntimeError when aborted: the caller cleans up
        llm.input_ids[lo:hi] = batch
        llm.n_tokens = hi
        vocab = llm.n_vocab()
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(batch) * vocab,))
        logits = logits.reshape(len(batch), vocab)
        nxt = np.asarray(tokens[lo + 1 : hi + 1], dtype=np.int64)  # the token after each row
        for r0 in range(0, len(batch), _ROWS):
            self._reduce(logits[r0 : r0 + _ROWS], lo + r0, nxt[r0 : r0 + _ROWS])
        self._tokens.extend(batch)

    def _reduce(self, rows: npt.NDArray[np.float32], pos: int, nxt: npt.NDArray[np.int64]) -> None:
        """Rows for positions pos.. (each the distribution after tokens[:pos + i + 1])."""
        m = rows.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True))).astype(np.float32)
        k = min(self.top_k, rows.shape[1])
        part = np.argpartition(rows, rows.shape[1] - k, axis=1)[:, -k:]
        vals = np.take_along_axis(rows, part, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        end = pos + rows.shape[0]
        self._top_ids[pos:end, :k] = np.take_along_axis(part, order, axis=1)
        self._top_lp[pos:end, :k] = np.take_along_axis(vals, order, axis=1) - lse
        if nxt.size:  # the last row of the sequence has no next token
            j = np.arange(nxt.size)
            x = rows[j, nxt]
            self._logprob[pos + 1 : pos + 1 + nxt.size] = x - lse[j, 0]
            self._rank[pos + 1 : pos + 1 + nxt.size] = 1 + (rows[: nxt.size] > x[:, None]).sum(
                axis=1
            )
