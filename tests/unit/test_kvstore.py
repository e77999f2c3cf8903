"""Unit tests of the saved KV states' bookkeeping (`engines.llama.kvstore`): which state a
prompt finds, what a newer state replaces, what is evicted under the byte budget. No model:
the states' bytes are placeholders; the real engine's restore is tested in
tests/integration/test_kv_store.py."""

from __future__ import annotations

import pytest

from hybridllm.engines import LlamaCppEngine
from hybridllm.engines.llama.kvstore import KVStore, common_prefix
from hybridllm.errors import InvalidArgumentError

SYS = list(range(1000, 1100))  # a shared 100-token system prompt


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0


def test_a_prompt_finds_the_state_sharing_the_longest_prefix() -> None:
    kv = KVStore(10_000, min_tokens=8)
    kv.put(SYS + [1] * 50, bytearray(100))
    kv.put(SYS + [2] * 80, bytearray(100))
    hit = kv.find(SYS + [2] * 80 + [7, 7])
    assert hit is not None and hit[1] == 180
    assert kv.find([5] * 200) is None  # nothing in common
    assert kv.find(SYS[:5]) is None  # under min_tokens


def test_a_newer_state_replaces_the_ones_it_extends() -> None:
    kv = KVStore(10_000, min_tokens=8)
    kv.put(SYS + [1] * 10, bytearray(10))
    kv.put(SYS + [1] * 30, bytearray(10))  # the same conversation, one turn on
    kv.put(SYS + [2] * 10, bytearray(10))  # another one
    assert sorted(len(s.tokens) for s in kv.states) == [110, 130]


def test_a_keyed_conversation_has_one_state_that_wins_ties_and_can_be_forgotten() -> None:
    """`conversation=`: a keyed conversation's newer state replaces its last one even where it
    does not extend it (the app trimmed the history); of equal prefixes the keyed one is found;
    `forget` frees it; untagged states and other keys are left alone."""
    kv = KVStore(10_000, min_tokens=8)
    kv.put(SYS + [1] * 40, bytearray(40), "a")
    kv.put(SYS + [3] * 20, bytearray(20))  # found by content only
    kv.put(SYS + [2] * 30, bytearray(30), "a")  # "a" rewrote its history
    assert sorted((len(s.tokens), s.conversation) for s in kv.states) == [(120, None), (130, "a")]
    prompt = SYS + [9] * 5  # shares only the system prompt with both
    hit = kv.find(prompt, "a")
    assert hit is not None and hit[1] == 100 and hit[0].conversation == "a"
    hit = kv.find(prompt, "zzz")
    assert hit is not None and hit[1] == 100 and hit[0].conversation is None  # the first found
    kv.put(SYS + [4] * 10, bytearray(10), "b")
    assert kv.forget("a") == 30 and kv.forget("a") == 0
    assert sorted(str(s.conversation) for s in kv.states) == ["None", "b"]


def test_eviction_keeps_the_budget_and_weighs_recency_by_cost() -> None:
    now = [0.0]
    kv = KVStore(300, min_tokens=8, clock=lambda: now[0])
    kv.put(SYS + [1] * 900, bytearray(100))  # long: costly to prefill again
    now[0] = 10.0
    kv.put(SYS + [2] * 10, bytearray(100))  # short
    now[0] = 20.0
    kv.put(SYS + [3] * 10, bytearray(100))
    now[0] = 21.0
    kv.put(SYS + [4] * 10, bytearray(100))  # over the budget: one must go
    assert kv.bytes_used <= 300 and kv.evicted == 1
    kept = {int(s.tokens[100]) for s in kv.states}
    assert 1 in kept and 2 not in kept  # the older short one goes, not the costly long one


def test_states_too_short_or_too_large_are_not_kept() -> None:
    kv = KVStore(50, min_tokens=64)
    assert not kv.put([1] * 10, bytearray(10))
    assert not kv.put([1] * 100, bytearray(51))
    assert kv.states == []


def test_the_engine_checks_its_budget_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="kv_cache_bytes"):
        LlamaCppEngine(kv_cache_bytes=-1)
