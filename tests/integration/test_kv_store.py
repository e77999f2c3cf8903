"""Saved KV states on the real engine (SmolLM2 through llama-cpp-python): a restored state must
compute what the live one would have, and interleaved conversations must stay warm.

No two generations are compared: the first test compares logits of one position computed from
a restored state against the same position computed from the live state (the same batches), and
against one fresh evaluation (judged with a near-tie margin); the second reads how many prompt
tokens each turn found cached."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from hybridllm import GenerationRequest, HybridClient, Policy
from hybridllm.engines import LlamaCppEngine
from hybridllm.engines.llama.kvstore import KVStore
from hybridllm.engines.llama.prompt_lookup import TIE_MARGIN
from hybridllm.engines.llama.signals import last_logits
from hybridllm.engines.llama.thread import run_on_llama_thread

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SYSTEM_A = "You are a ship's navigator. " + "Keep every answer to one short sentence. " * 30
SYSTEM_B = "You are a pastry chef in Lyon. " + "Answer with a recipe name only, nothing else. " * 30


def _noop() -> None:
    pass


def _logits_three_ways(session: Any, a: list[int], b: list[int], cut: int) -> dict[str, Any]:
    """The last position's logits of `a`: evaluated live in two batches (`a[:cut]`, then the
    rest), from a state of `a[:cut]` saved, overwritten by `b` and restored, and in one batch."""
    llm, kv = session.llm, session.kv
    out: dict[str, Any] = {}
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(a[:cut])
    session._save_live(kv)
    llm.eval(a[cut:])
    out["live"] = last_logits(llm)
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(b)  # another conversation takes the KV cache
    hit = kv.find(a)
    assert hit is not None and hit[1] == cut
    assert session._restore(hit[0]) and llm.n_tokens == cut
    llm.eval(a[cut:])
    out["restored"] = last_logits(llm)
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(a)
    out["fresh"] = last_logits(llm)
    return out


async def test_a_restored_state_computes_what_the_live_one_did(model_path: Path) -> None:
    engine = LlamaCppEngine(model_path, warm_up=False, kv_cache_bytes=64 * 2**20)
    await engine.start()
    try:
        session = engine._session
        assert session is not None and isinstance(session.kv, KVStore)
        a = session.tokenize(SYSTEM_A + "Where is north?")
        b = session.tokenize(SYSTEM_B)
        got = await run_on_llama_thread(
            lambda: _logits_three_ways(session, a, b, len(a) - 7), on_cancel=_noop
        )
    finally:
        await engine.aclose()
    assert np.array_equal(got["restored"], got["live"])  # the same KV bytes, the same batches
    fresh, restored = got["fresh"], got["restored"]
    top = int(restored.argmax())
    assert top == int(fresh.argmax()) or fresh.max() - fresh[top] <= TIE_MARGIN
    # against one batch, a restored state differs exactly as the live state evaluated in the
    # same two batches does (llama.cpp's batch rounding: an L1 of about 0.07 in the
    # probabilities for SmolLM2 here), which the equality above already says


async def _turn(client: HybridClient, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    """The answer, the prompt tokens found cached and the prompt's tokens."""
    async with client.stream(messages, engine="local", max_tokens=12, temperature=0.0) as s:
        text = "".join([t async for t in s])
    return text, s.trace.cached_prompt_tokens or 0, s.trace.prompt_tokens or 0


async def _interleaved(kv_bytes: int, model_path: Path) -> list[tuple[int, int]]:
    """Two conversations: turn 1 of A, turn 1 of B, turn 2 of A, turn 2 of B. For each second
    turn: its cached prompt tokens, and its first turn's prompt tokens."""
    engine = LlamaCppEngine(model_path, warm_up=False, kv_cache_bytes=kv_bytes)
    out = []
    async with HybridClient(local=engine, router=None) as client:
        a = [{"role": "system", "content": SYSTEM_A}, {"role": "user", "content": "Hi."}]
        b = [{"role": "system", "content": SYSTEM_B}, {"role": "user", "content": "Hello."}]
        reply_a, _, first_a = await _turn(client, a)
        reply_b, _, first_b = await _turn(client, b)
        for conv, reply, first in ((a, reply_a, first_a), (b, reply_b, first_b)):
            conv += [{"role": "assistant", "content": reply}, {"role": "user", "content": "More?"}]
            said = engine.cached_tokens(conv)  # what routing reads before the turn
            cached = (await _turn(client, conv))[1]
            assert said == cached, (said, cached)
            out.append((cached, first))
    return out


