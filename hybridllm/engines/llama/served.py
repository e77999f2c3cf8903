"""`ServedModel`: one GGUF model behind a server (`hybridllm serve-model`), its work on the llama
thread.

Two kinds of request, served one at a time (an `anyio.Lock`), each llama.cpp call on the one
llama thread of the process (`thread`) and aborted through llama.cpp's abort callback
when its caller is cancelled (a client that disconnects):

- `prepare(request)` then `chat(prepared)`: a chat completion through the model's template,
  token by token (the same `LlamaSession` steps as `LlamaCppEngine`, KV prefix reused).
- `complete(job)`: raw tokens in, optionally scored (`Scorer`: one batch for the uncached suffix,
  top `TOP_K` per position), then `max_tokens` generated. Above temperature 0 tokens are drawn
  as vLLM draws them: softmax(logits / T) cut to the top_p nucleus, nothing else (no top_k,
  no min_p); the speculative plan's acceptance rule assumes exactly that distribution. At
  temperature 0 the first generated token is the scored top-1 when the prompt was scored (no
  second pass over the last position).

`stats` counts the tokens evaluated and reused by scoring, for tests and benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np

from hybridllm import errors
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.llama.score import TOP_K, Scorer, Scores
from hybridllm.engines.llama.session import DecodeAborted, Generation, LlamaSession, Prepared
from hybridllm.engines.llama.thread import run_on_llama_thread
from hybridllm.engines.nucleus import nucleus_of_logits
from hybridllm.local.models import default_n_ctx
from hybridllm.local.resolve import resolve_model
from hybridllm.local.settings import DEFAULT_SETTINGS
from hybridllm.local.tune import load_tuning

__all__ = ["TOP_K", "CompletionJob", "Completion", "Prepared", "Scores", "ServedModel"]

T = TypeVar("T")


@dataclass(frozen=True)
class CompletionJob:
    """A raw completion: `tokens` in, `max_tokens` out (0: score only); `score`: compute
    per-position scores of the prompt (and of the generated tokens when `score_output`)."""

    tokens: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    score: bool = False
    score_output: bool = False


@dataclass
class Completion:
    tokens: list[int] = field(default_factory=list)  # generated
    text: str = ""
    finish_reason: str = "length"
    prompt_scores: Scores | None = None
    output_scores: Scores | None = None  # of prompt + output (positions past the prompt used)


class ServedModel:
    """A model by manifest name or GGUF path; `alias`: the name clients use (default: `model`)."""

    def __init__(
        self,
        model: str | Path,
        *,
        alias: str | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        max_logprobs: int = TOP_K,
    ) -> None:
        self.model = str(model)
        self.alias = alias or (
            Path(self.model).stem if self.model.endswith(".gguf") else self.model
        )
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self.max_logprobs = max_logprobs  # top entries a request may ask for (vLLM's name)
        self._session: LlamaSession | None = None
        self._scorer: Scorer | None = None
        self._lock = anyio.Lock()
        self.stats = {"requests": 0, "evaluated_tokens": 0, "reused_tokens": 0}
        self.last: dict[str, int] = {}

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx

    @property
    def session(self) -> LlamaSession:
        if self._session is None:
            raise errors.ClientStateError("the served model is not started")
        return self._session

    async def start(self) -> None:
        path = await anyio.to_thread.run_sync(partial(resolve_model, self.model))
        tuning = await anyio.to_thread.run_sync(load_tuning, path)
        settings = tuning.settings if tuning else DEFAULT_SETTINGS
        if self._n_threads:
            settings = settings.replace(n_threads=self._n_threads, n_threads_batch=None)
        settings = settings.resolved()
        n_ctx = self._n_ctx or default_n_ctx(self.model)
        session = await self._run(
            lambda: LlamaSession(path, n_ctx=n_ctx, settings=settings, extra={}), None
        )
        await self._run(session.warm_up, None)
        self._session, self._scorer = session, Scorer(session.llm, self.max_logprobs)

    async def aclose(self) -> None:
        async with self._lock:
            session, self._session = self._session, None
            if session is not None:
                await self._run(session.unload, None)

    # ---- text <-> tokens (no ggml compute: any thread) ---------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return self.session.tokenize(text)

    def piece(self, token: int) -> str:
        """One token's text on its own (invalid UTF-8 of a split character replaced)."""
        return bytes(self.session.llm.detokenize([token])).decode("utf-8", "replace")

    def text(self, tokens: list[int]) -> str:
        return bytes(self.session.llm.detokenize(tokens)).decode("utf-8", "replace")

    def n_vocab(self) -> int:
        return int(self.session.llm.n_vocab())

    # ---- requests --------------------------------------------------------------------------

    async def prepare(
        self, request: GenerationRequest, logit_bias: dict[int, float] | None = None
    ) -> Prepared:
        """Template and tokenize a chat request; `ContextOverflowError` before any model work.
        `logit_bias`: token id -> added to its logit while sampling (-100 bans it)."""
        prepared = await anyio.to_thread.run_sync(self.session.prepare, request)
        vocab = self.n_vocab()
        if logit_bias and any(t >= vocab for t in logit_bias):
            raise errors.ConfigError(f"logit_bias: token ids must be below {vocab}")
        bias = {**(prepared.logit_bias or {}), **(logit_bias or {})}  # a tool ban kept
        prepared.logit_bias = bias or None
        return prepared

    async def chat(self, prepared: Prepared) -> AsyncGenerator[tuple[str, Generation], None]:
        """Yield (text, generation) per decoded piece, then ("", generation) at the end; the
        generation carries the counts and the finish reason."""
        session = self.session
        async with self._lock:
            self.stats["requests"] += 1
            gen = await self._run(partial(session.prefill, prepared), session)
            try:
                while True:
                    text = await self._run(partial(session.step, gen), session)
                    if text is None:
                        break
                    yield text, gen
                    if gen.finish_reason is not None:
                        break
                yield "", gen
            finally:
                with anyio.CancelScope(shield=True):
                    await self._run(partial(session.close, gen), None)

    async def complete(self, job: CompletionJob) -> Completion:
        session = self.session
        if len(job.tokens) + job.max_tokens > session.n_ctx:
            raise errors.ContextOverflowError(
                engine="served",
                prompt_tokens=len(job.tokens),
                max_tokens=job.max_tokens,
                n_ctx=session.n_ctx,
            )
        async with self._lock:
            self.stats["requests"] += 1
            return await self._run(partial(self._complete, job), session)

    # ---- on the llama thread -----------------------------------------------------------------

    def _complete(self, job: CompletionJob) -> Completion:
        session, scorer = self.session, self._scorer
        assert scorer is not None
        session._abort.clear()
        try:
            return self._complete_on(session, scorer, job)
        except RuntimeError:  # cut by the abort callback (a cancelled caller), or a failure
            session._after_abort()
            scorer.forget()
            raise

    def _complete_on(self, session: LlamaSession, scorer: Scorer, job: CompletionJob) -> Completion:
        out = Completion()
        first: int | None = None
        if job.score:
            out.prompt_scores = self._score(scorer, job.tokens)
            if job.temperature == 0 and job.max_tokens > 0:
                first = int(out.prompt_scores.top_ids[-1][0])
        if job.max_tokens > 0:
            self._generate(session, job, out, first)
        if job.score_output and out.tokens:
            out.output_scores = self._score(scorer, job.tokens + out.tokens)
        return out

    def _score(self, scorer: Scorer, tokens: list[int]) -> Scores:
        scores = scorer.score(tokens)
        self.stats["evaluated_tokens"] += scores.evaluated
        self.stats["reused_tokens"] += scores.reused
        self.last = {"evaluated_tokens": scores.evaluated, "reused_tokens": scores.reused}
        return scores

    def _generate(
        self, session: LlamaSession, job: CompletionJob, out: Completion, first: int | None
    ) -> None:
        llm = session.llm
        llm.set_seed(job.seed if job.seed is not None else random.randint(0, 2**31 - 1))
        prompt = job.tokens + ([first] if first is not None else [])
        gen: Any = None
        if first is None and job.temperature <= 0:
            gen = llm.generate(prompt, temp=0.0, reset=True)
        elif first is None:
            # vLLM's sampling: temperature, then the top_p nucleus (llama.cpp's own chain
            # cuts top_p before the temperature and adds top_k 40 and min_p 0.05 by default)
            gen = llm.generate(
                prompt,
                temp=1.0,
                top_p=1.0,
                top_k=0,
                min_p=0.0,
                reset=True,
                logits_processor=[partial(_processed, job.temperature, job.top_p)],
            )
        raw = b""
        try:
            while len(out.tokens) < job.max_tokens:
                if first is not None:
                    tok, first = first, None
                else:
                    if gen is None:
                        gen = llm.generate(prompt, temp=0.0, reset=True)
                    tok = next(gen)
                if session._lc.llama_vocab_is_eog(session._vocab, tok):
                    out.finish_reason = "stop"
                    return
                out.tokens.append(tok)
                raw += bytes(llm.detokenize([tok]))
                text = raw.decode("utf-8", "ignore")
                cut = min((i for s in job.stop if (i := text.find(s)) >= 0), default=-1)
                if cut >= 0:
                    out.text, out.finish_reason = text[:cut], "stop"
                    return
            out.finish_reason = "length"
        finally:
            if gen is not None:
                gen.close()
            if not out.text:
                out.text = raw.decode("utf-8", "replace")

    async def _run(self, fn: Callable[[], T], session: LlamaSession | None) -> T:
        """`fn` on the llama thread; a cancelled caller aborts a running llama_decode."""
        abort = session.abort if session is not None else _noop
        try:
            return await run_on_llama_thread(fn, on_cancel=abort)
        except DecodeAborted as exc:
            raise errors.LocalEngineError("aborted", engine="local") from exc
        except RuntimeError as exc:  # a failed decode (the KV cache is cleaned up already)
            raise errors.LocalEngineError(f"llama.cpp failed: {exc}", engine="local") from exc


def _noop() -> None:
    pass


def _processed(temperature: float, top_p: float, _ids: Any, logits: Any) -> Any:
    """Logits whose softmax is softmax(logits / T) cut to the top_p nucleus."""
    q = nucleus_of_logits(logits, temperature, top_p)
    out = np.full_like(logits, -np.inf)
    out[q.ids] = np.log(q.probs)
    return out
