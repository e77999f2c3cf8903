"""Saved KV states of past prompts, in RAM, so that conversations stay warm (issue 28).

The local engine has one llama.cpp context and so one live KV cache: a prompt that does not
extend what it holds (another conversation, a side question) used to overwrite it, and the
next turn of the first conversation prefilled its whole history again. Now, before the live
state is cut, the session copies its sequence out (`llama_state_seq_get_data`: the KV cells
only, about 12 KB per token for Qwen 0.5B) into this store; a later prompt that shares a longer
prefix with a saved state than with the live one has it copied back (`..._set_data`) and
prefills only the rest. A conversation is found by its tokens, so the app passes no id.

An app that does pass one (`conversation=`) says what it knows: a state tagged with that key
is the conversation's one current state. Saving a newer one replaces it even where the newer
one does not extend it (the app rewrote or trimmed the history, or regenerated an answer: the
old state would only take memory), it wins a tie of equal prefixes, and `forget(key)` drops
it when the app closes the conversation.

Memory is bounded by `budget_bytes`. When a new state does not fit, states are evicted by
value: the tokens a miss would prefill again, divided by the seconds since the state was last
used (least recently used, weighted by what losing it costs). A state whose tokens are a prefix
of a newer one's is dropped: the newer one serves it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

DEFAULT_BUDGET_BYTES = 512 * 1024 * 1024  # about 40,000 tokens of Qwen 0.5B's KV: a laptop's share
# a saved or restored state must be worth at least this many tokens of prefill: about 80 ms
# on 2 cores, against a copy of a few ms (a conversation's first turn, a question and a short
# answer, is about 60 tokens past a shared system prompt)
MIN_TOKENS = 16


@dataclass(slots=True, eq=False)
class SavedState:
    """One sequence's KV state: the tokens it holds, and llama.cpp's bytes for it."""

    tokens: npt.NDArray[np.int32]
    data: bytearray
    used: float = field(default_factory=time.monotonic)
    conversation: str | None = None  # the app's key for it (None: found by content only)

    @property
    def nbytes(self) -> int:
        return len(self.data)


Tokens = Sequence[int] | npt.NDArray[np.int32]


def common_prefix(a: Tokens, b: Tokens) -> int:
    """How many leading tokens `a` and `b` share (numpy: a long history costs microseconds)."""
    m = min(len(a), len(b))
    differ = np.asarray(a[:m], dtype=np.int32) != np.asarray(b[:m], dtype=np.int32)
    return int(differ.argmax()) if differ.any() else m


class KVStore:
    """The saved states, bounded by `budget_bytes` (see the module)."""

    def __init__(
        self,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        *,
        min_tokens: int = MIN_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_bytes, self.min_tokens, self._clock = budget_bytes, min_tokens, clock
        self.states: list[SavedState] = []
        self.hits = self.misses = self.evicted = 0

    @property
    def bytes_used(self) -> int:
        return sum(s.nbytes for s in self.states)

    def find(
        self, tokens: Tokens, conversation: str | None = None
    ) -> tuple[SavedState, int] | None:
        """The saved state sharing the longest prefix with `tokens`, and that length (None:
        none shares `min_tokens`); of equal prefixes, the one tagged `conversation`."""
        best: tuple[SavedState, int] | None = None
        for state in self.states:
            n = common_prefix(state.tokens, tokens)
            if n < self.min_tokens or (best is not None and n < best[1]):
                continue
            tagged = conversation is not None and state.conversation == conversation
            if best is None or n > best[1] or tagged:
                best = (state, n)
        return best

    def used(self, state: SavedState) -> None:
        state.used = self._clock()
        self.hits += 1

    def put(self, tokens: Tokens, data: bytearray, conversation: str | None = None) -> bool:
        """Keep a state, tagged with the app's `conversation` key if it gave one; it replaces
        the states it extends and that conversation's last one (False: too short, or larger
        than the whole budget)."""
        if len(tokens) < self.min_tokens or len(data) > self.budget_bytes:
            return False
        new = SavedState(np.array(tokens, dtype=np.int32), data, self._clock(), conversation)
        self.states = [s for s in self.states if not _replaced_by(s, new)]
        self.states.append(new)
        self._evict(keep=new)
        return True

    def forget(self, conversation: str) -> int:
        """Drop the state the app keyed `conversation` (it closed that conversation); returns
        the bytes freed."""
        gone = [s for s in self.states if s.conversation == conversation]
        self.states = [s for s in self.states if s.conversation != conversation]
        return sum(s.nbytes for s in gone)

    def _evict(self, keep: SavedState) -> None:
        now = self._clock()
        while self.bytes_used > self.budget_bytes:
            others = [s for s in self.states if s is not keep]
            if not others:
                return
            worst = min(others, key=lambda s: len(s.tokens) / (now - s.used + 1.0))
            self.states = [s for s in self.states if s is not worst]  # by identity
            self.evicted += 1

    def clear(self) -> None:
        self.states.clear()


def _replaced_by(old: SavedState, new: SavedState) -> bool:
    """`new` serves whatever `old` did, or is the newer state of the same keyed conversation."""
    same = new.conversation is not None and old.conversation == new.conversation
    return same or _covered(old.tokens, new.tokens)


def _covered(old: npt.NDArray[np.int32], new: npt.NDArray[np.int32]) -> bool:
    """`old` is a prefix of `new` (so `new`'s state serves whatever `old`'s did)."""
    return len(old) <= len(new) and common_prefix(old, new) == len(old)