async def test_interleaved_conversations_stay_warm(model_path: Path) -> None:
    warm = await _interleaved(64 * 2**20, model_path)
    cold = await _interleaved(0, model_path)
    # each second turn found at least its whole first prompt cached (the rest: the answer)
    assert all(cached >= first - 1 for cached, first in warm), warm
    assert cold[0][0] < 10, cold  # without saved states, A's history was overwritten by B


async def _keyed(client: HybridClient, text: str, system: str, key: str | None) -> int:
    """One local turn under the app's key: the prompt tokens it found cached."""
    conv = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    async with client.stream(
        conv, engine="local", max_tokens=6, temperature=0.0, conversation=key
    ) as s:
        _ = [t async for t in s]
    return s.trace.cached_prompt_tokens or 0


async def test_keyed_conversations_keep_one_state_each_and_forget_frees_it(
    model_path: Path,
) -> None:
    """`conversation=`: the app's key keeps one saved state per conversation (a rewritten
    history replaces the old state, which content alone would have kept beside it), and
    `forget` frees it; a forgotten conversation in the live cache is not saved later."""
    engine = LlamaCppEngine(model_path, warm_up=False, kv_cache_bytes=64 * 2**20)
    async with HybridClient(local=engine, router=None) as client:
        session = engine._session
        assert session is not None and session.kv is not None
        kv = session.kv

        def keys() -> list[str]:  # (a system prompt read from disk is kept untagged too)
            return sorted(s.conversation for s in kv.states if s.conversation is not None)

        await _keyed(client, "Hi.", SYSTEM_A, "a")
        await _keyed(client, "Hello.", SYSTEM_B, "b")  # A's state saved, keyed "a"
        assert keys() == ["a"]
        cached = await _keyed(client, "Where is south?", SYSTEM_A, "a")  # "a" rewritten
        assert cached >= len(session.tokenize(SYSTEM_A)) - 8  # its system prompt came back
        await _keyed(client, "Bonjour.", SYSTEM_B, None)  # the rewritten "a" is saved
        assert keys() == ["a", "b"]  # one state for "a": the new one replaced the old
        (a_state,) = [s for s in kv.states if s.conversation == "a"]
        assert "south" in session.llm.detokenize(a_state.tokens.tolist()).decode(errors="replace")
        used = kv.bytes_used
        await client.forget("a")
        assert keys() == ["b"] and kv.bytes_used == used - a_state.nbytes
        await _keyed(client, "Which way?", SYSTEM_A, "d")
        await client.forget("d")  # "d" holds the live cache: it is not saved when it goes
        await _keyed(client, "Salut.", SYSTEM_B, "b")
        assert "d" not in keys()


async def test_a_turn_the_cloud_served_is_prefilled_locally_for_the_next(
    model_path: Path, proxy: Any
) -> None:
    from hybridllm.engines import OpenAIEngine
    from tests.integration.servers import ALIAS, API_KEY

    local = LlamaCppEngine(model_path, warm_up=False)
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    conv = [{"role": "system", "content": SYSTEM_A}, {"role": "user", "content": "Hi."}]
    cloud_first = Policy(name="cf", routing={"prefer": "cloud", "objective": "latency"})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=cloud_first) as client:
        async with client.stream(conv, max_tokens=12, temperature=0.0) as s:  # not forced
            reply = "".join([t async for t in s])
        assert s.trace.spans[-1].engine == "cloud" and reply
        for _ in range(600):  # the warm-up runs in the background: wait for it to end
            if client._warming is None:
                break
            await anyio.sleep(0.05)
        conv += [{"role": "assistant", "content": reply}, {"role": "user", "content": "More?"}]
        known = local.count_tokens([*conv[:2], conv[2]])
        _, cached, prompt = await _turn(client, conv)
    assert known is not None and cached >= known - 8, (cached, known, prompt)


def _resumed_vs_fresh(session: Any, tokens: list[int]) -> tuple[int, Any, Any]:
    """What the next prefill of `tokens` reuses (live cache or saved state), the last position's
    logits computed on top of it, and the same from one fresh evaluation."""
    llm = session.llm
    reuse = session._warm(tokens)
    assert reuse > 0 and llm._ctx.kv_cache_seq_rm(-1, reuse, -1)
    llm.n_tokens = reuse
    llm.eval(tokens[reuse:])
    resumed = last_logits(llm)
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(tokens)
    return reuse, resumed, last_logits(llm)


