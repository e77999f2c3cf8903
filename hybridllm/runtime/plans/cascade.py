"""The cascade plan: the local model starts, and its own confidence decides who answers.

1. The local engine prefills the prompt and decodes its first greedy tokens, holding them back
   (at most the policy's `cascade_hold_tokens`, for at most `cascade_hold_ms`):
   `LlamaCppEngine.signals()`, the same measurement router stage 2 was trained on.
2. The router combines stage 1 (the text) with those signals (`RouterScore.value`, stage 2).
   At or below the threshold (from `target_cloud_share` / `quality_floor` on stage 2's own
   calibration, or `router_threshold`), the held text is released and the local engine goes on
   from it (its KV cache holds the prompt and the held tokens: nothing is computed twice).
   Above it, the request goes to the cloud before anything was shown; the local work has
   stopped already.
3. Hedged cascade (`cascade_hedge`): where stage 1 alone would send the prompt to the cloud,
   the cloud starts at once, in parallel with the hold, its chunks buffered; a confident local
   model cancels it (a cloud request paid for), otherwise its buffered answer is shown.
4. The hold counts against the first-token deadline: when the signals cannot come inside it
   (or `cascade_hold_ms`), the hold stops and the request runs as today's race (hedged: the
   cloud already started answers, no second cloud request; local if it fails before its first
   token). A local answer
   that fails (or stalls past `stall_ms`) after its release fails over to the cloud, which
   continues from the delivered text, as in the race (`Fallback`, `trace.switches`;
   `trace.cascade.failover`), where the decision allows a failover.
5. Under `complete()` (nothing is streamed) with `cascade_judge = "answer"`, the hold is the
   whole local answer (greedy, up to `max_tokens`; `cascade_hold_ms` does not cut it, the
   deadline does): stage 2's "answer" models read the log-probabilities over all the
   answer's tokens and the figures only a whole answer has (its length, whether it ended,
   its last tokens, its repeats: `routing/answer_figures.py`; a multiple-choice answer by its
   first tokens), and the cloud is asked only when that says the answer will not do.
   `trace.cascade.judge` says which ran; its `signals` are the first 8 tokens' (what stage
   2 learns from, `router train --from-log`), `answer_signals` the whole answer's,
   `local_tokens` the local work.

`routing.decide` chooses this plan (`Decision.plan == "cascade"`, from the policy, the plan
asked for, the router's presence and the local engine's `ReadsSignals` capability; under
`complete()` `Decision.cascade_judge` may be "answer"); `build_cascade` only builds it.
Every cloud request goes through the engine the client gives (the guard: privacy, budget).
The decision, held time and signals are in `trace.cascade` (and the decision log).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from hybridllm import clock, errors
from hybridllm.engines.base import Engine, GenerationRequest, Message
from hybridllm.engines.capabilities import NamesItsModel, ReadsSignals
from hybridllm.events import Chunk, Delta, Finish
from hybridllm.policy import Policy
from hybridllm.runtime.plans.race import race
from hybridllm.runtime.plans.registry import Plan, PlanContext, register
from hybridllm.runtime.plans.single import collector, relay_watched, single
from hybridllm.runtime.stream import RequestRun
from hybridllm.runtime.trace import CascadeRecord

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hybridllm.engines.llama.signals import LocalSignals
    from hybridllm.routing.score import RouterScore

log = logging.getLogger("hybridllm.routing")


@dataclasses.dataclass(frozen=True)
class CascadeSettings:
    hold_tokens: int
    hold_s: float
    cut: float  # combined score above it: the cloud
    text_cut: float | None = None  # stage 1 above it: "unsure", the cloud starts at once
    hedge: bool = False
    judge: Literal["prefix", "answer"] = "prefix"  # "answer": the whole local answer
    failover: bool = True  # a released local answer that fails goes on in the cloud
    rotations_s: float = math.inf  # the most the option rotations may be priced at


async def cascade(
    run: RequestRun,
    local: Engine,
    cloud: Engine,
    request: GenerationRequest,
    *,
    router: Any,
    settings: CascadeSettings,
    deadline_s: float | None,
    stall_s: float | None = None,
    reason: str = "cascade",
) -> None:
    """Run `request` as a cascade (see the module's text)."""
    if not isinstance(local, ReadsSignals):  # `cascade_for` runs a cascade only with one
        raise errors.ConfigError(
            f"a cascade needs a local engine that reads its own signals ({type(local).__name__}"
            " does not)"
        )
    trace = run.trace
    whole = settings.judge == "answer"
    budget = math.inf if whole else settings.hold_s
    if deadline_s is not None:
        budget = min(budget, deadline_s - (clock.now() - trace.t_start))
    n_answer = request.max_tokens if whole else settings.hold_tokens
    text = float(router.score(request.messages))
    hedged = settings.hedge and settings.text_cut is not None and text > settings.text_cut
    info = CascadeRecord(round(text, 6), hedged, settings.cut, settings.judge)
    run.plan_record(info)
    try:  # the plan's own error comes out as itself, not in an ExceptionGroup (`first_error`)
        async with anyio.create_task_group() as tg:
            buffer: MemoryObjectReceiveStream[Chunk | Exception | None] | None = None
            cloud_scope = anyio.CancelScope()
            if hedged:
                buffer = _start_buffered(tg, run, cloud, request, cloud_scope)
            sig, failed, held_ms = await _hold(
                local, request, n_answer, budget, settings.rotations_s
            )
            info.held_ms = round(held_ms, 1)
            if failed is not None:
                run.outcome(local.name, failed)
                info.decision = "cloud"
                why = f"{reason}: local failed before deciding ({failed}) -> cloud"
                if buffer is not None:
                    await _serve_buffered(run, cloud, buffer, why)
                    return
            elif sig is None and buffer is not None:  # hedged: the cloud started is not repeated
                info.decision = "cloud"
                why = (
                    f"{reason}: no local confidence within {budget * 1e3:.0f} ms -> the cloud "
                    "started at once"
                )
                await _serve_buffered(run, cloud, buffer, why, fallback=(local, request, stall_s))
                return
            elif sig is None:  # no decision inside the hold: today's race
                cloud_scope.cancel()
                info.decision = "race"
                why = f"{reason}: no local confidence within {budget * 1e3:.0f} ms -> race"
                await race(
                    run, local, cloud, request, deadline_s=deadline_s, reason=why, stall_s=stall_s
                )
                return
            else:
                release, why = _judge(router, request, sig, settings, info, held_ms, reason)
                if release:
                    cloud_scope.cancel()
                    backup = cloud if settings.failover else None
                    await _release(
                        run, local, request, sig, f"{why} -> local", cloud=backup, stall_s=stall_s
                    )
                    return
                if buffer is not None:
                    why = f"{why} -> cloud (started at once)"
                    rescue = (local, request, stall_s) if settings.failover else None
                    await _serve_buffered(run, cloud, buffer, why, fallback=rescue)
                    return
                why = f"{why} -> cloud"
            cloud_scope.cancel()
    except BaseExceptionGroup as group:
        raise errors.first_error(group) from None
    await _to_cloud(run, local, cloud, request, why, settings, stall_s)


async def _to_cloud(
    run: RequestRun,
    local: Engine,
    cloud: Engine,
    request: GenerationRequest,
    why: str,
    settings: CascadeSettings,
    stall_s: float | None,
) -> None:
    """The cascade sent the answer to the cloud: the local engine is its fallback where the
    decision allows one (a cloud that fails before its first token, or mid-stream, leaves the
    answer to it, as in the race); the answer is never lost to a cloud failure."""
    if not settings.failover:
        await single(run, cloud, request, why, stall_s=stall_s)
        return
    await race(run, cloud, local, request, deadline_s=None, reason=why, stall_s=stall_s)


async def _hold(
    local: ReadsSignals,
    request: GenerationRequest,
    n_answer: int,
    budget: float,
    rotations_max_s: float | None = None,
) -> tuple[LocalSignals | None, Exception | None, float]:
    """The local model's own signals read within the hold (`budget` seconds): the signals (None
    when the hold ran out first), the engine's error if it failed first, the ms held.
    `rotations_max_s`: the most a multiple-choice prompt's option rotations may add."""
    t0 = clock.now()
    sig = None
    failed: Exception | None = None
    with anyio.move_on_after(max(budget, 0.0)):
        try:
            sig = await local.signals(
                request.messages,
                n_answer,
                rotations_within_s=rotations_within(budget),
                rotations_max_s=rotations_max_s,
            )
        except errors.EngineError as exc:  # queue full, engine failure: the cloud answers
            failed = exc
    return sig, failed, (clock.now() - t0) * 1e3


def _judge(
    router: Any,
    request: GenerationRequest,
    sig: LocalSignals,
    settings: CascadeSettings,
    info: CascadeRecord,
    held_ms: float,
    reason: str,
) -> tuple[bool, str]:
    """Stage 2 on the held signals: whether the local answer is released, and why in words."""
    from hybridllm.routing.stage2 import router_score  # numpy: once a cascade runs

    whole = settings.judge == "answer"
    head, values = _whole_answer_inputs(sig) if whole else (sig.values, sig.values)
    score = router_score(
        router, request.messages, values, sig.cost_ms, whole=whole, extra_ms=sig.rotations_ms
    )
    release = score.value <= settings.cut
    _describe(info, score, release, len(sig.answer))
    if whole:
        _judged_whole(info, sig, head, values)
    rel = "<=" if release else ">"
    n_held = len(sig.logprobs)
    held = (
        f"judging the whole local answer ({n_held} tokens, {held_ms:.0f} ms)"
        if whole
        else f"holding {held_ms:.0f} ms"
    )
    why = f"{reason}: combined score {score.value:.2f} {rel} {settings.cut:.2f} after {held}"
    return release, why


def _whole_answer_inputs(sig: Any) -> tuple[dict[str, float], dict[str, float]]:
    """(the first 8 tokens' figures, stage 2's inputs for the whole answer): the inputs
    (`stage2.whole_inputs`) are those figures (what the other models read) with the
    log-probability summary over all the answer's tokens and the figures only a whole answer
    has (`routing/answer_figures.py`); a multiple-choice answer is judged by its first tokens,
    as stage 2 learnt it."""
    from hybridllm.engines.llama.signals import N_ANSWER, prefix_signals
    from hybridllm.routing.answer_figures import whole_figures
    from hybridllm.routing.stage2 import whole_inputs

    head = prefix_signals(sig.values, sig.logprobs, N_ANSWER)
    tokens = sig.tokens if len(sig.tokens) == len(sig.logprobs) else None
    figures = whole_figures(tokens, sig.logprobs, sig.ended)
    return head, whole_inputs(head, {**sig.values, **figures})


def _judged_whole(
    info: CascadeRecord, sig: Any, head: dict[str, float], values: dict[str, float]
) -> None:
    """The trace of a whole-answer judgement: the first 8 tokens' figures (`head`) as `signals`
    (the prefix models' training form, what the decision log learns from), the whole answer's
    beside them (over all its tokens, with the figures only it has, from `values`)."""

    def clean(values: dict[str, float]) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else round(v, 6)) for k, v in values.items()}

    info.answer_signals = clean({**values, **sig.values})
    info.signals = clean(head)
    info.local_tokens = len(sig.logprobs)


