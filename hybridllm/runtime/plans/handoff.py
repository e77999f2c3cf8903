"""The handoff plan: the local engine's fast start, the cloud's fast decode, one seamless stream.

`handoff()`: the local engine starts and its first `after_tokens` content tokens reach the app
at local TTFT. At that point the text delivered so far, T0, is fixed, and the cloud is asked to
continue the answer from exactly T0 (a continuation request: T0 as the start of the assistant
turn, `engines.base.chat_messages`), through the cloud guard like any cloud request (privacy,
budget; its cost is tagged "handoff").

The race between the two, and the scheme chosen: the local engine is STOPPED at T0 (its stream
closed, so it decodes no further) the moment the cloud is asked. Nothing past T0 exists, so when
the cloud's first content token arrives its continuation of T0 follows T0 directly: nothing
repeated, nothing lost, one visible stream (a `Handoff` event, `Trace.handoff`). The app sees
one pause at the seam, about the cloud's time to a first token for the continuation.

Why not let the local engine run on while the cloud is in flight: shown, its tokens past T0
would have to be found again at the start of the cloud's text and dropped, which needs the two
models to agree token for token (they rarely do; a mismatch costs a second round trip); held
back unshown, they cost device time and, on a device whose cores the cloud shares (this
machine's stand-in), slowed the cloud's prefill: measured on the 2-core benchmark, the pause at
the seam was 340-720 ms with the local engine decoding beside the stand-in cloud.

The pause at the seam is the cloud reading the continuation's prompt: the whole prompt plus T0
when nothing of it is cached. `warm_cloud` (the policy's `handoff_warm_cloud`) asks the cloud at
once, beside the local engine, for one token of the same prompt (`warm_task`, cost tagged
"handoff"; its answer is dropped): a cloud that caches prefixes then reads only T0 at the seam,
the prompt's prefill hidden behind the local part. The local part then ends (T0 is fixed) at the
first local token at which the warm-up has answered, or at `after_tokens`, whichever comes first:
the cloud is asked as soon as it can continue at once, and the local engine fills the wait.

The hold is bounded: if the cloud fails before its first token, or sends none within
`cloud_wait_s` (the policy's `stall_ms`, else `CLOUD_WAIT_S`), the handoff is abandoned: the
cloud request is cancelled and the local engine resumes from T0 (a continuation request: its KV
cache holds T0, so it costs about a decode step), with no seam either. If the local engine
fails before the handoff, or has no token by the request's deadline, the cloud is asked at once
to continue from what was delivered (from nothing: it answers). Once the cloud serves, a failure
or a stall (`stall_s`) moves the answer back to the local engine, which continues from the
delivered text (once), as the race's mid-stream failover does.

One coordinator, `_Handoff.serve()`, owns the state; the engine tasks and the timer only post.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import anyio
from anyio.abc import TaskGroup

from hybridllm import clock
from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.errors import AllEnginesFailedError, EngineError, StallError
from hybridllm.events import (
    Called,
    Chunk,
    Delta,
    Finish,
    Mark,
    is_content,
)
from hybridllm.runtime.plans.registry import Plan, PlanContext, register
from hybridllm.runtime.stream import RequestRun
from hybridllm.runtime.trace import HandoffOutcome, HandoffRecord, SpendRole, spend_role

# the longest the visible stream waits for the cloud's first token once the local part is done,
# for a policy without a stall_ms (with one, that is the bound: the hold is a silence)
CLOUD_WAIT_S = 1.0

Phase = Literal["local", "hold", "cloud", "local-only"]


@dataclass(frozen=True, slots=True)
class _Timer:
    """A timer's or the warm-up's word on the plan's channel: which one (`kind`: the local
    first-token deadline passed, the cloud's wait for its first token passed, the cloud answered
    the warm-up, so its prefix cache holds the prompt) and why, in words for people."""

    kind: Literal["deadline", "cloud_wait", "warm"]
    why: str = ""


_Item = tuple[int, Chunk | Exception | None] | _Timer  # (task id, what it sent) or a timer


def build_handoff(ctx: PlanContext) -> Plan:
    """The handoff plan for a decision whose plan is "handoff" (`runtime.plans.registry`)."""
    policy, stall_s = ctx.policy, ctx.stall_s
    return partial(
        handoff,
        local=ctx.engines["local"],
        cloud=ctx.engines["cloud"],
        request=ctx.request,
        reason=ctx.decision.reason,
        after_tokens=policy.handoff.after_tokens,
        warm_cloud=policy.handoff.warm_cloud,
        cloud_wait_s=stall_s or CLOUD_WAIT_S,
        stall_s=stall_s,
        deadline_s=ctx.decision.deadline_s,
    )


async def handoff(
    run: RequestRun,
    local: Engine,
    cloud: Engine,
    request: GenerationRequest,
    *,
    reason: str,
    after_tokens: int,
    cloud_wait_s: float = CLOUD_WAIT_S,
    stall_s: float | None = None,
    deadline_s: float | None = None,
    warm_cloud: bool = False,
) -> None:
    """Run the plan (see the module). `deadline_s`: a local engine without a token by then hands
    off at once (the cloud continues from nothing: it answers). `warm_cloud`: ask the cloud for
    one token of the prompt at once (its prefix cache then holds the prompt at the seam)."""
    run.route(local, reason)
    async with anyio.create_task_group() as tg:
        h = _Handoff(run, local, cloud, request, tg, after_tokens, cloud_wait_s, stall_s)
        if deadline_s is not None:
            tg.start_soon(h.deadline_task, deadline_s)
        if warm_cloud:
            tg.start_soon(h.warm_task)
        await h.serve()
    h.conclude()  # outside the task group: the app gets a typed, unwrapped error


class _Handoff:
    def __init__(
        self,
        run: RequestRun,
        local: Engine,
        cloud: Engine,
        request: GenerationRequest,
        tg: TaskGroup,
        after_tokens: int,
        cloud_wait_s: float,
        stall_s: float | None,
    ) -> None:
        self.run, self.local, self.cloud, self.request, self.tg = run, local, cloud, request, tg
        self.after_tokens, self.cloud_wait_s, self.stall_s = after_tokens, cloud_wait_s, stall_s
        self.send, self.recv = anyio.create_memory_object_stream[_Item](math.inf)
        self.phase: Phase = "local"
        self.next_id = 0
        self.scopes: dict[int, anyio.CancelScope] = {}
        self.engine_of: dict[int, Engine] = {}
        self.serving = -1  # the task whose chunks reach the app
        self.local_id = -1
        self.cloud_id: int | None = None
        self.local_tokens = 0
        self.local_error: Exception | None = None  # the local engine failed before the handoff
        self.record: HandoffRecord | None = None  # where the cloud was asked (the trace's)
        self.finish: Finish | None = None
        self.attempts: list[tuple[str, BaseException, float]] = []
        self.over = False
        self.fatal: Exception | None = None
        self.timer = anyio.CancelScope()
        self.deadline_scope = anyio.CancelScope()
        self.warm_scope = anyio.CancelScope()
        self.warm = False  # the cloud answered the warm-up (`warm_task`)
        self.failed_back = False
        self.held_marks: list[Mark] = []  # the cloud's marks before its first token

    # ---- the coordinator ---------------------------------------------------------------------

    async def serve(self) -> None:
        try:
            self.local_id = self.serving = self.start(self.local, self.request, "primary")
            async with self.recv:
                while not self.over:
                    await self._next()
        finally:
            for scope in self.scopes.values():
                scope.cancel()
            self.timer.cancel()
            self.send.close()  # what a stopping task still posts is dropped (`_post`)
            self.deadline_scope.cancel()
            self.warm_scope.cancel()

    async def _next(self) -> None:
        limit = math.inf
        if self.stall_s is not None and self.phase != "hold" and self.run.delivered_text:
            limit = self.stall_s  # while an engine serves, after the first token
        with anyio.move_on_after(limit) as quiet:
            item = await self.recv.receive()
        if quiet.cancelled_caught:
            assert self.stall_s is not None
            name = self.engine_of[self.serving].name
            self._on_error(self.serving, StallError.after(self.stall_s, name))
        elif isinstance(item, _Timer):
            self._on_timer(item)
        else:
            cid, got = item
            if cid not in self.scopes or self.scopes[cid].cancel_called:
                return  # what a stopped task sent before it stopped
            if isinstance(got, Exception):
                self._on_error(cid, got)
            elif got is None:
                self._on_end(cid)
            elif isinstance(got, Finish):
                self._on_finish(cid, got)
            else:
                self._on_chunk(cid, got)

    def _on_timer(self, item: _Timer) -> None:
        if item.kind == "deadline":
            if self.phase == "local" and not self.run.delivered_text:
                self.ask_cloud()  # the local engine missed the deadline: the cloud answers
                assert self.record is not None
                self.record.outcome, self.record.detail = "asked_at_deadline", item.why
        elif item.kind == "warm":
            self.warm = True
            if self.phase == "local" and self.local_tokens >= 1:
                self.ask_cloud()  # the cloud is ready: no reason to go on locally
        elif self.phase == "hold":
            self.abandon("cloud_too_slow", item.why)

    def conclude(self) -> None:
        if self.fatal is not None:
            raise self.fatal
        self.run.complete(self.engine_of[self.serving].name, self.finish)

    # ---- handlers ----------------------------------------------------------------------------

    def _on_chunk(self, cid: int, chunk: Delta | Called | Mark) -> None:
        if cid == self.serving and self.phase != "hold":
            self.run.deliver(self.engine_of[cid].name, chunk)
            if self.phase == "local" and isinstance(chunk, Delta) and chunk.text:
                self.local_tokens += 1
                if self.local_tokens >= self.after_tokens or self.warm:
                    self.ask_cloud()
        elif cid == self.cloud_id and self.phase == "hold":
            if isinstance(chunk, Mark):  # its marks (the request sent, its dialect) wait for it
                self.held_marks.append(chunk)
            if not is_content(chunk):
                return
            self.switch()
            self.run.deliver(self.cloud.name, chunk)

    def _on_finish(self, cid: int, finish: Finish) -> None:
        if cid == self.serving and self.phase != "hold":
            self.finish = finish
        elif cid == self.cloud_id and self.phase == "hold":  # the answer ended exactly at T0
            self.switch()
            self.finish = finish

    def _on_end(self, cid: int) -> None:
        if cid == self.cloud_id and self.phase == "hold":
            self.abandon("cloud_failed", "it stopped without a token")
            return
        if cid != self.serving or self.phase == "hold":
            return
        if self.finish is None:
            name = self.engine_of[cid].name
            self._on_error(cid, EngineError("the engine stopped without finishing", engine=name))
        else:
            self.over = True

    def _on_error(self, cid: int, exc: Exception) -> None:
        ms = (clock.now() - self.run.trace.t_start) * 1e3
        self.attempts.append((self.engine_of[cid].name, exc, ms))
        if cid == self.cloud_id and self.phase == "hold":
            self.abandon("cloud_failed", str(exc))
        elif cid == self.local_id and self.phase == "local":
            self.ask_cloud(failed=exc)  # the cloud continues from what was delivered at once
        elif cid == self.serving and self.phase == "cloud" and not self.failed_back:
            self.fail_back(exc)
        elif cid == self.serving and self.phase != "hold":
            self._fail(self.all_failed() if len(self.attempts) > 1 else exc)

    # ---- the moves ---------------------------------------------------------------------------

    def start(self, engine: Engine, request: GenerationRequest, role: SpendRole) -> int:
        cid = self.next_id
        self.next_id += 1
        self.scopes[cid] = scope = anyio.CancelScope()
        self.engine_of[cid] = engine
        self.run.started(engine.name)
        self.tg.start_soon(self._task, cid, scope, engine, request, role)
        return cid

    def continuation(self, max_less: int) -> GenerationRequest:
        delivered = self.run.delivered_text
        return dataclasses.replace(
            self.request,
            assistant_prefix=self.request.assistant_prefix + delivered,
            max_tokens=max(1, self.request.max_tokens - max_less),
        )

    def ask_cloud(self, failed: Exception | None = None) -> None:
        """Fix T0 (the text delivered now), stop the local engine there and ask the cloud to
        continue from T0 (see the module)."""
        record = HandoffRecord(clock.now(), len(self.run.delivered_text), self.local_tokens)
        self.record = record
        self.run.plan_record(record)
        self.phase = "hold"
        self.scopes[self.local_id].cancel()
        if failed is not None:
            self.local_error = failed
            record.outcome, record.detail = "asked_after_local_failed", str(failed)
        self.cloud_id = self.start(self.cloud, self.continuation(self.local_tokens), "handoff")
        self.tg.start_soon(self._timer_task)

    def switch(self) -> None:
        """The cloud's first token: the answer moves to it."""
        assert self.cloud_id is not None and self.record is not None
        self.timer.cancel()
        self.phase, self.serving = "cloud", self.cloud_id
        for mark in self.held_marks:  # the serving engine's marks, in the trace before its text
            self.run.deliver(self.cloud.name, mark)
        rec = self.record
        why = f"cloud continues after {rec.local_tokens} local tokens ({rec.local_chars} chars)"
        self.run.handed_off(rec, self.local.name, self.cloud.name, why)

    def abandon(self, outcome: HandoffOutcome, why: str) -> None:
        """No handoff: stop the cloud; the local engine resumes from T0."""
        assert self.cloud_id is not None and self.record is not None
        self.timer.cancel()
        self.scopes[self.cloud_id].cancel()
        self.record.outcome, self.record.detail = outcome, why
        if self.local_error is not None:  # the local engine failed first: no engine is left
            self._fail(self.all_failed())
            return
        resumed = self.continuation(self.local_tokens)
        self.local_id = self.serving = self.start(self.local, resumed, "continuation")
        self.phase = "local-only"

    def fail_back(self, exc: Exception) -> None:
        """The cloud failed mid-answer: the local engine continues from the delivered text."""
        self.failed_back = True
        old = self.serving
        self.scopes[old].cancel()
        self.run.switched(self.cloud.name, self.local.name, exc)
        n = self.run.trace.n_tokens
        self.serving = self.start(self.local, self.continuation(n), "continuation")
        self.local_id, self.phase, self.finish = self.serving, "local-only", None

    def all_failed(self) -> AllEnginesFailedError:
        return AllEnginesFailedError(self.attempts, received_content=bool(self.run.delivered_text))

    def _fail(self, exc: Exception) -> None:
        self.fatal, self.over = exc, True

    # ---- the tasks: they only post -----------------------------------------------------------

    def _post(self, item: _Item) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.send.send_nowait(item)

    async def _task(
        self,
        cid: int,
        scope: anyio.CancelScope,
        engine: Engine,
        request: GenerationRequest,
        role: SpendRole,
    ) -> None:
        spend_role.set(role)  # what this task's cloud request costs is tagged with its role
        with scope:
            try:
                await self.run.relay(engine, request, lambda ch: self._post((cid, ch)))
                self._post((cid, None))
            except Exception as exc:  # judged by the coordinator
                self._post((cid, exc))

    async def warm_task(self) -> None:
        """One token of the prompt from the cloud, dropped: its prefix cache now holds the
        prompt. Ended with the plan; a failure here only shows in the engine's health."""
        spend_role.set("handoff")
        warm = dataclasses.replace(self.request, max_tokens=1)
        with self.warm_scope, contextlib.suppress(Exception):
            await self.run.relay(self.cloud, warm, lambda _chunk: None)
            self._post(_Timer("warm"))

    async def deadline_task(self, deadline_s: float) -> None:
        with self.deadline_scope:
            await anyio.sleep(max(0.0, self.run.trace.t_start + deadline_s - clock.now()))
            self._post(_Timer("deadline", f"no local token within {deadline_s * 1e3:.0f} ms"))

    async def _timer_task(self) -> None:
        with self.timer:
            await anyio.sleep(self.cloud_wait_s)
            self._post(_Timer("cloud_wait", f"no token within {self.cloud_wait_s * 1e3:.0f} ms"))


register("handoff", build_handoff, builtin=True)
