"""A bounded local queue: `max_queue` waiting requests and `max_queue_wait_s` of waiting at most.
Past either, a request goes to the cloud when the policy allows it (the route says why) or fails
at once with `QueueFullError`, never waiting without end. `ScriptedEngine(serial=True)` plays
one request at a time through the same `BoundedQueue` as `LlamaCppEngine`. On the virtual clock
(tests/unit/conftest.py): "at once" is no virtual time at all, a wait is the scripts' own time."""

from __future__ import annotations

import anyio
import pytest

from hybridllm import ConfigError, EngineError, HybridClient, Policy
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.queue import BoundedQueue
from hybridllm.errors import QueueFullError
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]
REQ = GenerationRequest([{"role": "user", "content": "hi"}])


async def play(engine: ScriptedEngine) -> str:
    return "".join([c.text async for c in engine.stream(REQ) if hasattr(c, "text")])


async def test_an_unbounded_serial_engine_queues_in_order() -> None:
    engine = ScriptedEngine("local", script=[0.05, "x"], serial=True)
    ends: list[float] = []

    async def one() -> None:
        await play(engine)
        ends.append(anyio.current_time())

    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(one)
        await anyio.sleep(0.01)
        info = engine.info()
        assert info.queue_depth == 4 and info.expected_wait_s == pytest.approx(0.04 + 3 * 0.05)
        assert info.unavailable is None
    assert [t - t0 for t in ends] == pytest.approx([0.05, 0.10, 0.15, 0.20])  # one at a time


async def test_max_queue_refuses_at_once_past_the_bound() -> None:
    engine = ScriptedEngine("local", script=[0.2, "x"], max_queue=3)
    outcomes: list[str] = []

    async def one() -> None:
        t = anyio.current_time()
        try:
            outcomes.append(await play(engine))
        except QueueFullError as exc:
            assert anyio.current_time() == t  # at once, not after waiting
            assert exc.max_queue == 3 and exc.waiting == 3 and exc.engine == "local"
            assert not exc.retryable and isinstance(exc, EngineError)
            outcomes.append("full")

    async with anyio.create_task_group() as tg:
        for _ in range(20):  # the burst: 20 concurrent streams
            tg.start_soon(one)
        await anyio.sleep(0.01)
        assert engine.info().unavailable == "queue full (3 waiting, max_queue=3)"
    assert outcomes.count("x") == 4 and outcomes.count("full") == 16  # 1 running + 3 waiting
    assert engine.info().unavailable is None  # drained


async def test_max_queue_wait_refuses_an_expected_wait_at_once() -> None:
    engine = ScriptedEngine("local", script=[0.3, "x"], max_queue_wait_s=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(play, engine)
        await anyio.sleep(0.01)
        assert "max_queue_wait_s=0.1 s" in (engine.info().unavailable or "")
        t = anyio.current_time()
        with pytest.raises(QueueFullError, match="max_queue_wait_s"):
            await play(engine)
        assert anyio.current_time() == t  # at once


async def test_a_wait_longer_than_estimated_ends_at_the_limit() -> None:
    queue = BoundedQueue("local", max_queue_wait_s=0.05)
    release = anyio.Event()

    async def running() -> None:  # estimated at nothing, it runs on
        await queue.acquire(0.0)
        queue.active = (anyio.current_time(), 0.0)
        await release.wait()
        queue.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(running)
        await anyio.sleep(0.01)
        t = anyio.current_time()
        with pytest.raises(QueueFullError, match="waited 0.05 s") as caught:
            await queue.acquire(0.0)
        assert anyio.current_time() - t == pytest.approx(0.05) and caught.value.waiting == 0
        assert queue.pending == {}
        release.set()
    await queue.acquire(0.0)  # the lock was not left held by the one that gave up
    queue.release()


def test_bounds_are_checked() -> None:
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="max_queue"):
            BoundedQueue("local", max_queue=bad)  # type: ignore[arg-type]
    for wait in (0, -1.0, float("nan"), float("inf"), False):
        with pytest.raises(ConfigError, match="max_queue_wait_s"):
            BoundedQueue("local", max_queue_wait_s=wait)
    with pytest.raises(ConfigError):
        ScriptedEngine("local", max_queue=-2)


async def test_a_full_local_queue_sends_the_request_to_the_cloud() -> None:
    local = ScriptedEngine("local", script=[0.2, "l"], max_queue=0)
    cloud = ScriptedEngine("cloud", script=[0.01, "c"])
    pol = Policy(name="local-first", routing={"prefer": "local"})
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.complete, "first")
            await anyio.sleep(0.02)
            t = anyio.current_time()
            second = await client.complete("second")
            assert anyio.current_time() - t == pytest.approx(0.01)  # the cloud's script alone
    assert second.trace.engine == "cloud" and second.trace.started == ("cloud",)
    assert "unavailable" in second.trace.reason_codes  # the full queue leaves local out
    assert len(local.requests) == 1


async def test_without_a_cloud_a_full_queue_fails_at_once() -> None:
    local = ScriptedEngine("local", script=[0.2, "l"], max_queue=0)
    cloud = ScriptedEngine("cloud", script=[0.01, "c"])
    no_cloud = Policy(name="device-only", routing={"allow_cloud": False})
    for client in (
        HybridClient(local=local, router=None),
        HybridClient(local=local, cloud=cloud, policy=no_cloud, router=None),
    ):
        async with client, anyio.create_task_group() as tg:
            tg.start_soon(client.complete, "first")
            await anyio.sleep(0.02)
            t = anyio.current_time()
            async with client.stream("second") as s:
                with pytest.raises(QueueFullError):
                    _ = [tok async for tok in s]
            assert anyio.current_time() == t  # at once
            assert "unavailable_only_engine" in s.trace.reason_codes
            assert s.trace.error_type is QueueFullError
    assert not cloud.requests
