"""Prompt-lookup speculative decoding for greedy requests, driven token by token.

llama-cpp-python's `Llama.generate(draft_model=LlamaPromptLookupDecoding())` needs
`logits_all=True` (a float per vocabulary entry for every context position) and runs its own
loop; `LlamaSession` drives decoding itself, so this does the same verification in a small loop:

1. draft up to `max_draft` tokens: find the latest 3- (else 2-) token suffix of the prompt and
   output earlier in them and propose what followed it (prompt lookup, as
   `LlamaPromptLookupDecoding`, without its 1-token matches that are rarely right);
2. evaluate the pending token and the draft in one batch, asking for logits at every position;
3. accept the longest prefix of the draft that equals the greedy argmax, plus the model's own
   next token after it; drop the rejected positions from the KV cache.

On a CPU a batch of a few tokens costs little more than one (decode reads every weight once
either way), so each accepted draft token is nearly free. The draft length adapts: it grows
while drafts are accepted and shrinks (to nothing for a while) while they are not, so free text
with nothing to copy pays little.

Exactness: every emitted token is the argmax at its position, as in plain greedy decoding, but a
batch computes logits in another order than a one-token step (float rounding), so a near-tie
could flip. Where the top two logits are closer than `TIE_MARGIN`, the token is recomputed by a
one-token step, as plain decoding would; outputs then matched plain greedy decoding in every test
and benchmark prompt (not a proof: the KV entries of drafted tokens also come from batches).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hybridllm.local import loader

DraftMode = Literal["prompt-lookup"]


@dataclass
class DraftStats:
    """Totals over finished drafted generations: verification batches, tokens drafted, drafted
    tokens accepted."""

    batches: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, batches: int, drafted: int, accepted: int) -> None:
        self.batches += batches
        self.drafted += drafted
        self.accepted += accepted


TIE_MARGIN = 0.5  # logits; below this gap a batch's argmax is re-checked by a one-token step


def lookup(history: list[int], *, max_ngram: int = 3, min_ngram: int = 2, limit: int) -> list[int]:
    """Tokens that followed the earliest earlier occurrence of the longest suffix n-gram."""
    if limit <= 0:
        return []
    arr = np.asarray(history, dtype=np.intc)
    n_hist = len(arr)
    for n in range(min(max_ngram, n_hist - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.nonzero(np.all(windows == arr[-n:], axis=1))[0]
        for start in hits:
            follow = arr[start + n : start + n + limit]
            if len(follow):
                return [int(t) for t in follow]
    return []


class PromptLookup:
    """Greedy decoding with prompt-lookup drafts on a `llama_cpp.Llama` whose KV cache holds all
    of `tokens` but the last one. Runs on the llama thread."""

    def __init__(self, llm: Any, tokens: list[int], *, max_draft: int = 10) -> None:
        self._llm = llm
        self._get_logits = loader.llama_cpp().llama_get_logits
        self.max_draft = max_draft
        self._draft_len = max_draft
        self._cooldown = 0  # steps without drafting after repeated misses
        self.history = list(tokens)  # prompt + emitted tokens
        self._pending = tokens[-1]  # emitted (or last of the prompt), not yet in the KV cache
        self._ready: deque[int] = deque()  # verified tokens not yet handed out
        # observability for benchmarks
        self.batches = 0
        self.drafted = 0
        self.accepted = 0

    def next_token(self, *, max_draft: int) -> int:
        """The next greedy token; evaluates a batch only when no verified token is waiting.
        Raises RuntimeError if llama_decode fails (or is aborted)."""
        if self._ready:
            return self._ready.popleft()
        draft: list[int] = []
        if self._cooldown > 0:
            self._cooldown -= 1
        else:
            draft = lookup(self.history, limit=min(max_draft, self._draft_len))
        out = self._verify(draft)
        self._adapt(len(draft), len(out) - 1)
        self.history.extend(out)
        self._pending = out[-1]
        self._ready.extend(out[1:])
        return out[0]

    def _adapt(self, drafted: int, accepted: int) -> None:
        if not drafted:
            return
        if accepted == drafted:
            self._draft_len = min(self.max_draft, self._draft_len + 2)
        elif accepted == 0:
            self._draft_len = max(1, self._draft_len // 2)
            if self._draft_len == 1:
                self._cooldown = 4

    def _decode(self, batch: list[int], n_past: int) -> Any:
        llm = self._llm
        llm._batch.set_batch(batch, n_past=n_past, logits_all=True)
        llm._ctx.decode(llm._batch)
        llm.input_ids[n_past : n_past + len(batch)] = batch
        return np.ctypeslib.as_array(self._get_logits(llm.ctx), shape=(len(batch), llm.n_vocab()))

    def _verify(self, draft: list[int]) -> list[int]:
        llm = self._llm
        batch = [self._pending, *draft]
        n_past = llm.n_tokens
        logits = self._decode(batch, n_past)
        top2 = np.partition(logits, -2, axis=1)[:, -2:]
        sure = (top2[:, 1] - top2[:, 0]) >= TIE_MARGIN
        best = [int(t) for t in logits.argmax(axis=1)]
        n = 0
        while n < len(draft) and draft[n] == best[n] and sure[n]:
            n += 1
        if not sure[n]:  # a near-tie at the token to emit: decide it as plain decoding would
            if n == 0 and len(batch) > 1:
                llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
                best[0] = int(self._decode(batch[:1], n_past)[0].argmax())
            elif n > 0:  # emit what was sure; the next call re-checks this position
                n -= 1
        keep = n_past + n + 1  # the pending token and the accepted draft tokens
        llm.n_tokens = keep
        if keep < n_past + len(batch):
            llm._ctx.kv_cache_seq_rm(-1, keep, -1)
        self.batches += 1
        self.drafted += len(draft)
        self.accepted += n
        return best[: n + 1]
