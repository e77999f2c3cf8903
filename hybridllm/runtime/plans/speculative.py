"""The speculative plan: the local model drafts, the cloud verifies, the cloud's text is served.

Each round drafts k tokens locally (greedy) after the committed context, sends them in one
verification call (a dialect of `engines.verify`, through the cloud guard: privacy scan, budget
reservation and settlement), commits the accepted prefix plus the cloud's own next token, and goes
on; the local KV cache keeps the committed context (`engines.llama.draft`). k follows the
measured acceptance, drafting time and round trip (`runtime.speculation`).

Lossless at temperature 0: every committed token is the verifier's greedy choice at its
position (a batch and a one-token step round differently, so the cloud's own plain answer can
part from it where its top two log-probabilities nearly tie; `Trace.speculation.near_ties`
counts the rounds whose cloud token was chosen at such a tie).

Lossless above temperature 0 by speculative sampling (`engines.spec_sampling`): the draft is
sampled from q, the local distribution after the request's temperature and top_p (seeded from
the request's seed when it has one); at each drafted position the cloud's p (the same
processing) keeps x with probability min(1, p(x)/q(x)); the first rejected position draws from
norm(max(0, p - q)); when all k are kept, the bonus token is drawn from p after the draft. Every
committed token is then distributed as the cloud's p. Only a verifier that returns raw
log-probabilities per position of a shared tokenizer can do it (vLLM's `prompt_logprobs`,
hybridllm serve), and only where p is known exactly: its top_p nucleus must lie inside the 20
returned tokens (checked per position; never with top_p = 1, whose support is the whole
vocabulary). At a position where it does not, what was decided before it is committed and the
next round drafts nothing: the cloud draws that token itself (its sampler is p's processing).
When most rounds need such a step, the plan streams the rest plainly, with the reason in the
trace. `Trace.speculation.rule` says which rule ran.

The plan steps aside to plain cloud streaming (a continuation of the committed text, nothing
repeated) when no dialect is known, when speculation stops paying (`Outlook.pays`) or when the
billed prompt tokens per committed token pass the cap. A verification call that fails or
stalls moves the answer to the local engine from the committed text (when the decision allows
a mid-stream failover); a guard's refusal does the same. Cancelling the stream cancels the
verification call (its connection is closed) and stops drafting within one decode step.

Drafting ahead (`plans._ahead`, policy `speculative_ahead`, on by default, token-level
verifiers): while a round is verified the local model drafts the next one as if the whole draft
were accepted, so the device works during the round trip instead of waiting. Unless drafts are
shown (they would then appear only after it), round 0 verifies no draft at all: it asks the
cloud for its first token (a prefill, at the cloud's own TTFT) while the local model prefills
and drafts the first round ahead.

`show_drafts`: each round's draft is a `Draft` event before the verification, and the
rejected end of it a `Retract` event after it; the committed text follows as `Token` events.
"""

from __future__ import annotations

import codecs
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import anyio

from hybridllm import clock, errors
from hybridllm.engines.base import Engine, GenerationRequest, prompt_token_bound
from hybridllm.engines.capabilities import (
    Drafted,
    Drafter,
    Drafts,
    Outgoing,
    VerifiesAtEndpoint,
)
from hybridllm.engines.verify import Round, Sampling, Unverifiable, Verdict, Verifier
from hybridllm.events import Delta, Draft, EngineName, Fallback, Finish, Retract
from hybridllm.policy import Policy
from hybridllm.routing.decide import Decision
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.plans._ahead import Ahead, verify_with_ahead
from hybridllm.runtime.plans.single import collector
from hybridllm.runtime.speculation import K_MAX, Outlook, SpeculationState
from hybridllm.runtime.stream import RequestRun
from hybridllm.runtime.trace import Speculation, spend_role

NEAR_TIE = 0.05  # nats


@dataclass(frozen=True)
class SpeculativeSetup:
    """What the plan needs beside the request: the engines, the client's speculation state,
    the cloud's plain speed (seconds per token, for the pay test) and the policy's knobs."""

    local: Engine
    cloud: Engine  # the guard bound to this request (every call goes through it)
    state: SpeculationState
    cloud_tpot_s: float | None = None
    show_drafts: bool = False
    failover: bool = True
    stall_s: float | None = None
    max_prompt_overhead: float | None = None  # billed prompt tokens per committed token
    k: int | None = None  # drafts per round, fixed (None: adaptive)
    ahead: bool = True  # draft the next round while this one is verified (`_ahead`)


