"""The speculative plan: the local model drafts, the cloud verifies, the cloud's text is served.

Each round drafts k tokens locally (greedy) after the committed context, sends them in one
verification call (a dialect, `verifier`, through the cloud guard: privacy scan, budget
reservation and settlement), commits the accepted prefix plus the cloud's own next token, and goes
on; the local engine's `Drafter` (the `Drafts` capability, `engines.capabilities`) keeps the
committed context in its KV cache. k follows the measured acceptance, drafting time and round
trip (`outlook`).

Lossless at temperature 0: every committed token is the verifier's greedy choice at its
position (a batch and a one-token step round differently, so the cloud's own plain answer can
part from it where its top two log-probabilities nearly tie; `Trace.speculation.near_ties`
counts the rounds whose cloud token was chosen at such a tie).

Lossless above temperature 0 by speculative sampling (`sampling`): the draft is sampled from q,
the local distribution after the request's temperature and top_p (seeded from the request's
seed when it has one); at each drafted position the cloud's p (the same
processing) keeps x with probability min(1, p(x)/q(x)); the first rejected position draws from
norm(max(0, p - q)); when all k are kept, the bonus token is drawn from p after the draft. Every
committed token is then distributed as the cloud's p. Only a verifier that returns raw
log-probabilities per position of a shared tokenizer can do it (vLLM's `prompt_logprobs`,
hybridllm serve-model), and only where p is known exactly: its top_p nucleus must lie inside the 20
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

Drafting ahead (`ahead`, policy `[speculative] ahead`, on by default, token-level
verifiers): while a round is verified the local model drafts the next one as if the whole draft
were accepted, so the device works during the round trip instead of waiting. Unless drafts are
shown (they would then appear only after it), round 0 verifies no draft at all: it asks the
cloud for its first token (a prefill, at the cloud's own TTFT) while the local model prefills
and drafts the first round ahead.

`show_drafts`: each round's draft is a `Draft` event before the verification, and the
rejected end of it a `Retract` event after it; the committed text follows as `Token` events.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from hybridllm import errors
from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.engines.capabilities import Drafter, Drafts, Endpoint, VerifiesAtEndpoint
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.plans.registry import Plan, PlanContext, register
from hybridllm.runtime.plans.single import collector, relay_watched
from hybridllm.runtime.plans.speculative.outlook import SpeculationState
from hybridllm.runtime.plans.speculative.rounds import Rounds, StepAside
from hybridllm.runtime.plans.speculative.verifier import Verifier
from hybridllm.runtime.stream import RequestRun
from hybridllm.runtime.trace import Speculation, spend_role


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
    ahead: bool = True  # draft the next round while this one is verified (`ahead`)


async def speculative(
    run: RequestRun, setup: SpeculativeSetup, request: GenerationRequest, reason: str
) -> None:
    """The plan for one request: a drafter and a verifier when both engines can, the rounds
    while they pay, then plain cloud streaming or a local failover for the rest."""
    run.route(setup.cloud, reason)
    spec = Speculation()
    run.plan_record(spec)
    found = await _drafter_and_verifier(run, setup, request, spec)
    if found is None:  # `spec.verifier` says why
        return await _plain(run, setup, request, "", 0, spec.verifier)
    drafter, verifier, cloud, endpoint = found
    outlook = setup.state.outlook(endpoint)
    if setup.k is None:  # known not to pay here: stream plainly from the start (or explore)
        pays, words = outlook.pays(setup.cloud_tpot_s)
        if not pays and not outlook.explore():
            return await _plain(run, setup, request, "", 0, f"speculation does not pay: {words}")
    rounds = Rounds(run, setup, request, drafter, (verifier, cloud), outlook, spec)
    aside = await rounds.run_all()
    if aside is None:
        return
    if aside.failure is not None:
        return await _fail_over(run, setup, request, aside)
    await _plain(run, setup, request, aside.committed, aside.n_out, aside.why)


async def _drafter_and_verifier(
    run: RequestRun, setup: SpeculativeSetup, request: GenerationRequest, spec: Speculation
) -> tuple[Drafter, Verifier, VerifiesAtEndpoint, Endpoint] | None:
    """The local drafter (started), the endpoint's verifier (probed once per endpoint), the
    cloud that verifies and its endpoint; None when the request cannot speculate, with why in
    `spec.verifier`."""
    local, cloud = setup.local, setup.cloud
    if request.temperature > 0 and request.top_p >= 1.0:
        spec.unverified = "whole_vocabulary"
        spec.verifier = (
            "none: temperature > 0 with top_p = 1: the cloud's distribution covers the whole "
            "vocabulary, which top-N log-probabilities cannot give exactly"
        )
        return None
    if not isinstance(local, Drafts):
        spec.unverified, spec.verifier = "cannot_draft", "none: the local engine cannot draft"
        return None
    drafter = local.drafter()
    await drafter.start()
    endpoint = cloud.verification_endpoint() if isinstance(cloud, VerifiesAtEndpoint) else None
    if endpoint is None or not isinstance(cloud, VerifiesAtEndpoint):
        spec.unverified = "cannot_verify"
        spec.verifier = "none: the cloud engine cannot verify drafts"
        return None
    spend_role.set("probe")
    try:
        probed = await setup.state.verifier(endpoint, cloud.verification_post, drafter)
    except errors.RefusedError as exc:  # the probe itself was refused by the guard
        run.refused(cloud.name, exc)
        spec.unverified = "probe_refused"
        spec.verifier = f"none: probing refused by the guard: {exc}"
        return None
    spec.verifier = probed.reason if probed.verifier else f"none: {probed.reason}"
    if probed.verifier is None:
        spec.unverified = "no_dialect"
        return None
    if request.temperature > 0 and not (probed.verifier.samples and probed.verifier.token_level):
        spec.unverified = "needs_raw_logprobs"
        spec.verifier = (
            f"none: temperature > 0 needs raw token-level log-probabilities for speculative "
            f"sampling; the cloud offers {probed.reason}"
        )
        return None
    return drafter, probed.verifier, cloud, endpoint


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
    if spec is not None and spec.verifier and spec.unverified is None:
        spec.switched, spec.switched_at = why, len(committed)
    rest = replace(
        request, assistant_prefix=committed, max_tokens=max(1, request.max_tokens - n_out)
    )
    spend_role.set("continuation" if committed else "primary")
    try:
        await _relay_rest(run, setup.cloud, rest, n_out, setup.stall_s)
    except (errors.EngineError, errors.RefusedError) as exc:
        if not setup.failover:
            raise
        # the cloud failed while streaming plainly: the local engine continues from the text
        # delivered (the committed text and what the cloud streamed after it)
        done, n_done = run.delivered_text, run.trace.n_tokens
        aside = StepAside(done, n_done, f"{setup.cloud.name} failed: {exc}", exc)
        await _fail_over(run, setup, request, aside)


async def _fail_over(
    run: RequestRun, setup: SpeculativeSetup, request: GenerationRequest, aside: StepAside
) -> None:
    """A verification call failed: the local engine continues from the committed text."""
    exc, committed, n_out, why = aside.failure, aside.committed, aside.n_out, aside.why
    assert exc is not None
    if not setup.failover:
        raise exc
    if isinstance(exc, errors.RefusedError):
        run.refused(setup.cloud.name, exc)
    spec = run.trace.speculation
    if spec is not None:
        spec.switched, spec.switched_at = why, len(committed)
    cloud, local = setup.cloud.name, setup.local.name
    if committed:  # a move mid-answer: a switch and its fallback record
        run.switched(cloud, local, exc, reason=why, chars=len(committed))
    else:  # nothing delivered yet: the local engine answers instead
        refused = isinstance(exc, errors.RefusedError)
        run.fell_back(cloud, local, why, "refused" if refused else "failed")
    rest = replace(
        request, assistant_prefix=committed, max_tokens=max(1, request.max_tokens - n_out)
    )
    await _relay_rest(run, setup.local, rest, n_out, setup.stall_s)


async def _relay_rest(
    run: RequestRun,
    engine: Engine,
    request: GenerationRequest,
    n_out: int,
    stall_s: float | None,
) -> None:
    """Stream the rest on `engine` (the rounds' `n_out` tokens are counted already), ended by
    a `StallError` when its text stops for longer than `stall_s`."""
    handle, finishes = collector(run, engine.name)
    await relay_watched(run, engine, request, handle, stall_s)
    run.complete(engine.name, finishes[-1] if finishes else None)


def build_speculative(ctx: PlanContext) -> Plan:
    """The plan for one request, as the client runs plans (a function of the `RequestRun`)."""
    spec, routing, decision = ctx.policy.speculative, ctx.routing, ctx.decision
    setup = SpeculativeSetup(
        local=ctx.engines["local"],
        cloud=ctx.engines["cloud"],
        state=routing.speculation,
        # the prior until the cloud has streamed here
        cloud_tpot_s=routing.latency.engine(ctx.engines["cloud"].name).tpot()[0],
        show_drafts=spec.show_drafts,
        failover=decision.failover,
        stall_s=ctx.stall_s,
        max_prompt_overhead=spec.max_prompt_overhead,
        k=spec.k,
        ahead=spec.ahead,
    )
    return partial(speculative, setup=setup, request=ctx.request, reason=decision.reason)


class _ClientState(Protocol):
    """What the plan reads of the client: its latency model and speculation state."""

    latency: LatencyModel
    speculation: SpeculationState


register("speculative", build_speculative, builtin=True)
