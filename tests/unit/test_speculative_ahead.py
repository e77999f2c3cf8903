"""Drafting ahead during verification (`runtime.plans.speculative.ahead`), with a scripted
drafter and a scripted verification call (orchestration timing only; the real drafter and
server are in tests/integration/test_speculative_served.py)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from hybridllm.engines.capabilities import Drafted
from hybridllm.runtime.plans.speculative.ahead import Ahead, verify_with_ahead
from hybridllm.runtime.plans.speculative.verifier import Verdict

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py


class ScriptedDrafter:
    """Drafts token ids 100, 101, ... one per `step_s`; records cancellations."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.calls, self.cancelled = step_s, 0, 0

    async def draft(self, context: Sequence[int], k: int, temperature: float = 0.0) -> Drafted:
        self.calls += 1
        out = Drafted()
        try:
            for i in range(k):
                await anyio.sleep(self.step_s)
                out.ids.append(100 + i)
                out.probs.append(1.0)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        return out


def verdict(accepted: int, next_id: int | None, finished: bool = False) -> Verdict:
    return Verdict(accepted, "x", "x", next_id, finished, 10, 1)


async def test_a_wholly_accepted_round_keeps_the_draft_made_during_verification() -> None:
    drafter = ScriptedDrafter(0.01)

    async def verify() -> Verdict:
        await anyio.sleep(0.05)
        return verdict(3, 100)  # all 3 drafts accepted; the cloud's own token is the guess

    got, ahead = await verify_with_ahead(verify, drafter, [1, 2, 7, 8, 9], 3, 4)  # type: ignore[arg-type]
    assert got.accepted == 3 and ahead is not None and drafter.cancelled == 0
    assert ahead.drafted.ids == [100, 101, 102, 103, 104]  # the guess, then k_next drafts
    nxt = ahead.next_draft([1, 2, 7, 8, 9, 100])
    assert nxt is not None and nxt.ids == [101, 102, 103, 104]
    assert ahead.next_draft([1, 2, 7, 8, 9, 55]) is None  # the cloud chose another token
    assert ahead.next_draft([1, 2, 7, 8, 100]) is None  # not the assumed context


async def test_a_rejection_cancels_the_drafting_ahead_at_once() -> None:
    drafter = ScriptedDrafter(0.05)

    async def verify() -> Verdict:
        await anyio.sleep(0.02)
        return verdict(1, 42)  # 1 of 3 accepted

    t0 = anyio.current_time()
    got, ahead = await verify_with_ahead(verify, drafter, [1, 7, 8, 9], 3, 8)  # type: ignore[arg-type]
    assert anyio.current_time() - t0 == pytest.approx(0.02)  # the verdict's time, not 9 steps'
    assert got.accepted == 1 and drafter.cancelled == 1 and ahead is None


async def test_a_failed_verification_cancels_the_drafting_and_is_raised() -> None:
    drafter = ScriptedDrafter(0.05)

    async def verify() -> Verdict:
        await anyio.sleep(0.01)
        raise ConnectionResetError("reset")

    with pytest.raises(ConnectionResetError):
        await verify_with_ahead(verify, drafter, [1, 7], 1, 8)  # type: ignore[arg-type]
    assert drafter.cancelled == 1


def test_a_draft_made_ahead_keeps_its_shape() -> None:
    made = Ahead((1, 2), Drafted(ids=[5], probs=[1.0]))
    assert made.next_draft([1, 2, 5]) is None  # only the guess: nothing left to verify
    assert made.assumed == (1, 2)