async def speculative(
    run: RequestRun, setup: SpeculativeSetup, request: GenerationRequest, reason: str
) -> None:
    run.route(setup.cloud, reason)
    spec = run.trace.speculation = Speculation()
    local, cloud = setup.local, setup.cloud
    if request.temperature > 0 and request.top_p >= 1.0:
        spec.verifier = (
            "none: temperature > 0 with top_p = 1: the cloud's distribution covers the whole "
            "vocabulary, which top-N log-probabilities cannot give exactly"
        )
        return await _plain(run, setup, request, "", 0, spec.verifier)
    if not isinstance(local, Drafts):
        spec.verifier = "none: the local engine cannot draft"
        return await _plain(run, setup, request, "", 0, spec.verifier)
    drafter = local.drafter()
    await drafter.start()
    endpoint = cloud.verification_endpoint() if isinstance(cloud, VerifiesAtEndpoint) else None
    if endpoint is None or not isinstance(cloud, VerifiesAtEndpoint):
        spec.verifier = "none: the cloud engine cannot verify drafts"
        return await _plain(run, setup, request, "", 0, spec.verifier)
    spend_role.set("probe")
    try:
        probed = await setup.state.verifier(endpoint, cloud.verification_post, drafter)
    except errors.RefusedError as exc:  # the probe itself was refused by the guard
        run.trace.refusals.append(f"cloud: {exc}")
        spec.verifier = f"none: probing refused by the guard: {exc}"
        return await _plain(run, setup, request, "", 0, spec.verifier)
    spec.verifier = probed.reason if probed.verifier else f"none: {probed.reason}"
    if probed.verifier is None:
        return await _plain(run, setup, request, "", 0, spec.verifier)
    if request.temperature > 0 and not (probed.verifier.samples and probed.verifier.token_level):
        spec.verifier = (
            f"none: temperature > 0 needs raw token-level log-probabilities for speculative "
            f"sampling; the cloud offers {probed.reason}"
        )
        return await _plain(run, setup, request, "", 0, spec.verifier)
    outlook = setup.state.outlook(endpoint)
    if setup.k is None:  # known not to pay here: stream plainly from the start (or explore)
        pays, words = outlook.pays(setup.cloud_tpot_s)
        if not pays and not outlook.explore():
            return await _plain(run, setup, request, "", 0, f"speculation does not pay: {words}")
    await _loop(run, setup, request, drafter, (probed.verifier, cloud), outlook, spec)