def _until_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` up to its first stop string, and whether one was found."""
    cuts = [i for i in (text.find(x) for x in stop if x) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def _describe(info: CascadeRecord, score: RouterScore, release: bool, held_chars: int) -> None:
    """The scored decision on the trace's cascade record."""
    info.decision = "local" if release else "cloud"
    info.value = round(score.value, 6)
    info.model = score.model
    info.local = None if score.local is None else round(score.local, 6)
    info.signals = {k: (None if math.isnan(v) else round(v, 6)) for k, v in score.signals.items()}
    info.cost_ms = round(score.cost_ms, 1)
    info.extra_ms = round(score.extra_ms, 1)
    info.held_chars = held_chars


async def _release(
    run: RequestRun,
    local: Engine,
    request: GenerationRequest,
    sig: Any,
    why: str,
    *,
    cloud: Engine | None = None,
    stall_s: float | None = None,
) -> None:
    """Show the held text, then let the local engine go on from it; if it fails on the way,
    the `cloud` (None: no failover) continues from the delivered text."""
    run.route(local, why)
    held, stopped = _until_stop(sig.answer, request.stop)
    if held:
        run.deliver(local.name, Delta(held, clock.now()))
    used = min(int(sig.values.get("answer_tokens") or 0), request.max_tokens)
    run.counted(local.name, sig.prompt_tokens, used)  # the held answer: the signals' tokens
    if sig.ended or stopped or used >= request.max_tokens:
        finish = Finish(
            "stop" if sig.ended or stopped else "length", sig.prompt_tokens, used, clock.now()
        )
        run.complete(local.name, finish)
        return
    rest = dataclasses.replace(
        request,
        assistant_prefix=request.assistant_prefix + held,
        max_tokens=request.max_tokens - used,
    )
    handle, finishes = collector(run, local.name)
    try:
        await relay_watched(run, local, rest, handle, stall_s)
    except errors.EngineError as exc:
        if cloud is None:
            raise
        # tokens delivered: the held ones (one delta) and the released stream's since
        n = used + run.trace.n_tokens - (1 if held else 0)
        await _fail_over(run, local, cloud, request, exc, stall_s, n)
        return
    run.complete(local.name, finishes[-1] if finishes else None)


async def _fail_over(
    run: RequestRun,
    local: Engine,
    cloud: Engine,
    request: GenerationRequest,
    exc: Exception,
    stall_s: float | None,
    n_delivered: int,
) -> None:
    """The released local answer failed: the cloud continues from the delivered text (once, as
    the race plan's mid-stream failover does); if it fails too, no engine could answer."""
    trace, delivered, now = run.trace, run.delivered_text, clock.now()
    attempts: list[tuple[str, BaseException, float]] = [
        (local.name, exc, (now - trace.t_start) * 1e3)
    ]
    why = f"{local.name} failed mid-stream: {exc}"
    if trace.cascade is not None:  # the plan's own record (`run.plan_record`)
        trace.cascade.failover = why
    run.switched(local.name, cloud.name, exc, reason=why, t=now)
    cont = dataclasses.replace(  # the rest of the answer: what is left of max_tokens
        request,
        assistant_prefix=request.assistant_prefix + delivered,
        max_tokens=max(1, request.max_tokens - n_delivered),
    )
    handle, finishes = collector(run, cloud.name)
    try:
        await relay_watched(run, cloud, cont, handle, stall_s)
    except (errors.EngineError, errors.RefusedError) as exc2:
        attempts.append((cloud.name, exc2, (clock.now() - trace.t_start) * 1e3))
        raise errors.AllEnginesFailedError(attempts, received_content=True) from exc2
    run.complete(cloud.name, finishes[-1] if finishes else None)


def _start_buffered(
    tg: Any, run: RequestRun, cloud: Engine, request: GenerationRequest, scope: anyio.CancelScope
) -> MemoryObjectReceiveStream[Chunk | Exception | None]:
    """Start the cloud now; its chunks wait in a buffer until the cascade decides."""
    send, recv = anyio.create_memory_object_stream[Chunk | Exception | None](math.inf)
    why = "cascade: stage 1 is unsure, the cloud starts at once"
    run.fell_back(run.trace.engine or run.trace.device or "local", cloud.name, why, "parallel")

    async def go() -> None:
        with scope, send:
            try:
                await run.relay(cloud, request, send.send_nowait)
                send.send_nowait(None)
            except Exception as exc:  # handed to the cascade, which decides what it means
                send.send_nowait(exc)

    tg.start_soon(go)
    return recv


async def _serve_buffered(
    run: RequestRun,
    cloud: Engine,
    recv: MemoryObjectReceiveStream[Chunk | Exception | None],
    why: str,
    fallback: tuple[Engine, GenerationRequest, float | None] | None = None,
) -> None:
    """Show the cloud's buffered answer; with `fallback` (the local engine, the request, the
    stall limit), a cloud that fails before its first token leaves the answer to local."""
    run.route(cloud, why)
    finish: Finish | None = None
    async with recv:
        async for item in recv:
            if item is None:
                break
            if isinstance(item, Exception):
                if (
                    fallback is None
                    or run.delivered_text
                    or not isinstance(item, errors.EngineError | errors.RefusedError)
                ):
                    raise item
                local, request, stall_s = fallback
                run.fell_back(cloud.name, local.name, str(item), "failed")
                await single(
                    run, local, request, f"{why}; it failed ({item}) -> local", stall_s=stall_s
                )
                return
            if isinstance(item, Finish):
                finish = item
            else:
                run.deliver(cloud.name, item)
    run.complete(cloud.name, finish)


def build_cascade(ctx: PlanContext) -> Plan:
    """The cascade plan for a decision whose plan is "cascade" (`routing.decide` chose it:
    both engines may serve, the local one reads its own signals, there is a router);
    `decision.cascade_judge` says what the router's stage 2 judges."""
    decision, policy, router = ctx.decision, ctx.policy, ctx.routing.router
    assert router is not None  # decide() chooses the cascade only with a router
    judge = decision.cascade_judge or "prefix"
    settings = CascadeSettings(
        hold_tokens=policy.cascade.hold_tokens,
        hold_s=policy.cascade.hold_ms / 1000.0,
        rotations_s=policy.cascade.rotations_ms / 1000.0,
        cut=policy_cut(router, policy, _judged_by(router, judge)),
        text_cut=policy_cut(router, policy, None),
        hedge=policy.cascade.hedge,
        judge=judge,
        failover=decision.failover,
    )
    return partial(
        cascade,
        local=ctx.engines["local"],
        cloud=ctx.engines["cloud"],
        request=ctx.request,
        router=router,
        settings=settings,
        deadline_s=decision.deadline_s,
        stall_s=ctx.stall_s,
    )


def _judged_by(router: Any, judge: str) -> str:
    """The stage-2 model whose calibration sets the threshold: the "answer" model when a whole
    answer is judged and the artifact has one (`stage2.WHOLE`), else the combined one."""
    models = getattr(router, "stage2", None) or {}
    return "combined_answer" if judge == "answer" and "combined_answer" in models else "combined"


def policy_cut(router: Any, policy: Policy, kind: str | None) -> float:
    """The threshold a policy sets: `router_threshold` as it is, else from `target_cloud_share`
    or `quality_floor` on stage 2's calibration (`kind`) or stage 1's (None); default 30%."""
    if policy.routing.router_threshold is not None:
        return policy.routing.router_threshold
    model = (getattr(router, "stage2", None) or {}).get(kind) if kind else None
    source = model if model is not None else router
    if policy.routing.quality_floor is not None:
        return float(source.threshold(quality_floor=policy.routing.quality_floor))
    share = 0.3 if policy.routing.target_cloud_share is None else policy.routing.target_cloud_share
    return float(source.threshold(cloud_share=share))


def warn_foreign_stage2(router: Any, engines: Iterable[object]) -> bool:
    """Say (a WARNING, once per client) where the local model is not the one stage 2's heads
    were trained on: routing reads the router's text stage (stage 1) only, but a cascade's
    judge and `router_score()` would read this model's signals through another model's heads.
    True when said."""
    trained = getattr(router, "stage2_model", None)
    if not getattr(router, "stage2", None) or trained is None:
        return False
    for engine in engines:
        model = engine.model_id if isinstance(engine, NamesItsModel) else None
        if model is not None and model != trained:
            log.warning(
                "the local model %s is not %s, the model the router's stage-2 heads were "
                "trained on: routing uses the router's text stage; a cascade's judge reads %s's "
                "signals through %s's heads (retrain them: `hybridllm router train --signals`)",
                model, trained, model, trained,
            )  # fmt: skip
            return True
    return False


async def score_messages(
    router: Any,
    local: Engine | None,
    messages: Sequence[Message],
    n_answer: int = 8,
    *,
    rotations_max_s: float | None = None,
) -> RouterScore:
    """`HybridClient.router_score`: stage 1, and with a local engine that reads its own
    signals, stage 2 and the combination; a multiple-choice prompt's option rotations are read
    where they are priced at most `rotations_max_s` (None: always)."""
    from hybridllm.routing.stage2 import router_score

    if router is None:
        raise errors.ConfigError("router_score needs a router (the client has none)")
    if not isinstance(local, ReadsSignals):
        return router_score(router, messages, None)
    sig = await local.signals(messages, n_answer, rotations_max_s=rotations_max_s)
    return router_score(router, messages, sig.values, sig.cost_ms, extra_ms=sig.rotations_ms)


def rotations_within(budget: float) -> float | None:
    """How long the option rotations of a multiple-choice prompt may take inside the hold: half
    of it, the rest left for the prompt itself and the held tokens (none past the budget)."""
    return None if math.isinf(budget) else max(budget, 0.0) / 2


register("cascade", build_cascade, builtin=True)
