"""The rounds of one speculative request: draft k tokens after the committed context, verify
them in one call through the cloud guard, commit the accepted prefix and the cloud's own token,
until the answer ends or the plan must step aside (`StepAside`: plain cloud streaming from the
committed text, or a failover to the local engine, which `plan` carries out).
"""

from __future__ import annotations

import codecs
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio

from hybridllm import clock, errors
from hybridllm.engines.base import GenerationRequest, prompt_token_bound
from hybridllm.engines.capabilities import Drafted, Drafter, Outgoing, VerifiesAtEndpoint
from hybridllm.events import Delta, Draft, Finish, Retract
from hybridllm.runtime.plans.speculative.ahead import Ahead, verify_with_ahead
from hybridllm.runtime.plans.speculative.outlook import K_MAX, Outlook
from hybridllm.runtime.plans.speculative.verifier import (
    Round,
    Sampling,
    Unverifiable,
    Verdict,
    Verifier,
)
from hybridllm.runtime.stream import RequestRun
from hybridllm.runtime.trace import Speculation, spend_role

if TYPE_CHECKING:
    from hybridllm.runtime.plans.speculative.plan import SpeculativeSetup

NEAR_TIE = 0.05  # nats


@dataclass(frozen=True)
class StepAside:
    """The rounds stopped before the answer ended: the committed text and tokens, why, and the
    failure when a verification call failed (the local engine then continues, where the
    decision allows a failover; else the failure is raised). Without a failure, plain cloud
    streaming continues."""

    committed: str
    n_out: int
    why: str
    failure: BaseException | None = None


def _rule(request: GenerationRequest) -> str:
    """The acceptance rule a request's rounds run, in words (`Trace.speculation.rule`)."""
    if request.temperature <= 0:
        return "greedy: each committed token is the verifier's top-1"
    return (
        f"speculative sampling (temperature {request.temperature:g}, top_p "
        f"{request.top_p:g}): keep x with min(1, p/q), else draw from norm(max(0, p - q))"
    )


@dataclass
class _Answer:
    """The answer so far: the committed context (token ids, local tokenizer), its text and
    token count, the prompt tokens billed, and what the next round must know."""

    context: list[int]
    text: str = ""
    n_out: int = 0
    billed_prompt: int = 0
    silent_rounds: int = 0  # rounds in a row that committed no text
    cloud_step: bool = False  # the next round drafts nothing: the cloud draws the token
    cloud_steps: int = 0
    ahead: Ahead | None = None  # the next round's draft, made while this one was verified