async def _loop(
    run: RequestRun,
    setup: SpeculativeSetup,
    request: GenerationRequest,
    drafter: Drafter,
    judge: tuple[Verifier, VerifiesAtEndpoint],
    outlook: Outlook,
    spec: Speculation,
) -> None:
    prompt_text = drafter.render(request.messages)
    ctx = drafter.tokenize(prompt_text)
    committed, n_out, billed_prompt, stuck = "", 0, 0, 0
    ahead: Ahead | None = None  # the next round's draft, made while this one was verified
    cloud_step, steps = False, 0  # a round that drafts nothing: the cloud draws the token
    spend_role.set("verification")
    sampled = request.temperature > 0
    rng = random.Random(request.seed)  # seeded: the same drafts and decisions for a seed
    verifier = judge[0]
    vocab = drafter.n_vocab
    spec.rule = (
        f"speculative sampling (temperature {request.temperature:g}, top_p "
        f"{request.top_p:g}): keep x with min(1, p/q), else draw from norm(max(0, p - q))"
        if sampled else "greedy: each committed token is the verifier's top-1"
    )  # fmt: skip
    while True:
        left = request.max_tokens - n_out
        if left <= 0:
            return _finish(run, "length", billed_prompt, n_out)
        k = 0 if cloud_step else max(0, min(setup.k or outlook.best_k(), K_MAX, left - 1))
        pipelined = setup.ahead and verifier.token_level and not sampled  # greedy rounds only
        if spec.rounds == 0 and pipelined and not setup.show_drafts:
            k = 0  # round 0: the cloud's first token at its own TTFT, drafting ahead meanwhile
        t0 = clock.now()
        made = ahead.next_draft(ctx) if ahead is not None and k > 0 else None
        if made is not None:
            spec.ahead_used += 1
            made.eos = made.eos and len(made.ids) <= k
            made.ids, made.probs = made.ids[:k], made.probs[:k]
        drafted = made or (
            await drafter.draft(ctx, k, request.temperature, request.top_p, rng) if k else Drafted()
        )
        t1 = clock.now()
        ids = drafted.ids[:-1] if drafted.eos else drafted.ids
        pieces = _pieces(drafter, ctx, ids)
        draft_text = "".join(pieces)
        if setup.show_drafts and draft_text:
            run.emit(Draft(clock.now(), draft_text))
        sampling = (
            Sampling(request.temperature, request.top_p, rng, drafted.dists, vocab)
            if sampled else None
        )  # fmt: skip
        round_ = Round(prompt_text, committed, ctx, ids, pieces, request.messages,
                       partial(_text_of, drafter, list(ctx)), sampling)  # fmt: skip
        try:
            if pipelined and not drafted.eos:
                k_next = max(1, min(setup.k or outlook.best_k(), K_MAX))
                verdict, ahead = await verify_with_ahead(
                    partial(_verify, setup, judge, round_), drafter, [*ctx, *ids],
                    len(ids), k_next,
                )  # fmt: skip
            else:
                verdict, ahead = await _verify(setup, judge, round_), None
        except Unverifiable as exc:
            if setup.show_drafts and draft_text:
                run.emit(Retract(clock.now(), draft_text))
            why = f"the verifier cannot judge this round: {exc}"
            return await _plain(run, setup, request, committed, n_out, why)
        except (errors.EngineError, errors.RefusedError, errors.StallError) as exc:
            if setup.show_drafts and draft_text:
                run.emit(Retract(clock.now(), draft_text))
            return await _fail_over(run, setup, request, committed, n_out, exc)
        t2 = clock.now()
        if setup.show_drafts and len(verdict.accepted_text) < len(draft_text):
            run.emit(Retract(t2, draft_text[len(verdict.accepted_text) :]))
        spec.rounds += 1
        spec.k.append(k)
        spec.drafted += len(ids)
        spec.accepted += verdict.accepted
        spec.draft_ms.append((t1 - t0) * 1e3)
        spec.verify_ms.append((t2 - t1) * 1e3)
        if verdict.gap is not None and verdict.gap < NEAR_TIE:
            spec.near_ties += 1
        # positions left undecided (`switch`) are not rejections: the acceptance leaves them out
        decided = len(ids) if verdict.switch is None else verdict.accepted
        share = decided / len(ids) if ids else 1.0
        draft_s = drafted.seconds if made is not None else t1 - t0  # made ahead: its own time
        outlook.observe(decided, verdict.accepted, draft_s * share, t2 - t1, pipelined=pipelined)
        billed_prompt += verdict.prompt_tokens
        text, stopped = _apply_stop(committed, verdict.text, request.stop)
        if text:
            run.deliver("cloud", Delta(text, t2))
        committed += text
        n_out += verdict.accepted + (1 if verdict.text != verdict.accepted_text else 0)
        eos = verdict.next_id is not None and drafter.is_eog(verdict.next_id)
        if stopped or verdict.finished or eos:  # the cloud's own token ends the answer
            return _finish(run, "stop", billed_prompt, n_out)
        cloud_step = verdict.switch is not None  # undecided there: the cloud picks it next
        if cloud_step:
            steps += 1
            if steps >= 3 and steps * 2 > spec.rounds:
                why = f"the verifier cannot decide most rounds ({verdict.switch})"
                return await _plain(run, setup, request, committed, n_out, why)
        if verifier.token_level and (verdict.next_id is not None or verdict.switch):
            own = [] if verdict.next_id is None else [verdict.next_id]
            ctx = [*ctx, *ids[: verdict.accepted], *own]
        else:
            ctx = drafter.tokenize(prompt_text + committed)
        stuck = 0 if text or cloud_step else stuck + 1
        switch = _should_switch(outlook, setup, billed_prompt, n_out)
        if stuck >= 2:  # rounds that commit nothing (a token with no text): stream instead
            switch = "two verification rounds committed no text"
        if switch is not None:
            return await _plain(run, setup, request, committed, n_out, switch)


def _should_switch(
    outlook: Outlook, setup: SpeculativeSetup, billed_prompt: int, n_out: int
) -> str | None:
    pays, words = outlook.pays(setup.cloud_tpot_s)
    if not pays and setup.k is None:
        return f"speculation stopped paying: {words}"
    cap = setup.max_prompt_overhead
    if cap is not None and n_out >= 8 and billed_prompt / n_out > cap:
        return (
            f"verification overhead {billed_prompt / n_out:.0f} prompt tokens per token > {cap:g}"
        )
    return None


async def _verify(
    setup: SpeculativeSetup, judge: tuple[Verifier, VerifiesAtEndpoint], round_: Round
) -> Verdict:
    """One round through the cloud's `verification_post` (the guard's: the round's whole
    text scanned, its prompt-token bound and k + 1 output tokens reserved, usage settled)."""
    verifier, cloud = judge
    full = round_.prompt_text + round_.committed_text + round_.draft_text
    bound = max(
        prompt_token_bound([{"role": "user", "content": full}]),
        len(round_.context_ids) + len(round_.draft_ids),
    )
    max_out = len(round_.draft_ids) + 1
    if verifier.dialect == "predicted-outputs":  # rejected prediction tokens bill as output
        max_out += len(round_.draft_text.encode("utf-8"))
    outgoing = Outgoing((("verification.prompt", full),), bound, max_out)
    post = partial(cloud.verification_post, outgoing=outgoing)
    if setup.stall_s is None:
        return await verifier.verify(round_, post)
    with anyio.move_on_after(setup.stall_s) as scope:
        return await verifier.verify(round_, post)
    assert scope.cancelled_caught
    raise errors.StallError.after(setup.stall_s, "cloud")


