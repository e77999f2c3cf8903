"""A grammar checked where it decides, not over the whole vocabulary at every step.

llama.cpp's grammar sampler (`Llama.generate(grammar=...)`) checks every token of the vocabulary
(152k for Qwen) against the grammar's stacks at each step: 1.7-2x a plain token's time here
(docs/tools.md). The token the sampler keeps is almost always among the few the model ranks
highest, so `CheckedGrammar`, a logits processor run last, checks those first, as upstream
llama.cpp's own sampler does (sample, then check; the whole vocabulary only when refused):

- greedy decoding: the model's first choice, if the grammar allows it; else the first allowed of
  its `top_k` best; else the whole vocabulary. The same token as the grammar applied first.
- sampling: the `top_k` best are checked; the allowed ones are kept if no token outside them
  could pass the sampler's `min_p` cut (the k-th best logit lies below the best allowed one's
  less ln(1/min_p)); else the whole vocabulary. The kept set is then the grammar-first one,
  except where tokens below `min_p`'s cut would move `top_p`'s boundary by their share.

The processor feeds the grammar each token the loop sampled (it reads them from `input_ids` on
its next call), so its state follows the generation as llama.cpp's own sampler's does; a
generation resumed mid-phase (after a preemption) feeds it the phase's tokens already written.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from typing import Any

import numpy as np

from hybridllm import errors

__all__ = ["CheckedGrammar"]

_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class CheckedGrammar:
    """A llama-cpp-python logits processor applying `grammar` (GBNF, rule `root`) to the
    tokens that can be chosen. `lc` is the `llama_cpp` module, `vocab` the model's vocabulary."""

    def __init__(
        self,
        lc: Any,
        vocab: Any,
        grammar: str,
        *,
        greedy: bool,
        top_k: int,
        min_p: float,
        start: int | None = None,
    ) -> None:
        """`start`: where the grammar's text begins in the sequence the processor will see (a
        resumed generation's phase began before it: those tokens are fed to the grammar first);
        None: at the end of the sequence on the first call."""
        self._lc = lc
        self._sampler = lc.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not self._sampler:
            # (the request's grammars were parsed at admission: `LlamaSession.plan`)
            raise errors.LocalEngineError("llama.cpp refused the grammar", engine="local")
        self._greedy, self._k = greedy, max(1, top_k)
        self._floor = math.log(min_p) if 0.0 < min_p < 1.0 else -math.inf
        self._seen: int | None = start
        self.steps = self.whole = 0  # steps checked; those that needed the whole vocabulary

    def __del__(self) -> None:
        sampler, self._sampler = getattr(self, "_sampler", None), None
        if sampler:
            with contextlib.suppress(Exception):  # at interpreter exit the module may be gone
                self._lc.llama_sampler_free(sampler)

    def __call__(self, input_ids: Any, scores: np.ndarray) -> np.ndarray:
        self._accept(input_ids)
        self.steps += 1
        kept = self._first_choice(scores) if self._greedy else None
        if kept is None:
            kept = self._among_best(scores)
        if kept is None:
            self.whole += 1
            return self._apply_all(scores)
        out = np.full_like(scores, -np.inf)
        out[kept] = scores[kept]
        return out

    def _accept(self, input_ids: Any) -> None:
        """Feed the grammar the tokens sampled since the last call."""
        n = len(input_ids)
        if self._seen is not None:
            for tok in input_ids[self._seen : n]:
                self._lc.llama_sampler_accept(self._sampler, int(tok))
        self._seen = n

    def _first_choice(self, scores: np.ndarray) -> np.ndarray | None:
        best = int(np.argmax(scores))
        allowed = self._allowed(np.array([best], dtype=np.intc), scores)
        return allowed if len(allowed) else None

    def _among_best(self, scores: np.ndarray) -> np.ndarray | None:
        k = min(self._k, len(scores))
        top = np.argpartition(scores, -k)[-k:]
        top = top[np.argsort(scores[top])[::-1]].astype(np.intc)
        allowed = self._allowed(top, scores)
        if not len(allowed) or not np.isfinite(scores[allowed[0]]):
            return None
        if self._greedy:
            return allowed[:1]
        if k < len(scores) and scores[top[-1]] >= scores[allowed[0]] + self._floor:
            return None  # a token outside the k best could still pass min_p
        return allowed

    def _allowed(self, ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """The tokens of `ids` (best first) the grammar allows now, in the same order."""
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"], data["logit"] = ids, scores[ids]
        self._apply(data)
        kept: np.ndarray = ids[np.isfinite(data["logit"])]
        return kept

    def _apply_all(self, scores: np.ndarray) -> np.ndarray:
        data = np.zeros(len(scores), dtype=_TOKEN_DATA)
        data["id"], data["logit"] = np.arange(len(scores), dtype=np.intc), scores
        self._apply(data)
        out: np.ndarray = data["logit"].astype(scores.dtype, copy=False)
        return out

    def _apply(self, data: np.ndarray) -> None:
        lc = self._lc
        arr = lc.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)),
            size=len(data),
            selected=-1,
            sorted=False,
        )
        lc.llama_sampler_apply(self._sampler, ctypes.byref(arr))