async def test_a_warm_up_cut_mid_prefill_leaves_only_whole_chunks(model_path: Path) -> None:
    """A warm-up (a turn the cloud served) cut by a request mid-prefill: the chunk under way is
    aborted, what the chunks before it evaluated is saved when the request takes the cache, and
    the warm-up resumes from there. The next turn then computes, on top of what it found, the
    same next token as a fresh prefill (judged with the near-tie margin); nothing half-written
    is ever reused."""
    engine = LlamaCppEngine(model_path, warm_up=False, kv_cache_bytes=64 * 2**20)
    story = " ".join(f"On day {i} the ship sailed {i % 7} leagues north." for i in range(50))
    conv = [
        {"role": "system", "content": SYSTEM_A},
        {"role": "user", "content": story + " Summarise."},
        {"role": "assistant", "content": "It sailed north for months."},
    ]
    await engine.start()
    try:
        session = engine._session
        assert session is not None and session.kv is not None
        whole = session.tokenize(session.render(conv))
        opening = len(session.tokenize(SYSTEM_A))  # (its state may come from disk, untagged)
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.warm, conv)
            for _ in range(30_000):  # until the warm-up is past the system prompt
                if session.llm.n_tokens >= opening + 64:
                    break
                await anyio.sleep(0.002)
            side = GenerationRequest(({"role": "user", "content": "Say yes."},), max_tokens=2)
            _ = [c async for c in engine.stream(side)]  # cuts it, takes the cache
            partial = [len(s.tokens) for s in session.kv.states if len(s.tokens) < len(whole)]
        assert not engine.busy  # the resumed warm-up let go of the device (a CI find)
        assert any(opening + 16 < n for n in partial), partial  # the cut warm-up's chunks

        nxt = session.tokenize(session.render([*conv, {"role": "user", "content": "And then?"}]))
        reuse, resumed, fresh = await run_on_llama_thread(
            lambda: _resumed_vs_fresh(session, nxt), on_cancel=_noop
        )
    finally:
        await engine.aclose()
    assert reuse >= len(whole) - 8, (reuse, len(whole))  # the warm-up resumed and finished
    top = int(resumed.argmax())
    assert top == int(fresh.argmax()) or fresh.max() - fresh[top] <= TIE_MARGIN


def _disk_vs_live(session: Any, tokens: list[int], end: int) -> tuple[Any, Any]:
    """The last position's logits from the system prompt's state read from disk, and from the
    same tokens evaluated live in the same two batches."""
    llm = session.llm
    llm.reset()
    llm._ctx.kv_cache_clear()
    hit = session._from_disk(tokens, session.kv)
    assert hit is not None and hit[1] == end and session._restore(hit[0])
    llm.eval(tokens[end:])
    restored = last_logits(llm)
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(tokens[:end])
    llm.eval(tokens[end:])
    return restored, last_logits(llm)


async def test_a_restart_reads_the_system_prompt_from_disk(
    model_path: Path, tmp_path: Path
) -> None:
    first = [{"role": "system", "content": SYSTEM_A}, {"role": "user", "content": "Hi."}]
    later = [{"role": "system", "content": SYSTEM_A}, {"role": "user", "content": "Where?"}]
    before = LlamaCppEngine(model_path, warm_up=False, kv_disk_dir=tmp_path)
    async with HybridClient(local=before, router=None) as client:
        _, cached, _ = await _turn(client, first)
    assert cached == 0 and len(os.listdir(tmp_path)) == 1  # one state file
    after = LlamaCppEngine(model_path, warm_up=False, kv_disk_dir=tmp_path)  # a new process
    async with HybridClient(local=after, router=None) as client:
        session = after._session
        assert session is not None and session.disk is not None
        end = len(session.disk.states[0].tokens)
        assert session.llm.n_tokens == end  # preloaded at start: live before any request
        _, cached, prompt = await _turn(client, later)
        tokens = session.prepare(GenerationRequest(tuple(later))).tokens
        restored, live = await run_on_llama_thread(
            lambda: _disk_vs_live(session, tokens, end), on_cancel=_noop
        )
    assert cached == end and 64 <= end < prompt  # the whole system prompt, from disk
    assert np.array_equal(restored, live)
    other = LlamaCppEngine(model_path, warm_up=False, kv_disk_dir=tmp_path, n_ctx=768)
    async with HybridClient(local=other, router=None) as client:  # another cache shape
        _, cached, _ = await _turn(client, later)
    assert cached == 0