def _pieces(drafter: Drafter, ctx: list[int], ids: list[int]) -> list[str]:
    """Each drafted token's text as it follows the context (a character split over tokens
    goes to the token that completes it)."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="ignore")
    out, prev = [], list(ctx[-4:])
    for tok in ids:
        out.append(dec.decode(drafter.piece([tok], prev)))
        prev.append(tok)
    return out


def _text_of(drafter: Drafter, ctx: list[int], ids: Sequence[int]) -> str:
    return "".join(_pieces(drafter, ctx, list(ids)))


def _apply_stop(committed: str, text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    if not stops:
        return text, False
    whole = committed + text
    cut = min((i for s in stops if (i := whole.find(s)) >= 0), default=-1)
    if cut < 0:
        return text, False
    return whole[len(committed) : cut] if cut > len(committed) else "", True


def _finish(run: RequestRun, reason: str, prompt_tokens: int, n_out: int) -> None:
    run.complete("cloud", Finish(reason, prompt_tokens, n_out, clock.now()))


async def _plain(
    run: RequestRun,
    setup: SpeculativeSetup,
    request: GenerationRequest,
    committed: str,
    n_out: int,
    why: str,
) -> None:
    """Plain cloud streaming from the committed text (all of the answer when nothing is)."""
    spec = run.trace.speculation
    if spec is not None and spec.verifier and not spec.verifier.startswith("none"):
        spec.switched, spec.switched_at = why, len(committed)
    rest = replace(
        request, assistant_prefix=committed, max_tokens=max(1, request.max_tokens - n_out)
    )
    spend_role.set("continuation" if committed else "primary")
    await _relay_rest(run, setup.cloud, rest, n_out)


async def _fail_over(
    run: RequestRun,
    setup: SpeculativeSetup,
    request: GenerationRequest,
    committed: str,
    n_out: int,
    exc: BaseException,
) -> None:
    """A verification call failed: the local engine continues from the committed text."""
    if not setup.failover:
        raise exc
    why = f"verification failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, errors.RefusedError):
        run.trace.refusals.append(f"cloud: {exc}")
    spec = run.trace.speculation
    if spec is not None:
        spec.switched, spec.switched_at = why, len(committed)
    now = clock.now()
    run.trace.fallback_reason = why
    run.trace.switched("cloud", "local", exc, len(committed), reason=why, t=now)
    run.trace.started.append("local")
    run.trace.engine = "local"
    run.emit(Fallback(now, "cloud", "local", why))
    rest = replace(
        request, assistant_prefix=committed, max_tokens=max(1, request.max_tokens - n_out)
    )
    await _relay_rest(run, setup.local, rest, n_out)


async def _relay_rest(
    run: RequestRun, engine: Engine, request: GenerationRequest, n_out: int
) -> None:
    handle, finishes = collector(run, engine.name)
    await run.relay(engine, request, handle)
    end = finishes[-1] if finishes else None
    if end is not None and n_out:
        end = replace(end, completion_tokens=(end.completion_tokens or 0) + n_out)
    run.complete(engine.name, end)


def plan_for(
    routing: _Routing,
    engines: Mapping[EngineName, Engine],
    request: GenerationRequest,
    decision: Decision,
    policy: Policy,
) -> Callable[[RequestRun], Awaitable[None]]:
    """The plan for one request, as the client runs plans (a function of the `RequestRun`)."""
    spec, stall_ms = policy.speculative, policy.routing.stall_ms
    setup = SpeculativeSetup(
        local=engines["local"],
        cloud=engines["cloud"],
        state=routing.speculation,
        # the prior until the cloud has streamed here
        cloud_tpot_s=routing.latency.engine("cloud").tpot()[0],
        show_drafts=spec.show_drafts,
        failover=decision.failover,
        stall_s=None if stall_ms is None else stall_ms / 1000.0,
        max_prompt_overhead=spec.max_prompt_overhead,
        k=spec.k,
        ahead=spec.ahead,
    )
    return partial(speculative, setup=setup, request=request, reason=decision.reason)


class _Routing(Protocol):
    latency: LatencyModel
    speculation: SpeculationState
