"""llguidance (guidance-ai's grammar engine) as a llama-cpp-python logits processor, for
bench_grammar's comparison arms (issue 45: "try llguidance against llama.cpp's grammars on the
same schemas; choose by figures"). Not used by the package: `pip install llguidance` to run it.

The grammar is the engine's own GBNF (the session's call or answer grammar), converted to
llguidance's Lark form by llguidance's converter, so every arm checks the same language. Two ways:
- "mask": llguidance's token mask over the whole vocabulary at every step (what it is built for:
  the mask is computed over a token trie, not token by token), applied to the logits;
- "first": the model's first choice checked alone (`validate_tokens`), the mask only when it is
  refused (greedy decoding only; `CheckedGrammar`'s way with llguidance's checker).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np


class LLGuidanceGrammar:
    """A processor applying `grammar` (GBNF) with llguidance; `tokenizer` from `tokenizer()`."""

    def __init__(
        self, tokenizer: Any, grammar: str, *, way: Literal["mask", "first"], start: int
    ) -> None:
        import llguidance

        self._matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("gbnf", grammar))
        if self._matcher.is_error():
            raise ValueError(f"llguidance refused the grammar: {self._matcher.get_error()}")
        self._way, self._seen = way, start
        self._mask = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        self.steps = self.masks = 0

    def __call__(self, input_ids: Any, scores: np.ndarray) -> np.ndarray:
        for tok in input_ids[self._seen :]:
            if not self._matcher.consume_token(int(tok)):
                raise ValueError(f"llguidance refused a sampled token: {self._matcher.get_error()}")
        self._seen = len(input_ids)
        self.steps += 1
        if self._way == "first":
            best = int(np.argmax(scores))
            if self._matcher.validate_tokens([best]) == 1:
                out = np.full_like(scores, -np.inf)
                out[best] = scores[best]
                return out
        self.masks += 1
        self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        bits = np.unpackbits(self._mask.view(np.uint8), bitorder="little")[: len(scores)]
        return np.where(bits.astype(bool), scores, -np.inf).astype(scores.dtype, copy=False)


def tokenizer(lc: Any, vocab: Any) -> Any:
    """llguidance's tokenizer over a llama.cpp vocabulary (about a second: build it once), with
    every end-of-generation token as its end."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    n = lc.llama_vocab_n_tokens(vocab)
    ends = [t for t in range(n) if lc.llama_vocab_is_eog(vocab, t)]
    return lltokenizer_from_vocab(vocab, eos_token=ends)
