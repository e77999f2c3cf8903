"""Unit tests of `Handoff`: the llama thread waits for the loop to take each token and run two
more turns, and never longer than its bound. Real threads and a real event loop, no model;
order and counts are asserted, not times."""

from __future__ import annotations

import threading

import anyio
import anyio.lowlevel
import pytest

from hybridllm.engines.llama.thread import Handoff, loop_caller

pytestmark = pytest.mark.anyio


async def test_the_thread_goes_on_only_after_the_loop_took_the_token_and_two_turns() -> None:
    order: list[str] = []
    got = anyio.Event()
    handoff = Handoff(loop_caller(), wait_s=30.0, turns=2)
    acks: list[threading.Event] = []

    def deliver(ack: threading.Event) -> None:  # on the loop
        order.append("delivered")
        acks.append(ack)
        got.set()

    def llama_thread() -> None:
        handoff.send(deliver)
        order.append("next step")

    worker = threading.Thread(target=llama_thread)
    worker.start()
    await got.wait()
    await anyio.sleep(0.05)
    assert order == ["delivered"]  # not taken yet: the thread still waits
    handoff.taken(acks[0])
    assert not acks[0].is_set()  # two turns later, not at once
    await anyio.to_thread.run_sync(worker.join)
    assert order == ["delivered", "next step"] and acks[0].is_set()


async def test_a_loop_that_never_takes_the_token_holds_the_thread_only_for_the_bound() -> None:
    handoff = Handoff(loop_caller(), wait_s=0.01)
    acks: list[threading.Event] = []
    await anyio.to_thread.run_sync(handoff.send, acks.append)
    await anyio.lowlevel.checkpoint()
    assert len(acks) == 1 and not acks[0].is_set()


async def test_no_wait_at_all_when_the_bound_is_zero() -> None:
    handoff = Handoff(loop_caller(), wait_s=0.0)
    acks: list[threading.Event] = []
    await anyio.to_thread.run_sync(handoff.send, acks.append)
    await anyio.lowlevel.checkpoint()
    assert len(acks) == 1
