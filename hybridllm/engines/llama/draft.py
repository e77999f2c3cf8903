"""Local drafting for the speculative plan: k tokens from a given token context, on the llama
thread, with the KV cache trimmed to the committed text between rounds.

A round gets the whole context (prompt + committed answer, as token ids). The KV cache already
holds the previous round's context and its drafted tokens; only the part that differs is dropped
(`kv_cache_seq_rm` from the first differing position) and only the new tail is evaluated, so
nothing committed is prefilled twice. Then k tokens are drafted one decode step each: greedy
(argmax) at temperature 0, else sampled from q, the softmax at the request's temperature cut to
its top_p nucleus (`nucleus.nucleus_of_logits`), with q kept for each drafted position
(speculative sampling needs q(x), and q over the cloud's support when it resamples).

Cancellation: `stop` is checked before every decode step and llama.cpp's abort callback cuts a
step that is running, so drafting stops within one decode step.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from hybridllm import errors
from hybridllm.engines.base import Message
from hybridllm.engines.capabilities import Drafted
from hybridllm.engines.llama.session import DecodeAborted, LlamaSession
from hybridllm.engines.llama.thread import run_on_llama_thread
from hybridllm.engines.nucleus import nucleus_of_logits, sample
from hybridllm.local import loader

if TYPE_CHECKING:
    from hybridllm.engines.llamacpp import LlamaCppEngine


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def draft_sync(
    session: LlamaSession,
    context: Sequence[int],
    k: int,
    stop: threading.Event,
    temperature: float = 0.0,
    rng: random.Random | None = None,
    top_p: float = 1.0,
) -> Drafted:
    """Draft up to `k` tokens after `context` (runs on the llama thread)."""
    t0 = time.perf_counter()
    llm = session.llm
    lc = loader.llama_cpp()
    out = Drafted()
    session._abort.clear()
    if not context:
        raise errors.LocalEngineError("nothing to draft from (empty context)", engine="local")
    if len(context) + k + 1 > session.n_ctx:
        k = max(0, session.n_ctx - len(context) - 1)
    reuse = min(common_prefix(llm._input_ids[: llm.n_tokens], context), len(context) - 1)
    llm._ctx.kv_cache_seq_rm(-1, reuse, -1)
    llm.n_tokens = reuse
    out.reused, out.evaluated = reuse, len(context) - reuse
    vocab = session._vocab
    try:
        llm.eval(list(context[reuse:]))
        for i in range(k):
            if stop.is_set():
                break
            logits = np.ctypeslib.as_array(lc.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))
            if temperature <= 0:
                tok, prob = int(logits.argmax()), 1.0
            else:
                q = nucleus_of_logits(logits, temperature, top_p)
                tok = sample(q, rng or random.Random())
                prob = q.prob(tok)
                out.dists.append(q)
            out.ids.append(tok)
            out.probs.append(prob)
            if lc.llama_vocab_is_eog(vocab, tok):
                out.eos = True
                break
            if i < k - 1 and not stop.is_set():
                llm.eval([tok])
                out.steps += 1
    except RuntimeError as exc:
        session._after_abort()
        if session._abort.is_set() or stop.is_set():
            raise DecodeAborted from exc
        raise errors.LocalEngineError(f"drafting failed: {exc}", engine="local") from exc
    out.seconds = time.perf_counter() - t0
    return out


class LocalDrafter:
    """The speculative plan's `Drafter` on a `LlamaCppEngine`: template, tokenizer, drafting.

    Each round holds the engine's queue lock only while it drafts, so other local requests can
    run between rounds (they may evict the cached context; the next round then evaluates it
    again, and nothing else changes)."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine
        self._rng = random.Random()

    async def start(self) -> None:
        await self.engine.start()

    @property
    def session(self) -> LlamaSession:
        session = self.engine._session
        if session is None:
            raise errors.ClientStateError("the local engine was closed")
        return session

    @property
    def n_vocab(self) -> int:
        return int(self.session.llm.n_vocab())

    @property
    def tokenizer_id(self) -> str:
        """The GGUF's tokenizer model and vocabulary size ("gpt2/151936"): two models with the
        same id very likely share a tokenizer (the verifier's probe checks it on real text)."""
        llm = self.session.llm
        return f"{llm.metadata.get('tokenizer.ggml.model', '?')}/{llm.n_vocab()}"

    def render(self, messages: Sequence[Message]) -> str:
        return self.session.render(messages)

    def tokenize(self, text: str) -> list[int]:
        return self.session.tokenize(text)

    def piece(self, ids: Sequence[int], prev: Sequence[int] = ()) -> bytes:
        """The bytes of `ids` (special tokens as nothing), as they follow `prev`."""
        llm = self.session.llm
        return bytes(llm.detokenize(list(ids), prev_tokens=list(prev) or None))

    def is_eog(self, tok: int) -> bool:
        s = self.session
        return bool(s._lc.llama_vocab_is_eog(s._vocab, tok))

    async def draft(
        self,
        context: Sequence[int],
        k: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        rng: random.Random | None = None,
    ) -> Drafted:
        """Draft up to `k` tokens after `context` (sampled from q above temperature 0, with
        `rng`, else the drafter's own); cancelling stops within one decode step."""
        await self.start()
        session = self.session
        stop = threading.Event()

        def on_cancel() -> None:
            stop.set()
            session.abort()

        queue = self.engine._queue  # one request at a time on the device, by class and arrival
        await queue.acquire(0.0, "normal")
        try:
            try:
                drafted = await run_on_llama_thread(
                    partial(
                        draft_sync,
                        session,
                        list(context),
                        k,
                        stop,
                        temperature,
                        rng or self._rng,
                        top_p,
                    ),
                    on_cancel=on_cancel,
                )
            except DecodeAborted as exc:
                raise errors.LocalEngineError("drafting aborted", engine="local") from exc
        finally:
            queue.release()
        return drafted
