"""Drafting ahead: the next round's draft is made while this round's verification is in flight.

A round's verification is a network round trip plus the cloud's batch; the device is idle
meanwhile. So, beside the verification call, the local model drafts on from the context as it
would be if the cloud accepted the whole draft: first its guess of the cloud's own next token,
then the next round's drafts. When the verdict comes back with every draft accepted and the
cloud's own token equal to that guess, the next round's draft is already made and is verified
at once; otherwise the drafting ahead is cancelled (within one decode step) and the next round
drafts from the committed context as usual. Nothing is committed from a draft made ahead
before the cloud verifies it, so the answer is the same token for token; only the time moves.

Token-level verifiers only (the guess is a token id of the shared tokenizer). A round time is
then about max(k * t_draft, t_verify) instead of their sum, when the whole round is accepted.
On a device and a cloud the two run on different hardware; when both run on the same cores
(this project's benchmarks), they compete for them, which a policy can avoid with
`[speculative] ahead = false`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio

from hybridllm.engines.capabilities import Drafted, Drafter
from hybridllm.runtime.plans.speculative.verifier import Verdict


@dataclass(frozen=True)
class Ahead:
    """A draft made ahead: the context it assumed (the committed context and this round's
    whole draft) and the drafted tokens, the first of which guesses the cloud's own token."""

    assumed: tuple[int, ...]
    drafted: Drafted

    def next_draft(self, context: Sequence[int]) -> Drafted | None:
        """The next round's draft when the new committed `context` is the assumed one plus
        the guessed token (the cloud accepted the whole draft and chose the guess), else None."""
        ids = self.drafted.ids
        n = len(self.assumed)
        if len(ids) < 2 or len(context) != n + 1 or context[n] != ids[0]:
            return None
        if tuple(context[:n]) != self.assumed:
            return None
        d = self.drafted
        return Drafted(
            ids=ids[1:],
            probs=d.probs[1:],
            eos=d.eos,
            reused=d.reused,
            evaluated=d.evaluated,
            steps=d.steps,
            seconds=d.seconds,
        )


async def verify_with_ahead(
    verify: Callable[[], Awaitable[Verdict]],
    drafter: Drafter,
    assumed: Sequence[int],
    n_draft: int,
    k_next: int,
    temperature: float = 0.0,
) -> tuple[Verdict, Ahead | None]:
    """Run `verify` and, beside it, draft `k_next` + 1 tokens after `assumed` (the context
    with this round's `n_draft` drafted tokens). The drafting is cancelled as soon as the
    verdict rejects any of the draft or ends the answer, and awaited when it accepts all (at
    most k_next more decode steps). A failed drafting ahead is dropped (the next round drafts
    as usual); a failed verification is raised as it is, the drafting cancelled."""
    made: list[Drafted] = []
    drafting = anyio.CancelScope()

    async def ahead() -> None:
        with drafting:
            try:
                made.append(await drafter.draft(assumed, k_next + 1, temperature))
            except Exception:  # noqa: BLE001 - drafting ahead is optional; the round goes on
                return

    got: list[Verdict] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as tg:  # the drafting task never raises
        tg.start_soon(ahead)
        try:
            got.append(await verify())
        except Exception as exc:  # raised as it is below, not in an exception group
            failed.append(exc)
        if failed or not _whole(got[0], n_draft):
            drafting.cancel()
    if failed:
        raise failed[0]
    return got[0], (Ahead(tuple(assumed), made[0]) if made else None)


def _whole(verdict: Verdict, n_draft: int) -> bool:
    """The cloud accepted all the drafts and went on with a token of its own."""
    return verdict.accepted >= n_draft and verdict.next_id is not None and not verdict.finished
