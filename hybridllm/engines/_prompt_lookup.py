"""Prompt-lookup speculative decoding for greedy requests, driven token by token.

llama-cpp-python's `Llama.generate(draft_model=...)` needs `logits_all=True` (a float per
vocabulary entry for every context position) and runs its own loop; `LlamaSession` drives
decoding itself, so this does the same verification in a small loop of its own:

1. draft up to `num_pred_tokens` tokens by n-gram lookup in the prompt and the output so far
   (`LlamaPromptLookupDecoding.find_candidate_pred_tokens`, the same lookup llama-cpp-python uses);
2. evaluate the pending token and the draft in one batch, asking for logits at every position;
3. accept the longest prefix of the draft that equals the greedy argmax, plus the model's own
   next token after it; drop the rejected positions from the KV cache.

Every emitted token is the argmax at its position, as in plain greedy decoding; on a CPU a batch
of a few tokens costs little more than one (decode reads every weight once either way), so each
accepted draft token is nearly free.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

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


class PromptLookup:
    """Greedy decoding with prompt-lookup drafts on a `llama_cpp.Llama` whose KV cache holds all
    of `tokens` but the last one. Runs on the llama thread."""

    def __init__(
        self, llm: Any, tokens: list[int], *, max_ngram_size: int = 3, num_pred_tokens: int = 10
    ) -> None:
        from llama_cpp import llama_get_logits
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self._llm = llm
        self._find = LlamaPromptLookupDecoding.find_candidate_pred_tokens
        self._get_logits = llama_get_logits
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens
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
        draft = self._draft(max(0, min(max_draft, self.num_pred_tokens)))
        out = self._verify(draft)
        self.history.extend(out)
        self._pending = out[-1]
        self._ready.extend(out[1:])
        return out[0]

    def _draft(self, limit: int) -> list[int]:
        if limit <= 0:
            return []
        found = self._find(
            np.asarray(self.history, dtype=np.intc), self.max_ngram_size, self.num_pred_tokens
        )
        return [int(t) for t in found[:limit]]

    def _verify(self, draft: list[int]) -> list[int]:
        llm = self._llm
        batch = [self._pending, *draft]
        n_past = llm.n_tokens
        llm._batch.set_batch(batch, n_past=n_past, logits_all=True)
        llm._ctx.decode(llm._batch)
        llm.input_ids[n_past : n_past + len(batch)] = batch
        logits = np.ctypeslib.as_array(self._get_logits(llm.ctx), shape=(len(batch), llm.n_vocab()))
        best = [int(t) for t in logits.argmax(axis=1)]
        n = 0
        while n < len(draft) and draft[n] == best[n]:
            n += 1
        keep = n_past + n + 1  # the pending token and the accepted draft tokens
        llm.n_tokens = keep
        if keep < n_past + len(batch):
            llm._ctx.kv_cache_seq_rm(-1, keep, -1)
        self.batches += 1
        self.drafted += len(draft)
        self.accepted += n
        return best[: n + 1]
