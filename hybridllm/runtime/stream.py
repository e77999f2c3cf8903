"""`Stream`: the object `HybridClient.stream()` returns.

The work of a request runs in a producer task owned by the client's task group (never inside an
async generator), and reaches the app through a memory object stream. `Stream` itself is a plain
class, so both forms work:

    async for token in client.stream(msgs):      # tokens only
        ...
    async with client.stream(msgs) as s:          # deterministic cleanup, typed events
        async for event in s.events(): ...
        s.trace

Leaving early stops every engine promptly: `async with` closes and waits; a bare `async for`
that breaks, raises or is cancelled drops the Stream, whose finaliser cancels the producer (the
producer holds no reference to the Stream, so CPython drops it at once).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import aclosing
from functools import partial
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from hybridllm import clock, errors, logs
from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.events import (
    Called,
    CallOpened,
    Chunk,
    CloudUnavailable,
    DeadlineMissed,
    Delta,
    Done,
    EngineName,
    EngineUsage,
    Event,
    Fallback,
    FallbackCause,
    Finish,
    Handoff,
    Hedge,
    Mark,
    ParallelStart,
    Partial,
    PartialJSON,
    Paused,
    RequestSent,
    Resumed,
    Retract,
    Route,
    Token,
    ToolCall,
    Usage,
    is_content,
)
from hybridllm.runtime.checked import checked
from hybridllm.runtime.recorder import PlanRecord, Recorder
from hybridllm.runtime.records import (
    Attempt,
    HandoffRecord,
    Pause,
    SpendRole,
    Switch,
    spend_role,
)
from hybridllm.runtime.retry import RetryPolicy, Tries
from hybridllm.runtime.seam import seamed
from hybridllm.runtime.trace import Trace

log = logging.getLogger(__name__)

# the event each fallback cause is announced with (any other cause: a plain `Fallback`)
_FALLBACK_EVENTS: dict[FallbackCause, type[Fallback]] = {
    "hedge": Hedge,
    "parallel": ParallelStart,
}


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


# what the producer hands the app's side: an event, or the error that ended the request
StreamItem = Event | _Failure


class RequestRun:
    """Producer side of one request: runs the plan and is what the plan reports to. Each verb
    emits the app's event and records it (`runtime.recorder`) from the same call."""

    def __init__(
        self,
        trace: Trace | None,
        send: MemoryObjectSendStream[StreamItem],
        on_outcome: Callable[[EngineName, BaseException | None], None] | None = None,
        cloud_unavailable: str | None = None,
        deadline_ms: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """`cloud_unavailable`: why routing left out a cloud this request could have used (a
        missing or refused key): the stream says so with a `CloudUnavailable` after its
        `Route`. `deadline_ms`: the policy's first-token deadline; a first token after it is
        preceded by a `DeadlineMissed` (and noted in `trace.deadline_missed_ms`). `retry`: how
        each engine stream is retried (None: never)."""
        self.rec = Recorder(trace)
        self._deadline_ms = deadline_ms
        self.retry = retry or RetryPolicy()
        self._send = send
        self._on_outcome = on_outcome
        self._cloud_unavailable = cloud_unavailable
        self._said_unavailable = False
        self._delivered: list[str] = []
        self._authors: set[EngineName] = set()  # the engines whose text was delivered
        self.calls: list[ToolCall] = []  # the tool calls delivered
        # a JSON answer is wanted (`Done.parsed`); the engine and raw text of the partial JSON
        # snapshots shown and not yet committed (a `Retract` takes them back)
        self._json_answer = False
        self._partial: tuple[EngineName, str] | None = None
        self._opened_first = False  # the answer started with a call named (`CallOpened`)
        self.scope = anyio.CancelScope()
        self.finished = anyio.Event()

    def admitted(
        self,
        *,
        cloud_unavailable: str | None,
        deadline_ms: float | None,
        retry: RetryPolicy,
        json_answer: bool = False,
    ) -> None:
        """What admission decided, set before the plan runs (the arguments of `__init__`;
        `json_answer`: the answer must be JSON, its object parsed into `Done.parsed`)."""
        self._cloud_unavailable = cloud_unavailable
        self._deadline_ms = deadline_ms
        self.retry = retry
        self._json_answer = json_answer

    async def run(self, plan: Callable[[RequestRun], Awaitable[None]]) -> None:
        try:
            with self.scope:
                try:
                    await plan(self)
                except Exception as exc:  # delivered to the app, never lost in the task group
                    typed = errors.typed(exc, received_content=bool(self.trace.token_times))
                    self.rec.failed(typed)
                    self.emit(_Failure(typed))
        finally:
            trace = self.trace
            if self.scope.cancel_called and trace.finish_reason is None and not trace.error_type:
                self.rec.done("cancelled")  # the app stopped it (aclose, a break): typed, not None
            self.rec.ended()
            self.rec.freeze()
            self._send.close()
            self.finished.set()

    @property
    def trace(self) -> Trace:
        """The request's trace: the working one while it runs, then the frozen value."""
        return self.rec.trace

    def emit(self, item: StreamItem) -> None:
        if isinstance(item, Fallback | Handoff):  # another engine started, or took the answer
            log.info("request %s: %r", self.trace.request_id, item)
        elif isinstance(item, Done):
            summary, answer = item.trace.summary(), logs.content(self.delivered_text)
            log.debug("request %s done: %s, answer %s", self.trace.request_id, summary, answer)
        try:
            self._send.send_nowait(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.scope.cancel()  # nobody is listening any more

    def cancel(self) -> None:
        self.scope.cancel()

    def route(self, engine: Engine, reason: str) -> None:
        self.rec.serving(engine.name, reason)
        self.emit(Route(clock.now(), engine.name, reason))
        if self._cloud_unavailable is not None:
            self.say_unavailable(self._cloud_unavailable)

    # ---- the recorder's verbs: each emits the app's event and records it in the trace ----------

    def fell_back(
        self,
        from_engine: EngineName,
        to_engine: EngineName,
        reason: str,
        cause: FallbackCause,
        *,
        t: float | None = None,
    ) -> None:
        """Another engine starts (or took the answer over): the `Fallback` event for `cause`
        (`Hedge`, `ParallelStart`, or a plain `Fallback`) and its trace record, from one call."""
        at = clock.now() if t is None else t
        self.rec.fallback_record(from_engine, to_engine, cause, reason, at)
        event = _FALLBACK_EVENTS.get(cause, Fallback)
        self.emit(event(at, from_engine, to_engine, reason, cause))

    def switched(
        self,
        from_engine: EngineName,
        to_engine: EngineName,
        exc: BaseException,
        *,
        reason: str | None = None,
        t: float | None = None,
        chars: int | None = None,
        cause: FallbackCause = "mid_stream",
    ) -> None:
        """The serving engine failed mid-stream and `to_engine` continues from the delivered
        text (`chars` of it: all of it unless given): the trace's `Switch`, its fallback record
        (for `cause`) and the `Fallback` event, at once."""
        at = clock.now() if t is None else t
        why = f"{from_engine} failed mid-stream: {exc}" if reason is None else reason
        said = str(exc) if reason is None else reason
        chars = len(self.delivered_text) if chars is None else chars
        self.rec.switch(Switch(at, from_engine, to_engine, said, chars, type(exc)))
        self.fell_back(from_engine, to_engine, why, cause, t=at)

    def counted(self, engine: EngineName, prompt_tokens: int | None, completion: int) -> None:
        """Tokens an engine spent for this request outside an engine stream (the cascade's
        signals, the speculative plan's verification calls): summed into its usage."""
        self.rec.counted_usage(EngineUsage(engine, prompt_tokens or 0, completion))

    def started(self, engine: EngineName) -> None:
        """`engine` was started for this request (beside or after the one serving)."""
        self.rec.started_engine(engine)

    def serving(self, engine: EngineName) -> None:
        """`engine` serves the answer from here on (a race's winner, a plan's move)."""
        self.rec.serving(engine)

    def mark(self, name: str, t: float | None = None) -> None:
        """A phase of the request was seen at `t` (now: None); the first time counts."""
        self.rec.mark(name, t)

    def plan_record(self, record: PlanRecord) -> None:
        """Attach the plan's own record (a cascade's, a handoff's, a speculative plan's)."""
        self.rec.plan_record(record)

    def refused(self, engine: EngineName, exc: BaseException) -> None:
        """A guard kept the request from `engine` (privacy, budget: the words never hold the
        secret)."""
        self.rec.refused(engine, str(exc))

    def handed_off(
        self, record: HandoffRecord, from_engine: EngineName, to_engine: EngineName, why: str
    ) -> None:
        """The handoff's `to_engine` took the answer over: its record says so and the `Handoff`
        event tells the app, from one call."""
        record.switched_t, record.outcome = clock.now(), "switched"
        self.rec.serving(to_engine)
        chars, tokens = record.local_chars, record.local_tokens
        self.emit(Handoff(record.switched_t, from_engine, to_engine, chars, tokens, why))

    def say_unavailable(self, reason: str) -> None:
        """Tell the app, once per stream, that the cloud is off for a configuration reason."""
        if not self._said_unavailable:
            self._said_unavailable = True
            self.emit(CloudUnavailable(clock.now(), reason))

    def deliver(self, engine: EngineName, chunk: Delta | Called | Mark) -> None:
        """Hand one chunk of the serving engine to the trace and the app."""
        if self._partial is not None:
            self._settle_partial(engine, chunk)
        if isinstance(chunk, Partial):
            self.rec.mark(chunk.name, chunk.t)  # the first one: when the answer showed
            self._partial = (engine, chunk.text)
            self.emit(PartialJSON(chunk.t, chunk.value, engine))
            return
        if isinstance(chunk, Resumed):
            pause = Pause(
                chunk.paused_at,
                chunk.t,
                chunk.reason,
                chunk.delivered_tokens,
                chunk.prefill_tokens,
            )
            self.rec.pause(pause)
            self.emit(
                Paused(
                    chunk.t,
                    engine,
                    pause.reason,
                    pause.delivered_tokens,
                    pause.ms,
                    pause.prefill_tokens,
                )
            )
        if isinstance(chunk, CallOpened) and not self.trace.token_times and not self._opened_first:
            self._opened_first = True  # the answer has started: a call is named
            self._check_deadline(engine, chunk.t)
        if isinstance(chunk, Mark):
            if isinstance(chunk, RequestSent) and chunk.limit is not None:
                self.rec.token_limit(chunk.limit)  # what the serving engine was asked
            if isinstance(chunk, RequestSent) and chunk.continuation is not None:
                self.rec.continued_in(chunk.continuation)
            self.rec.mark(chunk.name, chunk.t)
        elif isinstance(chunk, Called):  # a tool call counts as a token for the deadline
            if not self.trace.token_times and not self._opened_first:
                self._check_deadline(engine, chunk.t)
            self.rec.token(chunk.t, engine, clock.now())
            self.rec.tool_call(chunk.name)
            call = ToolCall(
                chunk.t, chunk.id, chunk.name, chunk.arguments, engine, chunk.confidence
            )
            self.calls.append(call)
            self.emit(call)
        elif chunk.text:
            if not self.trace.token_times:
                self._check_deadline(engine, chunk.t)
            self.rec.token(chunk.t, engine, clock.now())
            self._delivered.append(chunk.text)
            self._authors.add(engine)
            self.emit(Token(chunk.t, chunk.text, engine))

    def _settle_partial(self, engine: EngineName, chunk: Delta | Called | Mark) -> None:
        """Partial JSON snapshots were shown: the answer's text commits them; another engine's
        chunk, or a new attempt's snapshot that does not extend them, takes them back."""
        assert self._partial is not None
        shown_by, shown = self._partial
        if isinstance(chunk, Delta) and chunk.text and shown_by == engine:
            self._partial = None  # the whole answer, checked: what the snapshots showed
        elif shown_by != engine or (
            isinstance(chunk, Partial) and not chunk.text.startswith(shown)
        ):
            self._partial = None
            self.emit(Retract(clock.now(), shown))

    def _check_deadline(self, engine: EngineName, t: float) -> None:
        """The first token (at `t`) came: say so if it missed the first-token deadline."""
        if self._deadline_ms is None:
            return
        late_ms = (t - self.trace.t_start) * 1000.0 - self._deadline_ms
        if late_ms > 0:
            self.rec.deadline_missed(late_ms)
            self.emit(DeadlineMissed(t, engine, self._deadline_ms, late_ms))

    @property
    def delivered_text(self) -> str:
        """Everything handed to the app so far."""
        return "".join(self._delivered)

    def complete(self, engine: EngineName, finish: Finish | None) -> None:
        """Record the usage, summed over every attempt of the request, and end it. `finish`:
        the serving engine's last report (a plan's own sum where no attempt carries it)."""
        if finish is None:
            raise errors.EngineError("the engine stopped without finishing", engine=engine)
        trace = self.trace
        by_engine = tuple(trace.usage_by_engine())
        estimated = any(u.estimated for u in by_engine)
        reported = bool(trace.counted) or any(a.usage()[0] is not None for a in trace.attempts)
        prompt = sum(u.prompt_tokens for u in by_engine)
        prompt_tokens = prompt if reported or prompt else finish.prompt_tokens
        completion = sum(u.completion_tokens for u in by_engine)
        self.rec.usage(prompt_tokens, completion, finish.cached_prompt_tokens, estimated)
        self.rec.done(finish.reason, finish.t)
        now = clock.now()
        usage = Usage(now, engine, prompt_tokens or 0, completion, estimated, by_engine)
        self.emit(usage)
        parsed = None
        if self._json_answer and not self.calls and self._delivered:
            parsed = json.loads(self.delivered_text)  # checked whole (`runtime.checked`)
        self.emit(Done(now, finish.reason, self.rec.freeze(), parsed))

    async def relay(
        self, engine: Engine, request: GenerationRequest, handle: Callable[[Chunk], None]
    ) -> None:
        """Stream `engine` into `handle`, retrying a retryable failure before any content as the
        request's `RetryPolicy` allows (`runtime.retry`: every plan streams through here)."""
        await self.retry.run(
            partial(self._relay_once, engine, request, handle),
            first_token_due=lambda: not self._delivered and not self.calls,
            on_retry=self._retried,
        )

    def _retried(self, exc: errors.EngineError) -> None:
        self.rec.retried()

    async def _relay_once(
        self,
        engine: Engine,
        request: GenerationRequest,
        handle: Callable[[Chunk], None],
        tries: Tries,
    ) -> None:
        """One attempt, reporting the engine's health (first content token or a clean finish:
        healthy; an error: its outcome). The stream is always closed."""
        healthy = False
        attempt = self._attempt(engine, tries)
        try:
            raw = engine.stream(request)
            if request.assistant_prefix:  # a continuation: its seam judged before delivery
                # it goes on from text it alone wrote (a held text not yet delivered: not known)
                own = bool(self._authors) and self._authors <= {engine.name}
                raw = seamed(raw, request.assistant_prefix, engine.name, self.rec.seam, own=own)
            on_device = engine.info().on_device
            async with aclosing(checked(raw, request, engine.name, on_device=on_device)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, Finish):
                        attempt.finish = chunk
                    if isinstance(chunk, Finish) or is_content(chunk):
                        tries.content = True
                    if is_content(chunk):
                        attempt.content(clock.now())
                        if not healthy:
                            healthy = True
                            self.outcome(engine.name, None)
                    handle(chunk)
        except anyio.get_cancelled_exc_class():
            attempt.ended("cancelled", clock.now())
            raise
        except Exception as exc:
            attempt.ended("failed", clock.now(), exc)
            if isinstance(exc, errors.RefusedError):  # privacy / budget: never the secret
                self.refused(engine.name, exc)
            if isinstance(exc, errors.AuthenticationError | errors.CloudUnavailableError):
                # the key is missing or was refused: the engine says why until the key changes
                self.say_unavailable(engine.info().unavailable or str(exc))
            self.outcome(engine.name, exc)
            raise
        attempt.ended("finished", clock.now())
        if not healthy:
            self.outcome(engine.name, None)

    def _attempt(self, engine: Engine, tries: Tries) -> Attempt:
        """The trace's record of the engine stream that starts now (its role: the task's)."""
        return self.attempt(engine, spend_role.get(), tries.n)

    def attempt(self, engine: Engine, role: SpendRole, n: int = 1) -> Attempt:
        """An engine call starts now, in `role` (its record: close it with `Attempt.ended`)."""
        return self.rec.attempt(engine.name, engine.info().model, role, n)

    def outcome(self, engine: EngineName, exc: BaseException | None) -> None:
        """Report an engine's health to the client (circuit breakers)."""
        if self._on_outcome is not None:
            self._on_outcome(engine, exc)


class Stream:
    """One streaming request. Iterate for tokens, or use `events()` for typed events."""

    def __init__(self, run: RequestRun, recv: MemoryObjectReceiveStream[StreamItem]) -> None:
        self._run = run
        self._recv = recv
        self._thread = threading.get_ident()
        self._events_taken = False

    @property
    def trace(self) -> Trace:
        return self._run.trace

    # ---- token iteration ------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    def __anext__(self) -> Coroutine[Any, Any, str]:
        # A plain method returning a coroutine that does not hold the Stream: a cancelled or
        # failed `async for` keeps no reference cycle alive, so the Stream is dropped (and its
        # work stopped) at once.
        return _next_token(self._recv)

    # ---- events -----------------------------------------------------------------------------

    def events(self) -> _EventIterator:
        """Every typed event of the request (Route, Token, Usage, Done, ...), once."""
        if self._events_taken:
            raise errors.ClientStateError("events() can be iterated only once per stream")
        self._events_taken = True
        return _EventIterator(self._recv)

    # ---- lifetime ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the request (if still running) and wait until every engine has let go."""
        self._run.cancel()
        self._recv.close()
        with anyio.CancelScope(shield=True):
            await self._run.finished.wait()

    def __del__(self) -> None:
        # A bare `async for` that was left: stop the producer. CancelScope.cancel() must run on
        # the event loop's thread, which is where CPython drops the last reference.
        if self._run.finished.is_set():
            self._recv.close()
        elif threading.get_ident() == self._thread:
            try:
                self._run.cancel()
            except RuntimeError:  # no running event loop any more: nothing left to stop
                pass
            self._recv.close()


class _EventIterator:
    def __init__(self, recv: MemoryObjectReceiveStream[StreamItem]) -> None:
        self._recv = recv

    def __aiter__(self) -> Self:
        return self

    def __anext__(self) -> Coroutine[Any, Any, Event]:
        return _next_event(self._recv)


async def _next_event(recv: MemoryObjectReceiveStream[StreamItem]) -> Event:
    try:
        item = await recv.receive()
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        recv.close()
        raise StopAsyncIteration from None
    if isinstance(item, _Failure):
        recv.close()
        raise item.exc
    return item


async def _next_token(recv: MemoryObjectReceiveStream[StreamItem]) -> str:
    while True:
        event = await _next_event(recv)
        if isinstance(event, Token):
            return event.text
