"""`ScriptedEngine`: a test double that plays a script with exact timing.

For unit tests of orchestration timing only (deadlines, cancellation, event order). It is never a
stand-in for the real engines in integration tests. Its sleeps are the event loop's and its stamps
`hybridllm.clock.now()`, so on a virtual clock (`hybridllm.testing`) a script plays in no real
time and the trace shows its exact times.

    engine = ScriptedEngine("local", tokens=["Hel", "lo"], ttft_s=0.05, tpot_s=0.01)
    engine = ScriptedEngine("cloud", script=[0.2, "Hi", 0.01, "!", CloudConnectionError("reset")])

A script is a list of steps: a float sleeps that many seconds, a str is emitted as a delta,
a `ScriptedCall` as a complete tool call (the answer then finishes with "tool_calls"), an
exception instance is raised. A continuation (`assistant_prefix`) whose text the script's
leading steps write exactly plays the rest of the script from there (those steps, sleeps
included, are what the engine already did); any other prefix replays the whole script.

`serial=True` models a local engine's queue: one request plays at a time, the others wait in
the order of their calls (`info()` reports the depth and the expected wait: the script's sleeps
of the requests ahead), through the same `BoundedQueue` as `LlamaCppEngine`, so `max_queue` and
`max_queue_wait_s` bound it the same way (either one turns `serial` on).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

import anyio

from hybridllm import clock
from hybridllm.engines import validate
from hybridllm.engines.base import EngineInfo, GenerationRequest, Message
from hybridllm.engines.capabilities import EngineCheck
from hybridllm.engines.queue import BoundedQueue
from hybridllm.errors import InvalidArgumentError
from hybridllm.events import (
    PRIORITIES,
    Called,
    CallOpened,
    Chunk,
    Delta,
    EngineName,
    Finish,
    RequestSent,
)


@dataclass(frozen=True)
class ScriptedCall:
    """A script step: a tool call to `name` with `arguments` (JSON text, checked or not: the
    runtime checks it as it checks a real engine's)."""

    name: str
    arguments: str = "{}"
    id: str | None = None  # None: "call_<n>"
    confidence: float | None = None  # what `Called.confidence` says
    # the seconds its arguments take once its name is chosen: a `CallOpened` mark comes first,
    # the call that long after (None: the call comes whole, with no mark)
    arguments_s: float | None = None


Step = float | str | ScriptedCall | BaseException


class ScriptedEngine:
    def __init__(
        self,
        name: EngineName,
        *,
        tokens: Sequence[str] = (),
        ttft_s: float = 0.0,
        tpot_s: float = 0.0,
        script: Sequence[Step] | None = None,
        model: str = "scripted",
        supports_continuation: bool = True,
        token_count: int | None = None,
        serial: bool = False,
        max_queue: int | None = None,
        max_queue_wait_s: float | None = None,
        n_ctx: int | None = None,
        on_device: bool | None = None,
    ) -> None:
        """`supports_continuation`: what `info()` reports (a double of an engine that cannot go
        on from a started answer: False); `n_ctx`: the context `info()` reports (None: unknown;
        the double itself never overflows); `token_count`: what `count_tokens()` answers;
        `serial`, `max_queue`, `max_queue_wait_s`: a bounded FIFO queue (see the module).
        Checked when made (`InvalidArgumentError`): tokens are strings, `ttft_s` and `tpot_s`
        finite and >= 0, script steps a float >= 0, a str or an exception, `token_count` an
        int >= 0. `on_device`: what `info()` reports (None: a double named "local" runs on the
        device, any other is a cloud)."""
        validate.engine_name("name", name)
        for arg, value in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
            validate.number(arg, value, minimum=0.0)
        if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
            raise InvalidArgumentError("tokens", tokens, "a sequence of strings")
        for i, step in enumerate(script or ()):
            if not isinstance(step, str | ScriptedCall | BaseException):
                validate.number(f"script[{i}]", step, minimum=0.0)
            elif isinstance(step, ScriptedCall) and step.arguments_s is not None:
                validate.number(f"script[{i}].arguments_s", step.arguments_s, minimum=0.0)
        if token_count is not None:
            validate.integer("token_count", token_count, minimum=0)
        self.n_ctx = None if n_ctx is None else validate.integer("n_ctx", n_ctx, minimum=1)
        # what `check()` finds (`engines.capabilities.Checks`): set it to play an engine that
        # is unreachable, refuses its key or lacks its model
        self.check_result = EngineCheck(True, None, True, f"scripted {name}")
        self.name: EngineName = name
        self.on_device = name == "local" if on_device is None else on_device
        self.model = model
        if script is None:
            steps: list[Step] = []
            for i, tok in enumerate(tokens):
                steps += [ttft_s if i == 0 else tpot_s, tok]
            script = steps
        self.script = list(script)
        self.requests: list[GenerationRequest] = []
        self.active = 0
        self.closed_streams = 0
        self.emitted = 0
        self.started = False
        self.predicted_ttft_s: float | None = None  # what predict_ttft_s() answers
        self.supports_continuation = supports_continuation
        self.token_count = token_count
        self.queue: BoundedQueue | None = None
        if serial or max_queue is not None or max_queue_wait_s is not None:
            self.queue = BoundedQueue(name, max_queue=max_queue, max_queue_wait_s=max_queue_wait_s)
        self.duration_s = sum(s for s in self.script if isinstance(s, float | int))

    async def start(self) -> None:
        self.started = True

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return self.predicted_ttft_s

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return self.token_count

    async def check(self, timeout_s: float = 3.0) -> EngineCheck:
        """`check_result`, at once."""
        return self.check_result

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            model=self.model,
            supports_continuation=self.supports_continuation,
            queue_depth=self.active if self.queue is None else self.queue.depth,
            expected_wait_s=0.0 if self.queue is None else self.queue.expected_wait_s(),
            wait_by_priority=None
            if self.queue is None
            else {p: self.queue.expected_wait_s(p) for p in PRIORITIES},
            unavailable=None if self.queue is None else self.queue.unavailable(),
            n_ctx=self.n_ctx,
            on_device=self.on_device,
        )

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        queue = self.queue
        if queue is not None:
            await queue.acquire(self.duration_s, request.priority)  # QueueFullError past a bound
            queue.active = (clock.now(), self.duration_s)
        self.requests.append(request)  # the requests that got their turn
        self.active += 1
        n = calls = 0
        try:
            yield RequestSent(clock.now())
            for step in self._after(request.assistant_prefix):
                if isinstance(step, BaseException):
                    raise step
                if isinstance(step, ScriptedCall):
                    calls += 1
                    call_id = step.id or f"call_{calls}"
                    if step.arguments_s is not None:
                        yield CallOpened(clock.now(), call_name=step.name)
                        await anyio.sleep(step.arguments_s)
                    now = clock.now()
                    yield Called(call_id, step.name, step.arguments, now, step.confidence)
                elif isinstance(step, str):
                    n += 1
                    self.emitted += 1
                    yield Delta(step, clock.now())
                else:
                    await anyio.sleep(step)
            yield Finish("tool_calls" if calls else "stop", None, n, clock.now())
        finally:
            self.active -= 1
            self.closed_streams += 1
            if queue is not None:
                queue.release()

    def _after(self, prefix: str) -> list[Step]:
        """The script's steps after those that write `prefix` (all of them: none wrote it)."""
        written = ""
        for i, step in enumerate(self.script):
            if prefix and written == prefix:
                return self.script[i:]
            if isinstance(step, str):
                written += step
        return [] if prefix and written == prefix else self.script

    async def aclose(self) -> None:
        self.started = False
