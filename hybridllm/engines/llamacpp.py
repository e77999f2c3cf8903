"""`LlamaCppEngine`: a local GGUF model through llama-cpp-python, off the event loop.

One generation at a time per model (a queue served by priority, then arrival: `engines.queue`),
each prefill and each decode step on the llama thread, so the event loop stays responsive. An
interactive request arriving while a background one decodes preempts it: the background answer
stops at once (the decode step under way is cut by llama.cpp's abort callback; a background
prefill runs in chunks, and only the chunk under way is lost), gives the engine up, and goes on
later from the tokens it has (prefilled again, reusing the cached prefix), with "paused" and
`Resumed` marks in its stream.
Leaving the stream stops the work within one decode step: the async side stops asking for steps,
and a running `llama_decode` (a long prefill) is cut by llama.cpp's abort callback.
The KV cache is reused for a shared prompt prefix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from hybridllm import clock, errors
from hybridllm.engines import validate
from hybridllm.engines.base import EngineInfo, GenerationRequest, Message, estimate_prompt_tokens
from hybridllm.engines.capabilities import EngineCheck
from hybridllm.engines.llama.kvdisk import DEFAULT_DISK_BYTES, DiskStates
from hybridllm.engines.llama.kvstore import KVStore
from hybridllm.engines.llama.prompt_lookup import DraftMode, DraftStats
from hybridllm.engines.llama.session import (
    DecodeAborted,
    Generation,
    LlamaSession,
    PrefillPreempted,
)
from hybridllm.engines.llama.thread import (
    Handoff,
    LlamaThread,
    loop_caller,
    run_on_llama_thread,
)
from hybridllm.engines.llama.toolcalls import check_spec
from hybridllm.engines.options import LlamaOptions
from hybridllm.engines.queue import BoundedQueue, Turn
from hybridllm.events import (
    PRIORITIES,
    Called,
    CallOpened,
    Chunk,
    Delta,
    EngineName,
    Finish,
    Mark,
    Resumed,
)
from hybridllm.local import fit, hub
from hybridllm.local.fingerprint import file_stamp, llama_build
from hybridllm.local.models import (
    Progress,
    cache_dir,
    cached_path,
    default_n_ctx,
    list_manifests,
)
from hybridllm.local.resolve import resolve_model
from hybridllm.local.settings import DEFAULT_SETTINGS, LlamaSettings
from hybridllm.local.tune import Tuning, load_tuning, save_tuning, tune_model

T = TypeVar("T")
log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from hybridllm.engines.capabilities import Drafter
    from hybridllm.engines.llama.signals import LocalSignals
    from hybridllm.tools import ToolSpec

DEFAULT_LOCAL_MODEL = "qwen2.5-coder-0.5b-instruct"
# a token on its way from the llama thread to the loop (the thread waits for `ack`: Handoff)
_Posted = tuple["Delta | Called | CallOpened", threading.Event]
# the bytes of saved KV states a local engine keeps by default (`kv_cache_bytes`): about 20,000
# tokens of Qwen 0.5B's KV, 9,000 of Qwen 1.5B's
DEFAULT_KV_BYTES = 256 * 1024 * 1024
_COUNT_CACHE = 64  # prompts whose token count is remembered (routing asks once per request)


class LlamaCppEngine:
    """A local model: a manifest name (see `hybridllm models list`), a path to a GGUF file, or a
    GGUF on the Hugging Face hub: "hf://OWNER/REPO/FILE.gguf", or "hf://OWNER/REPO:Q4_K_M" (the
    file chosen by its quantization; `hybridllm.local.hub`, the `hub` extra).

    `pull=True` fetches a manifest's model into the cache when it is missing; a hub model is
    downloaded (or resumed) when the engine opens, never later, and checked against the hub's
    sha256; `progress(phase, done_bytes, total_bytes)` hears the bytes arrive.

    Before loading, the model's need at `n_ctx` (weights, KV cache, buffers: from the GGUF's
    metadata) is checked against the free memory: `ModelTooLargeError` with the figures, where
    it does not fit (`fit_check=False`: not checked). A file llama.cpp refuses is a
    `ModelCorruptError` with its `reason` ("truncated", "malformed", ...), or, whole and well
    formed, a `ModelUnsupportedError` naming its architecture. A hub model without stored
    tuning is tuned when first opened (`tune_first`; None: hub models only), and a warning says
    where the router's stage-2 heads were trained on another model (`model_id`).

    Speed settings, later ones winning: `DEFAULT_SETTINGS`, then the model's stored tuning
    (`hybridllm tune`; `use_tuning=False` ignores it), then `settings`, then the single
    overrides `n_threads`, `n_batch`, `flash_attn`. `draft="prompt-lookup"` turns on prompt-lookup
    speculative decoding for greedy requests (temperature 0) that do not opt out with
    `options=(LlamaOptions(draft="off"),)`; a request may also opt in with
    `LlamaOptions(draft="prompt-lookup")`. Its output is the same as plain greedy decoding,
    faster when the answer copies the prompt.

    The queue: one generation runs at a time, the others wait by priority, then in the order of
    their calls (`engines.queue`: aging, preemption).
    `max_queue` bounds how many may wait (the running one not counted; 0: none) and
    `max_queue_wait_s` how long one may wait for its turn; both None (the default): unbounded.
    Past either bound a request is refused at once with `QueueFullError` (before any model work),
    and routing, which reads the same bound from `info().unavailable`, sends it to the cloud when
    the policy allows that. They are the engine's (not a policy's) because they describe this
    machine's capacity, shared by every policy; a policy's own tolerance is its
    `ttft_deadline_ms`, which routing already weighs against the expected queue wait.

    `kv_cache_bytes`: the RAM the engine may use for saved KV states of past prompts, so that
    several conversations (and one the cloud served a turn of) stay warm: a prompt that shares a
    longer prefix with a saved state than with the live KV cache has it restored instead of
    prefilled (`engines.llama.kvstore`; 0: none kept). `kv_disk_bytes`: the disk the engine may
    use for the KV states of system prompts, so the first request after a restart does not
    prefill its system prompt again (`engines.llama.kvdisk`, in `kv_disk_dir`, by default
    `$HYBRIDLLM_CACHE_DIR/kv-states`; 0: none; it needs `kv_cache_bytes`).

    Checked when made (`InvalidArgumentError`): `model` a non-blank name or a path; `n_ctx`,
    `n_threads`, `n_batch` ints >= 1 (or None); `flash_attn` a bool (or None); `use_tuning`,
    `warm_up`, `pull` bools; `settings` a `LlamaSettings`; `llama_kwargs` a dict;
    `kv_cache_bytes`, `kv_disk_bytes` ints >= 0; `kv_disk_dir` a path or None; an "hf://"
    name one of its two forms; `progress` a callable or None; `fit_check` a bool.
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_LOCAL_MODEL,
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_batch: int | None = None,
        flash_attn: bool | None = None,
        settings: LlamaSettings | None = None,
        use_tuning: bool = True,
        draft: DraftMode | None = None,
        warm_up: bool = True,
        pull: bool = False,
        name: EngineName = "local",
        llama_kwargs: dict[str, Any] | None = None,
        max_queue: int | None = None,
        max_queue_wait_s: float | None = None,
        kv_cache_bytes: int = DEFAULT_KV_BYTES,
        kv_disk_bytes: int = DEFAULT_DISK_BYTES,
        kv_disk_dir: str | Path | None = None,
        progress: Progress | None = None,
        fit_check: bool = True,
        tune_first: bool | None = None,
    ) -> None:
        _check_args(model, n_ctx, n_threads, n_batch, flash_attn, settings, llama_kwargs, name)
        validate.integer("kv_cache_bytes", kv_cache_bytes, minimum=0)
        validate.integer("kv_disk_bytes", kv_disk_bytes, minimum=0)
        if kv_disk_dir is not None and not isinstance(kv_disk_dir, str | Path):
            raise errors.InvalidArgumentError("kv_disk_dir", kv_disk_dir, "a path or None")
        self.kv_cache_bytes, self.kv_disk_bytes = kv_cache_bytes, kv_disk_bytes
        self.kv_disk_dir = Path(kv_disk_dir) if kv_disk_dir is not None else None
        flags = (("use_tuning", use_tuning), ("warm_up", warm_up), ("pull", pull))
        for arg, value in (*flags, ("fit_check", fit_check)):
            validate.flag(arg, value)
        if progress is not None and not callable(progress):
            raise errors.InvalidArgumentError("progress", progress, "a callable or None")
        self._progress, self._fit_check = progress, fit_check
        if tune_first is not None:
            validate.flag("tune_first", tune_first)
        # a hub model is tuned when first opened (`hybridllm tune --quick`), unless asked not to
        self._tune_first = hub.is_hub_ref(model) if tune_first is None else tune_first
        self.name: EngineName = name
        self.model = str(model)
        self._n_ctx = n_ctx
        self._settings = settings
        given = {"n_threads": n_threads, "n_batch": n_batch, "flash_attn": flash_attn}
        self._overrides = {k: v for k, v in given.items() if v is not None}
        self._use_tuning = use_tuning
        if draft not in (None, "prompt-lookup"):
            raise errors.ConfigError(f"unknown draft mode {draft!r} (known: 'prompt-lookup')")
        self.draft = draft
        self.settings: LlamaSettings | None = None  # in effect once started
        self.tuning: Tuning | None = None  # the stored tuning in use, if any
        self._warm_up = warm_up
        self._pull = pull
        self._llama_kwargs = dict(llama_kwargs or {})
        self._session: LlamaSession | None = None
        self._start_lock = anyio.Lock()
        self._queue = BoundedQueue(
            name, max_queue=max_queue, max_queue_wait_s=max_queue_wait_s
        )  # one generation at a time, FIFO, bounded
        self._prepare_lock = anyio.Lock()
        # Measured at warm-up, then refined from real requests (exponential average).
        self.prefill_tps: float | None = None
        self.tpot_s: float | None = None
        self._learned_prefill = self._learned_tpot = False
        # Observability for tests and benchmarks.
        self.steps_total = 0
        # how long the llama thread waits, after each token, for the loop to hand it on
        # (`Handoff`; 0: it does not wait)
        self.handoff_wait_s = 0.004
        self._counts: OrderedDict[tuple[tuple[str, str], ...], list[int]] = OrderedDict()
        self.busy = False
        self.stopped_at: float | None = None
        # which model this is, once opened: its manifest name ("name:quant" for a variant),
        # else its file's name (what the router's stage 2 was trained on is compared with it)
        self.model_id: str | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    async def check(self, timeout_s: float = 3.0) -> EngineCheck:
        """`Checks`: the model loads (it is loaded at the first check or request); a local
        engine has no endpoint and no key (`timeout_s` does not bound a load)."""
        try:
            await self.start()
        except (errors.ModelError, errors.PullError) as exc:
            return EngineCheck(True, None, False, f"{self.model}: {exc}", type(exc))
        return EngineCheck(True, None, True, f"{self.model}: loaded, n_ctx {self.n_ctx}")

    def check_constraints(self, spec: ToolSpec) -> None:
        """`ConstrainsOutput`: each schema of `spec` converts to a llama.cpp grammar."""
        check_spec(spec)

    async def start(self) -> None:
        async with self._start_lock:
            if self._session is not None:
                return
            path = await anyio.to_thread.run_sync(self._resolve)
            self.model_id = model_id(self.model, path)
            tuning = await self._tuning(path) if self._use_tuning and not self._settings else None
            settings = self._settings or (tuning.settings if tuning else DEFAULT_SETTINGS)
            settings = settings.replace(**self._overrides).resolved()
            n_ctx = self._n_ctx or default_n_ctx(self.model)
            if self._fit_check:  # ModelTooLargeError with the figures, not an OOM kill
                kwargs = {**settings.llama_kwargs(), **self._llama_kwargs}
                await anyio.to_thread.run_sync(
                    partial(
                        fit.check_fit,
                        path,
                        n_ctx,
                        n_batch=kwargs.get("n_batch") or 512,
                        type_k=kwargs.get("type_k") or 1,
                        type_v=kwargs.get("type_v") or 1,
                    )
                )
            session = await run_on_llama_thread(
                lambda: LlamaSession(
                    path, n_ctx=n_ctx, settings=settings, extra=self._llama_kwargs
                ),
                on_cancel=_noop,
            )
            if self._warm_up:
                self.prefill_tps, self.tpot_s = await run_on_llama_thread(
                    session.warm_up, on_cancel=_noop
                )
            if tuning is not None and tuning.settings == settings:
                # a longer measurement than the warm-up's, with exactly these settings
                self.prefill_tps, self.tpot_s = tuning.prefill_tps, tuning.rates.tpot_s
            self.settings, self.tuning = settings, tuning
            session.kv = KVStore(self.kv_cache_bytes) if self.kv_cache_bytes else None
            if session.kv is not None and self.kv_disk_bytes:
                try:
                    session.disk = await anyio.to_thread.run_sync(self._disk_states, path, n_ctx)
                except OSError as exc:  # no warm start, and nothing else lost
                    log.warning("no KV states on disk (%s): the warm start is off", exc)
                await run_on_llama_thread(session.preload, on_cancel=_noop)
            self._session = session

    async def _tuning(self, path: Path) -> Tuning | None:
        """The stored tuning of this model, CPU and build; where there is none and
        `tune_first`, measured now (a quick `hybridllm tune`, a few seconds to a minute) and
        stored, so later opens start tuned."""
        tuning = await anyio.to_thread.run_sync(load_tuning, path)
        if tuning is not None or not self._tune_first:
            return tuning
        log.info("tuning %s on this device (first open; `hybridllm tune` stores it)", path.name)
        try:
            tuning = await run_on_llama_thread(
                partial(tune_model, path, quick=True, progress=self._progress), on_cancel=_noop
            )
        except errors.TuneError as exc:  # the default settings serve
            log.warning("tuning %s failed (%s): default settings", path.name, exc)
            return None
        with contextlib.suppress(OSError):  # a read-only cache: tuned, not stored
            await anyio.to_thread.run_sync(save_tuning, path, tuning)
        return tuning

    def _disk_states(self, path: Path, n_ctx: int) -> DiskStates:
        """The disk store of system prompts' states for this model, build and settings."""
        assert self.settings is not None
        shape = json.dumps({"n_ctx": n_ctx, **self.settings.to_dict()}, sort_keys=True)
        identity = f"{path.name}|{file_stamp(path)}|{llama_build()}|{shape}"
        directory = self.kv_disk_dir or cache_dir() / "kv-states"
        return DiskStates(directory, identity, self.kv_disk_bytes)

    def _resolve(self) -> Path:
        """The GGUF file: a hub model ("hf://") is downloaded when the engine opens (not when
        its weights alone pass the free memory: `ModelTooLargeError` first)."""
        if hub.is_hub_ref(self.model):
            room = fit.available_memory() if self._fit_check else None
            return hub.fetch(self.model, progress=self._progress, max_bytes=room)
        return resolve_model(self.model, pull=self._pull, progress=self._progress)

    async def aclose(self) -> None:
        async with self._start_lock:
            await self._queue.acquire(0.0, turn=Turn("interactive"))  # after the running one
            try:
                session, self._session = self._session, None
                self._counts.clear()
                if session is not None:
                    await run_on_llama_thread(session.unload, on_cancel=_noop)
            finally:
                self._queue.release()

    # ---- state ----------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int | None:
        return None if self._session is None else self._session.n_ctx

    @property
    def draft_stats(self) -> DraftStats | None:
        """Prompt-lookup totals of this engine's finished generations (None: not started)."""
        return None if self._session is None else self._session.draft_stats

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            model=self.model,
            supports_continuation=True,  # the assistant prefix goes on in the raw template
            queue_depth=self._queue.depth,
            expected_wait_s=self.expected_wait_s(),
            wait_by_priority={p: self._queue.expected_wait_s(p) for p in PRIORITIES},
            n_ctx=self.n_ctx,
            prefill_tps=self.prefill_tps,
            decode_tps=1.0 / self.tpot_s if self.tpot_s else None,
            unavailable=self._queue.unavailable(),
            on_device=True,
        )

    def expected_wait_s(self) -> float:
        """Seconds a request queued now would wait before its prefill starts (estimate)."""
        return self._queue.expected_wait_s()

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        """Queue wait plus prefill of the prompt (its tokens counted by the tokenizer)."""
        if self.prefill_tps is None:
            return None
        tokens = self.count_tokens(request.messages)
        if tokens is None:
            tokens = estimate_prompt_tokens(request.messages)
        return self._queue.expected_wait_s(request.priority) + tokens / self.prefill_tps

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        """The prompt's tokens through the model's chat template and tokenizer, exactly what a
        request's prefill counts (None: not started). About 0.1 ms per 1,000 characters; the
        last few prompts' tokens are remembered. Not while `aclose()` runs: the client calls
        it on the event loop or on an admission worker thread its request task waits for."""
        tokens = self._tokens(messages)
        return None if tokens is None else len(tokens)

    def cached_tokens(self, messages: Sequence[Message]) -> int | None:
        """The prompt's leading tokens the next prefill would not evaluate: held in the live
        KV cache or in a saved state (read without waiting for the llama thread: an estimate
        while a request runs). None: not started, or the template refuses."""
        session, tokens = self._session, self._tokens(messages)
        if session is None or tokens is None:
            return None
        return session.reusable_prefix(tokens)

    def _tokens(self, messages: Sequence[Message]) -> list[int] | None:
        session = self._session
        if session is None:
            return None
        key = tuple((str(m.get("role", "")), str(m.get("content", ""))) for m in messages)
        tokens = self._counts.get(key)
        if tokens is None:
            try:
                tokens = session.tokenize(session.render(messages))
            except errors.LocalEngineError:  # the template refuses: the request will say so
                return None
            self._counts[key] = tokens
            if len(self._counts) > _COUNT_CACHE:
                self._counts.popitem(last=False)
        else:
            self._counts.move_to_end(key)
        return tokens

    def estimate_s(self, prompt_tokens: int, max_tokens: int) -> float:
        prefill = prompt_tokens / self.prefill_tps if self.prefill_tps else 0.0
        return prefill + max_tokens * (self.tpot_s or 0.0)

    async def queued_job(
        self, job: Callable[[LlamaSession], T], *, estimate_s: float, what: str
    ) -> T:
        """`job(session)` on the llama thread as one job of the engine's queue, the device busy
        meanwhile (the router's signals, the privacy judge's scoring); a cancellation aborts
        it. An abort not of our making (the engine closing) is a `LocalEngineError` on `what`."""
        from hybridllm.engines.llama.signals import Aborted

        await self.start()
        session = self._session
        if session is None:
            raise errors.ClientStateError("the local engine was closed")
        self._queue.check()
        await self._queue.acquire(estimate_s)
        try:
            self.busy = True
            return await run_on_llama_thread(partial(job, session), on_cancel=session.abort)
        except (Aborted, DecodeAborted) as exc:
            raise errors.LocalEngineError(f"{what} aborted", engine="local") from exc
        finally:
            self.busy = False
            self._queue.release()

    async def signals(
        self,
        messages: Sequence[Message],
        n_answer: int = 8,
        *,
        rotations_within_s: float | None = None,
        rotations_max_s: float | None = None,
    ) -> LocalSignals:
        """The model's own confidence on `messages` (router stage 2): one queued job that
        prefills the prompt (left in the KV cache for the request that follows) and decodes up
        to `n_answer` greedy tokens (`engines/llama/signals.py`). A multiple-choice prompt is
        first read with its options rotated; with `rotations_within_s` the rotations are not
        started, or given up (their figures NaN: stage 2 then scores without them), when they
        would not end that long after the job starts; with `rotations_max_s`, not read where
        what they add that the answer does not reuse is priced past it."""
        from hybridllm.engines.llama.signals import engine_signals

        return await engine_signals(self, messages, n_answer, rotations_within_s, rotations_max_s)

    async def text_logprobs(self, prefix: str, text: str) -> tuple[float, ...]:
        """The log-probability of each token of the plain text `text` after `prefix` (no chat
        template), as one queued job (`engines/llama/textscore.py`): the privacy judge's test
        of whether the model knows a name."""
        from hybridllm.engines.llama.textscore import engine_text_logprobs

        return await engine_text_logprobs(self, prefix, text)

    def drafter(self) -> Drafter:
        """A drafting handle for one speculative request (`engines.capabilities.Drafts`)."""
        from hybridllm.engines.llama.draft import LocalDrafter  # numpy: once a plan drafts

        return LocalDrafter(self)

    # ---- streaming ------------------------------------------------------------------------

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        await self.start()
        session = self._session
        if session is None:
            raise errors.ClientStateError("the local engine was closed")
        # Template, tokenize and context check happen before queueing: no model work. The
        # tokenizer does no ggml compute, so it may run off the llama thread.
        # Requests queue in the order of their calls: tokenizing one at a time keeps that order.
        async with self._prepare_lock:
            prepared = await anyio.to_thread.run_sync(session.prepare, request)
        draft = self._draft_for(request)
        new_tokens = len(prepared.tokens) - session.reusable_prefix(prepared.tokens)
        self._queue.check()  # past a bound: QueueFullError now, before the "queued" mark
        yield Mark("queued", clock.now())
        turn = await self._queue.acquire(
            self.estimate_s(new_tokens, prepared.max_tokens), request.priority
        )
        hold = _Hold()
        gen: Generation | None = None
        try:
            self.busy = True
            new_tokens = len(prepared.tokens) - session.reusable_prefix(prepared.tokens)
            self._queue.active = (
                clock.now(),
                self.estimate_s(new_tokens, prepared.max_tokens),
            )
            yield Mark("started", clock.now())
            fill = partial(session.prefill, prepared, draft=draft, yield_if=_yields(turn))
            filled, t0 = await self._prefill_in_turn(
                session, fill, turn, hold, lambda: turn.estimate_s
            )
            gen = filled
            t1 = clock.now()
            yield Mark("prefill_done", t1)
            self._learn_prefill(len(prepared.tokens) - gen.reused_tokens, t1 - t0)
            for name in gen.opened:  # a call the prompt opened (a named function): named now
                yield CallOpened(t1, call_name=name)
            while True:
                self._queue.active = (clock.now(), self._left_s(gen))
                async with contextlib.aclosing(self._decode(session, gen, turn)) as deltas:
                    async for delta in deltas:
                        yield delta
                if gen.finish_reason is not None or not turn.preempt.is_set():
                    break
                # preempted (engines.queue): give the turn back, wait again, go on from here
                paused_at = clock.now()
                yield Mark("paused", paused_at)
                yield await self._resume(session, gen, draft, turn, hold, paused_at)
            yield Finish(
                gen.finish_reason or "stop",
                prepared.prompt_tokens,
                gen.completion_tokens,
                clock.now(),
                cached_prompt_tokens=min(gen.reused_tokens, prepared.prompt_tokens),
            )
        finally:
            with anyio.CancelScope(shield=True):
                if gen is not None and hold.holding:
                    await run_on_llama_thread(partial(session.close, gen), on_cancel=_noop)
                else:  # stopped in the queue or during prefill: the llama thread let go now
                    self.stopped_at = clock.now()
                self.busy = False
                if hold.holding:
                    self._queue.release()

    async def warm(self, messages: Sequence[Message], conversation: str | None = None) -> int:
        """Prefill a conversation whose last message is the assistant's answer (a turn another
        engine served), as a warm-up: it waits for the device to be idle, and any request that
        arrives cuts it at once (the chunk under way is aborted; `engines.queue`, `Turn.idle`).
        What it prefilled stays in the KV cache, and in a saved state once another prompt takes
        the cache (under the app's `conversation` key if it gave one), so the next turn pays
        only for its new message. Returns the tokens prefilled (0: already cached)."""
        await self.start()
        session = self._session
        if session is None:
            raise errors.ClientStateError("the local engine was closed")
        request = GenerationRequest(
            messages=tuple(messages), max_tokens=1, priority="background", conversation=conversation
        )
        async with self._prepare_lock:
            prepared = await anyio.to_thread.run_sync(session.prepare, request)
        new_tokens = len(prepared.tokens) - session.reusable_prefix(prepared.tokens)
        if new_tokens <= 1:
            return 0
        turn = await self._queue.acquire(self.estimate_s(new_tokens, 0), "background", idle=True)
        hold = _Hold()
        try:
            fill = partial(session.prefill, prepared, yield_if=_yields(turn))
            gen, t0 = await self._prefill_in_turn(session, fill, turn, hold, lambda: 0.0)
            await run_on_llama_thread(partial(session.close, gen), on_cancel=_noop)
            self._learn_prefill(len(prepared.tokens) - gen.reused_tokens, clock.now() - t0)
            return len(prepared.tokens) - gen.reused_tokens
        finally:
            if hold.holding:
                self._queue.release()

    async def forget(self, conversation: str) -> int:
        """The app closed `conversation` (its key): drop the KV state kept for it, so that it
        takes no more of `kv_cache_bytes`. Returns the bytes freed (0: none kept, or the engine
        not started)."""
        validate.conversation(conversation)
        session = self._session
        if session is None:
            return 0
        return await run_on_llama_thread(partial(session.forget, conversation), on_cancel=_noop)

    async def _resume(
        self,
        session: LlamaSession,
        gen: Generation,
        draft: DraftMode | None,
        turn: Turn,
        hold: _Hold,
        paused_at: float,
    ) -> Resumed:
        """A generation preempted at `paused_at`: close it, give the turn up, wait for it again
        and prefill what the pause let go of."""
        done = gen.completion_tokens
        await run_on_llama_thread(partial(session.close, gen), on_cancel=_noop)
        turn.pauses += 1
        await self._give_way(turn, hold, self._left_s(gen))
        again = partial(session.resume, gen, draft, _yields(turn))
        estimate = partial(self._left_s, gen)  # preempted again during the prefill: same pause
        prefilled, t0 = await self._prefill_in_turn(session, again, turn, hold, estimate)
        self._learn_prefill(prefilled, clock.now() - t0)
        return Resumed(
            clock.now(),
            paused_at=paused_at,
            reason=turn.preempt_reason,
            delivered_tokens=done,
            prefill_tokens=prefilled,
        )

    async def _prefill_in_turn(
        self,
        session: LlamaSession,
        fill: Callable[[], T],
        turn: Turn,
        hold: _Hold,
        estimate_s: Callable[[], float],
    ) -> tuple[T, float]:
        """A preemptible prefill gives the device up between chunks and waits for its turn
        again; returns its result and when the attempt that completed it began."""
        while True:
            t0 = clock.now()
            try:
                return await self._on_thread(session, fill), t0
            except PrefillPreempted:
                await self._give_way(turn, hold, estimate_s())

    async def _give_way(self, turn: Turn, hold: _Hold, estimate_s: float) -> None:
        """Release the turn to a more urgent request and wait for it again; the engine is as
        busy after as before (a warm-up never marks it busy: any request cuts it)."""
        busy, self.busy, hold.holding = self.busy, False, False
        self._queue.release()
        await self._queue.acquire(estimate_s, turn=turn)
        hold.holding, self.busy = True, busy

    async def _on_thread(self, session: LlamaSession, fn: Callable[[], T]) -> T:
        """A prefill on the llama thread, cut by llama.cpp's abort when the caller leaves."""
        try:
            return await run_on_llama_thread(fn, on_cancel=session.abort)
        except DecodeAborted as exc:  # aborted without our cancellation: the engine is closing
            raise errors.LocalEngineError("prefill aborted", engine="local") from exc

    def _left_s(self, gen: Generation) -> float:
        """Estimated seconds a started generation still decodes."""
        return self.estimate_s(0, gen.prepared.max_tokens - gen.completion_tokens)

    async def _decode(
        self, session: LlamaSession, gen: Generation, turn: Turn
    ) -> AsyncGenerator[Delta | Called | CallOpened, None]:
        """Decode on the llama thread without pausing between tokens; stop when told, or
        before the next step once a more urgent request preempts this one (`turn.preempt`).
        A tool call comes as one `Called` once its JSON is complete (never as text), after a
        `CallOpened` mark as soon as its JSON has chosen the function."""
        send, recv = anyio.create_memory_object_stream[_Posted](math.inf)
        stop = threading.Event()
        finished = anyio.Event()
        post = loop_caller()
        handoff = Handoff(post, self.handoff_wait_s)

        def push(delta: Delta | Called | CallOpened, ack: threading.Event) -> None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                send.send_nowait((delta, ack))

        cut = _yields(turn) if gen._drafter is None else None  # a step cut at a preemption
        sent = [len(gen.calls)]  # calls already delivered (a resumed generation has some)
        said = [len(gen.opened)]  # calls whose opening was said

        def decode() -> None:
            try:
                while not stop.is_set() and not turn.preempt.is_set():
                    try:
                        text = session.step(gen, cut)
                    except PrefillPreempted:
                        break  # the step under way was cut: the turn goes to the waiting one
                    self.steps_total += 1
                    if text:
                        handoff.send(partial(push, Delta(text, clock.now())))
                    while len(gen.opened) > said[0]:
                        opened = CallOpened(clock.now(), call_name=gen.opened[said[0]])
                        said[0] += 1
                        handoff.send(partial(push, opened))
                    while len(gen.calls) > sent[0]:
                        call = gen.calls[sent[0]]
                        sent[0] += 1
                        now = clock.now()
                        called = Called(call.id, call.name, call.arguments, now, call.confidence)
                        handoff.send(partial(push, called))
                    if text is None or gen.finish_reason is not None:
                        break
            finally:
                self.stopped_at = clock.now()

        def ended() -> None:
            send.close()
            finished.set()

        fut = LlamaThread.shared().submit(decode)
        fut.add_done_callback(lambda _f: post(ended))
        first = last = None
        try:
            async with recv:
                async for delta, ack in recv:
                    first = first or delta.t
                    last = delta.t
                    yield delta
                    handoff.taken(ack)
            fut.result()  # raises the worker's error, if any (the stream closed after it ended)
        except DecodeAborted as exc:  # aborted without our cancellation: the engine is closing
            raise errors.LocalEngineError("generation aborted", engine="local") from exc
        finally:
            if not fut.done():
                stop.set()
                session.abort()  # cut a decode step that is running now
                with anyio.CancelScope(shield=True):
                    await finished.wait()
        if first is not None and last is not None and gen.completion_tokens > 1:
            self._learn_tpot((last - first) / (gen.completion_tokens - 1))

    def _draft_for(self, request: GenerationRequest) -> DraftMode | None:
        """The drafting a request gets: its `LlamaOptions.draft`, else the engine's; greedy
        requests without tools only (a call or JSON answer is sampled under a grammar)."""
        options = request.option(LlamaOptions)
        mode = self.draft if options is None or options.draft is None else options.draft
        if mode != "prompt-lookup" or request.temperature > 0 or request.tools is not None:
            return None
        return "prompt-lookup"

    def _learn_prefill(self, n_tokens: int, seconds: float) -> None:
        """Exponential average; the first real measurement replaces the warm-up figure."""
        if n_tokens >= 16 and seconds > 0:
            rate = n_tokens / seconds
            old = self.prefill_tps if self._learned_prefill else None
            self.prefill_tps = rate if old is None else 0.7 * old + 0.3 * rate
            self._learned_prefill = True

    def _learn_tpot(self, tpot: float) -> None:
        old = self.tpot_s if self._learned_tpot else None
        self.tpot_s = tpot if old is None else 0.7 * old + 0.3 * tpot
        self._learned_tpot = True


