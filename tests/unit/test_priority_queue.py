"""The local queue serves by priority class, then arrival; waiting ages a request one class up
per `age_s`, so nothing starves; an interactive arrival preempts a background holder. The clock
is the queue's own (`clock=`), driven here by hand: these tests are deterministic."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint

from hybridllm import Policy
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.queue import BoundedQueue, Turn
from hybridllm.errors import InvalidArgumentError, PolicyError
from hybridllm.events import Priority
from hybridllm.policy import resolve_policy

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    for _ in range(5):
        await checkpoint()


def join(tg: TaskGroup, q: BoundedQueue, name: str, prio: Priority, served: list[str]) -> None:
    async def one() -> None:
        await q.acquire(1.0, prio)
        served.append(name)
        q.release()

    tg.start_soon(one)


async def test_served_by_class_then_arrival() -> None:
    clock = Clock()
    q = BoundedQueue("local", clock=clock)
    await q.acquire(1.0, "normal")  # holds the engine
    served: list[str] = []
    async with anyio.create_task_group() as tg:
        for name, prio in [
            ("bg", "background"),
            ("n1", "normal"),
            ("i1", "interactive"),
            ("n2", "normal"),
            ("i2", "interactive"),
        ]:
            join(tg, q, name, prio, served)  # type: ignore[arg-type]
            await settle()
            clock.now += 0.1
        assert q.waiting == 5
        q.release()
    assert served == ["i1", "i2", "n1", "n2", "bg"]
    assert not q.busy and q.waiting == 0


async def test_waiting_ages_a_request_one_class_per_age_s() -> None:
    clock = Clock()
    q = BoundedQueue("local", age_s=5.0, clock=clock)
    await q.acquire(1.0, "normal")
    served: list[str] = []
    async with anyio.create_task_group() as tg:
        join(tg, q, "bg", "background", served)  # arrives at t=0
        await settle()
        clock.now = 4.9  # waited 4.9 s: still background
        join(tg, q, "n", "normal", served)
        await settle()
        clock.now = 10.0  # bg waited 10 s: two classes up (interactive); n waited 5.1 s: one up
        join(tg, q, "i", "interactive", served)  # arrives now, after both
        await settle()
        assert [t.rank(clock.now, q.age_s) for t in q.pending.values()] == [0, 0, 0]
        q.release()
    # all three are interactive now: by arrival
    assert served == ["bg", "n", "i"]


async def test_a_request_not_yet_aged_waits_behind_a_better_class() -> None:
    clock = Clock()
    q = BoundedQueue("local", age_s=5.0, clock=clock)
    await q.acquire(1.0, "normal")
    served: list[str] = []
    async with anyio.create_task_group() as tg:
        join(tg, q, "bg", "background", served)
        await settle()
        clock.now = 9.9  # one class up only: normal, behind an interactive that came later
        join(tg, q, "i", "interactive", served)
        await settle()
        q.release()
    assert served == ["i", "bg"]


async def test_an_interactive_arrival_preempts_a_background_holder() -> None:
    clock = Clock()
    q = BoundedQueue("local", clock=clock)
    holder = await q.acquire(10.0, "background")
    assert not holder.preempt.is_set()
    async with anyio.create_task_group() as tg:
        served: list[str] = []
        join(tg, q, "n", "normal", served)
        await settle()
        assert not holder.preempt.is_set()  # a normal request waits its turn
        join(tg, q, "i", "interactive", served)
        await settle()
        assert holder.preempt.is_set() and "interactive" in holder.preempt_reason
        # the holder yields: gives its turn back and waits again with its own Turn
        q.release()
        holder.pauses += 1
        clock.now += 1.0
        await q.acquire(5.0, turn=holder)
        served.append("bg")
        q.release()
    assert served == ["i", "n", "bg"]
    assert holder.pauses == 1 and not holder.preempt.is_set()


async def test_an_aged_background_holder_is_not_preempted() -> None:
    clock = Clock()
    q = BoundedQueue("local", age_s=5.0, clock=clock)
    holder = Turn("background", waited=10.0)  # paused before, waited 10 s in all
    await q.acquire(1.0, turn=holder)
    async with anyio.create_task_group() as tg:
        served: list[str] = []
        join(tg, q, "i", "interactive", served)
        await settle()
        assert not holder.preempt.is_set()
        q.release()
    assert served == ["i"]


async def test_expected_wait_for_an_interactive_request_skips_a_preemptible_holder() -> None:
    q = BoundedQueue("local")
    await q.acquire(8.0, "background")
    q.active = (q.clock(), 8.0)  # the queue's clock: hybridllm.clock.now()
    assert q.expected_wait_s("interactive") == 0.0
    assert q.expected_wait_s("normal") == pytest.approx(8.0, abs=0.1)
    assert q.expected_wait_s() == pytest.approx(8.0, abs=0.1)


async def test_a_granted_waiter_cancelled_passes_the_turn_on() -> None:
    q = BoundedQueue("local")
    await q.acquire(1.0, "normal")
    served: list[str] = []
    scope = anyio.CancelScope()

    async def cancelled() -> None:
        with scope:
            await q.acquire(1.0, "interactive")
            try:  # (if the grant came first: it holds the turn and gives it back)
                await anyio.sleep_forever()
            finally:
                q.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancelled)
        await settle()
        join(tg, q, "n", "normal", served)
        await settle()
        scope.cancel()  # the interactive waiter is cancelled ...
        q.release()  # ... as it gets the turn: the turn passes on
        await settle()
    assert served == ["n"]
    # the engine is free again
    turn = await q.acquire(0.0)
    assert q.holder is turn


def test_policy_priority_is_validated_and_presets_set_it() -> None:
    assert Policy().priority == "normal"
    assert Policy(priority="background").priority == "background"
    with pytest.raises(PolicyError) as info:
        Policy(priority="urgent")  # type: ignore[arg-type]
    assert info.value.field == "priority" and "urgent" in str(info.value)
    expected = {
        "voice-assistant": "interactive",
        "code-completion": "interactive",
        "translation": "interactive",
        "npc-dialogue": "interactive",
        "chat": "normal",
        "long-writing": "background",
        "batch": "background",
    }
    for name, prio in expected.items():
        assert resolve_policy(name).priority == prio, name


def test_request_priority_is_checked() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert GenerationRequest(msgs, priority="interactive").priority == "interactive"
    with pytest.raises(InvalidArgumentError, match="priority"):
        GenerationRequest(msgs, priority="urgent")  # type: ignore[arg-type]


async def test_a_warm_up_yields_to_any_request_and_waits_behind_every_class() -> None:
    clock = Clock()
    q = BoundedQueue("local", clock=clock)
    warm = await q.acquire(3.0, "background", idle=True)
    assert q.expected_wait_s("normal") == 0.0  # it would yield at once: no wait
    served: list[str] = []
    holding, go = anyio.Event(), anyio.Event()

    async def background() -> None:
        await q.acquire(1.0, "background")
        served.append("bg")
        holding.set()
        await go.wait()
        q.release()

    async def warm_again() -> None:
        await q.acquire(3.0, turn=warm)
        served.append("warm")
        q.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(background)  # even a background request preempts a warm-up
        await settle()
        assert warm.preempt.is_set()
        q.release()  # the warm-up yields ...
        await holding.wait()
        tg.start_soon(warm_again)  # ... and waits again
        await settle()
        join(tg, q, "n", "normal", served)
        await settle()
        clock.now += 100.0  # however long it has waited, it does not age past a request
        go.set()
    assert served == ["bg", "n", "warm"]