class Rounds:
    """One request's verification rounds: draft, verify, commit, until the answer ends or the
    plan steps aside (see the module)."""

    def __init__(
        self,
        run: RequestRun,
        setup: SpeculativeSetup,
        request: GenerationRequest,
        drafter: Drafter,
        judge: tuple[Verifier, VerifiesAtEndpoint],
        outlook: Outlook,
        spec: Speculation,
    ) -> None:
        self.run, self.setup, self.request, self.drafter = run, setup, request, drafter
        self.judge, self.outlook, self.spec = judge, outlook, spec
        self.prompt_text = drafter.render(request.messages)
        self.answer = _Answer(drafter.tokenize(self.prompt_text))
        self.sampled = request.temperature > 0
        self.rng = random.Random(request.seed)  # seeded: the same drafts and decisions for a seed
        self.vocab = drafter.n_vocab
        # drafting ahead: token-level verifiers, greedy rounds only
        self.pipelined = setup.ahead and judge[0].token_level and not self.sampled
        self.aside: StepAside | None = None

    async def run_all(self) -> StepAside | None:
        """Rounds until the answer ends (None) or the plan must step aside (how, and why)."""
        spend_role.set("verification")
        self.spec.rule = _rule(self.request)
        while True:
            left = self.request.max_tokens - self.answer.n_out
            if left <= 0:
                self._finish("length")
                return None
            if not await self._one_round(left):
                return self.aside

    async def _one_round(self, left: int) -> bool:
        """Draft, verify and commit one round; False when the answer ended or steps aside."""
        k = self._k(left)
        t0 = clock.now()
        drafted, made_ahead = await self._draft(k)
        t1 = clock.now()
        ids = drafted.ids[:-1] if drafted.eos else drafted.ids
        pieces = _pieces(self.drafter, self.answer.context, ids)
        draft_text = "".join(pieces)
        if self.setup.show_drafts and draft_text:
            self.run.emit(Draft(clock.now(), draft_text))
        round_ = self._round_of(ids, pieces, drafted)
        try:
            verdict = await self._verify_traced(round_, drafted)
        except Unverifiable as exc:
            self._retract(draft_text)
            return self._step_aside(f"the verifier cannot judge this round: {exc}")
        except (errors.EngineError, errors.RefusedError, errors.StallError) as exc:
            self._retract(draft_text)
            why = f"verification failed: {type(exc).__name__}: {exc}"
            return self._step_aside(why, failure=exc)
        t2 = clock.now()
        if self.setup.show_drafts and len(verdict.accepted_text) < len(draft_text):
            self.run.emit(Retract(t2, draft_text[len(verdict.accepted_text) :]))
        draft_s = drafted.seconds if made_ahead else t1 - t0  # made ahead: its own time
        self._record(k, ids, verdict, draft_s, (t1 - t0, t2 - t1))
        return self._commit(verdict, ids, t2)

    def _k(self, left: int) -> int:
        """Drafts this round: none in a cloud step, none in round 0 when drafting ahead (the
        cloud's first token at its own TTFT, the local model drafting ahead meanwhile), else
        the policy's k or the outlook's best, within what the answer has left."""
        if self.answer.cloud_step:
            return 0
        if self.spec.rounds == 0 and self.pipelined and not self.setup.show_drafts:
            return 0
        return max(0, min(self.setup.k or self.outlook.best_k(), K_MAX, left - 1))

    async def _draft(self, k: int) -> tuple[Drafted, bool]:
        """This round's draft of at most `k` tokens, and whether it was made ahead."""
        ahead, context = self.answer.ahead, self.answer.context
        made = ahead.next_draft(context) if ahead is not None and k > 0 else None
        if made is not None:
            self.spec.ahead_used += 1
            made.eos = made.eos and len(made.ids) <= k
            made.ids, made.probs = made.ids[:k], made.probs[:k]
            return made, True
        if not k:
            return Drafted(), False
        r = self.request
        return await self.drafter.draft(context, k, r.temperature, r.top_p, self.rng), False

    def _round_of(self, ids: list[int], pieces: list[str], drafted: Drafted) -> Round:
        r, context = self.request, self.answer.context
        sampling = None
        if self.sampled:
            sampling = Sampling(r.temperature, r.top_p, self.rng, drafted.dists, self.vocab)
        return Round(
            prompt_text=self.prompt_text,
            committed_text=self.answer.text,
            context_ids=context,
            draft_ids=ids,
            draft_pieces=pieces,
            messages=r.messages,
            text_of=partial(_text_of, self.drafter, list(context)),
            sampling=sampling,
        )

    async def _verify_traced(self, round_: Round, drafted: Drafted) -> Verdict:
        """`_verify`, recorded in the trace as one verification attempt of the cloud."""
        cloud = self.setup.cloud
        attempt = self.run.attempt(cloud, "verification")
        try:
            verdict = await self._verify(round_, drafted)
        except anyio.get_cancelled_exc_class():
            attempt.ended("cancelled", clock.now())
            raise
        except Exception as exc:
            attempt.ended("failed", clock.now(), exc)
            raise
        attempt.content(clock.now())
        attempt.ended("finished", clock.now())
        return verdict

    async def _verify(self, round_: Round, drafted: Drafted) -> Verdict:
        """The round's verdict; a pipelined round drafts the next one meanwhile (`ahead`)."""
        verify = partial(verify_round, self.setup, self.judge, round_)
        if not self.pipelined or drafted.eos:
            verdict = await verify()
            self.answer.ahead = None
            return verdict
        k_next = max(1, min(self.setup.k or self.outlook.best_k(), K_MAX))
        assumed = [*round_.context_ids, *round_.draft_ids]
        verdict, self.answer.ahead = await verify_with_ahead(
            verify, self.drafter, assumed, len(round_.draft_ids), k_next
        )
        return verdict

    def _record(
        self,
        k: int,
        ids: list[int],
        verdict: Verdict,
        draft_s: float,
        wall: tuple[float, float],
    ) -> None:
        """The round in the trace and the outlook (`wall`: drafting and verifying seconds)."""
        spec = self.spec
        spec.rounds += 1
        spec.k.append(k)
        spec.drafted += len(ids)
        spec.accepted += verdict.accepted
        spec.draft_ms.append(wall[0] * 1e3)
        spec.verify_ms.append(wall[1] * 1e3)
        if verdict.gap is not None and verdict.gap < NEAR_TIE:
            spec.near_ties += 1
        # positions left undecided (`switch`) are not rejections: the acceptance leaves them out
        decided = len(ids) if verdict.switch is None else verdict.accepted
        share = decided / len(ids) if ids else 1.0
        self.outlook.observe(
            decided, verdict.accepted, draft_s * share, wall[1], pipelined=self.pipelined
        )

    def _commit(self, verdict: Verdict, ids: list[int], t: float) -> bool:
        """Deliver the verdict's text; False when the answer ended or goes on plainly."""
        a = self.answer
        a.billed_prompt += verdict.prompt_tokens
        text, stopped = _apply_stop(a.text, verdict.text, self.request.stop)
        if text:
            self.run.deliver(self.setup.cloud.name, Delta(text, t))
        a.text += text
        a.n_out += verdict.accepted + (1 if verdict.text != verdict.accepted_text else 0)
        eos = verdict.next_id is not None and self.drafter.is_eog(verdict.next_id)
        if stopped or verdict.finished or eos:  # the cloud's own token ends the answer
            self._finish("stop")
            return False
        a.cloud_step = verdict.switch is not None  # undecided there: the cloud picks it next
        if a.cloud_step:
            a.cloud_steps += 1
            if a.cloud_steps >= 3 and a.cloud_steps * 2 > self.spec.rounds:
                why = f"the verifier cannot decide most rounds ({verdict.switch})"
                return self._step_aside(why)
        a.context = self._context_after(verdict, ids)
        a.silent_rounds = 0 if text or a.cloud_step else a.silent_rounds + 1
        switch = switch_reason(self.outlook, self.setup, a.billed_prompt, a.n_out)
        if a.silent_rounds >= 2:  # rounds that commit nothing (a token with no text)
            switch = "two verification rounds committed no text"
        return True if switch is None else self._step_aside(switch)

    def _context_after(self, verdict: Verdict, ids: list[int]) -> list[int]:
        """The committed context after the round (the text retokenized for text-level ones)."""
        if self.judge[0].token_level and (verdict.next_id is not None or verdict.switch):
            own = [] if verdict.next_id is None else [verdict.next_id]
            return [*self.answer.context, *ids[: verdict.accepted], *own]
        return self.drafter.tokenize(self.prompt_text + self.answer.text)

    def _retract(self, draft_text: str) -> None:
        if self.setup.show_drafts and draft_text:
            self.run.emit(Retract(clock.now(), draft_text))

    def _finish(self, reason: str) -> None:
        a = self.answer
        # the rounds' verification calls
        self.run.counted(self.setup.cloud.name, a.billed_prompt, a.n_out)
        self.run.complete(
            self.setup.cloud.name, Finish(reason, a.billed_prompt, a.n_out, clock.now())
        )

    def _step_aside(self, why: str, failure: BaseException | None = None) -> bool:
        self.aside = StepAside(self.answer.text, self.answer.n_out, why, failure)
        self.run.counted(self.setup.cloud.name, self.answer.billed_prompt, self.answer.n_out)
        return False


def switch_reason(
    outlook: Outlook, setup: SpeculativeSetup, billed_prompt: int, n_out: int
) -> str | None:
    """Why the plan should stream the rest plainly now (None: speculation goes on)."""
    pays, words = outlook.pays(setup.cloud_tpot_s)
    if not pays and setup.k is None:
        return f"speculation stopped paying: {words}"
    cap = setup.max_prompt_overhead
    if cap is not None and n_out >= 8 and billed_prompt / n_out > cap:
        return (
            f"verification overhead {billed_prompt / n_out:.0f} prompt tokens per token > {cap:g}"
        )
    return None


async def verify_round(
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
    raise errors.StallError.after(setup.stall_s, setup.cloud.name)


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
    """The text of token ids as they follow the context (a round's `text_of`)."""
    return "".join(_pieces(drafter, ctx, list(ids)))


def _apply_stop(committed: str, text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """The part of `text` to deliver before the first stop string, and whether one was met."""
    if not stops:
        return text, False
    whole = committed + text
    stop_at = min((i for s in stops if (i := whole.find(s)) >= 0), default=-1)
    if stop_at < 0:
        return text, False
    return whole[len(committed) : stop_at] if stop_at > len(committed) else "", True