def _noop() -> None:
    pass


def model_id(model: str, path: Path) -> str:
    """The manifest name of `model` (also where it is a path to a manifest's cached file),
    else the GGUF file's name."""
    if not hub.is_hub_ref(model) and "/" not in model and not model.endswith(".gguf"):
        return model
    with contextlib.suppress(OSError, errors.ConfigError):
        for manifest in list_manifests():
            if cached_path(manifest).resolve() == path.resolve():
                return manifest.name
    return path.name


def _check_args(
    model: object,
    n_ctx: object,
    n_threads: object,
    n_batch: object,
    flash_attn: object,
    settings: object,
    llama_kwargs: object,
    name: object,
) -> None:
    if not isinstance(model, Path):
        validate.text("model", model)
        if hub.is_hub_ref(model):
            hub.parse(str(model))  # InvalidArgumentError now, not when the engine opens
    for arg, value in (("n_ctx", n_ctx), ("n_threads", n_threads), ("n_batch", n_batch)):
        if value is not None:
            validate.integer(arg, value, minimum=1)
    if flash_attn is not None:
        validate.flag("flash_attn", flash_attn)
    if settings is not None and not isinstance(settings, LlamaSettings):
        raise errors.InvalidArgumentError("settings", settings, "a LlamaSettings")
    if llama_kwargs is not None and not isinstance(llama_kwargs, dict):
        raise errors.InvalidArgumentError("llama_kwargs", llama_kwargs, "a dict")
    validate.one_of("name", name, ("local", "cloud"))


@dataclass
class _Hold:
    """Whether a request holds its turn of the device now (a preemption gives it up a while)."""

    holding: bool = True


def _yields(turn: Turn) -> Callable[[], bool] | None:
    """A background request's prefill gives the device up to a preempting one between chunks
    (`LlamaSession.prefill(yield_if=)`); others run theirs in one go."""
    return turn.preempt.is_set if turn.priority == "background" else None
