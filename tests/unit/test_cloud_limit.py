"""The cloud concurrency limit (`engines.limit.ConcurrencyLimit`): slots, the queue by class then
arrival, the queue timeout's typed error, a 429's Retry-After, and the wait forecast that
routing reads; and the pure decision that sends a request to the local engine when the cloud
queue would make it miss its deadline. Orchestration timing with the limit's own clock driven by
hand where it can be; the real endpoint is in tests/integration/test_cloud_limit_real.py."""

from __future__ import annotations

import anyio
import pytest
from anyio.lowlevel import checkpoint

from hybridllm import OpenAIEngine, Policy
from hybridllm.engines.limit import EXPECT_S, ConcurrencyLimit
from hybridllm.errors import CloudQueueTimeoutError, InvalidArgumentError, QueueFullError
from hybridllm.routing.decide import LiveState, RequestFacts, decide
from hybridllm.routing.inputs import Prediction

pytestmark = pytest.mark.anyio


async def settle() -> None:
    for _ in range(5):
        await checkpoint()


async def test_at_most_max_concurrency_in_flight_then_by_class_and_arrival() -> None:
    limit = ConcurrencyLimit("cloud", 2)
    assert await limit.acquire() == 0.0
    assert await limit.acquire() == 0.0
    order: list[str] = []

    async def one(name: str, prio: str) -> None:
        await limit.acquire(prio)  # type: ignore[arg-type]
        order.append(name)

    async with anyio.create_task_group() as tg:
        for name, prio in [("bg", "background"), ("n", "normal"), ("i", "interactive")]:
            tg.start_soon(one, name, prio)
            await settle()
        assert limit.waiting == 3 and limit.in_flight == 2 and order == []
        limit.release(1.0)
        await settle()
        assert order == ["i"]
        limit.release(1.0)
        limit.release(1.0)
    assert order == ["i", "n", "bg"]
    assert limit.in_flight == 2 and limit.waiting == 0


async def test_the_queue_timeout_is_a_typed_error_and_the_queue_moves_on() -> None:
    limit = ConcurrencyLimit("cloud", 1, queue_timeout_s=0.05)
    await limit.acquire()
    with pytest.raises(CloudQueueTimeoutError) as info:
        await limit.acquire()
    err = info.value
    assert isinstance(err, QueueFullError) and err.engine == "cloud"
    assert err.max_concurrency == 1 and err.queue_timeout_s == 0.05
    assert "max_concurrency=1" in str(err) and not err.retryable
    assert limit.waiting == 0  # it left the queue
    limit.release(0.1)
    assert await limit.acquire() == 0.0


async def test_the_wait_forecast_from_slot_hold_times() -> None:
    now = [0.0]
    limit = ConcurrencyLimit("cloud", 2, clock=lambda: now[0])
    await limit.acquire()
    assert limit.expected_wait_s() == 0.0  # a free slot
    await limit.acquire()
    now[0] = 2.0
    limit.release(2.0)  # a request held its slot 2 s
    await limit.acquire()  # both slots taken: one since t=0, one since t=2
    assert limit.hold_s == 2.0
    # full: the next one waits for the older holder, which has 0 s of its 2 s hold left
    assert limit.expected_wait_s() == pytest.approx(0.0)
    now[0] = 2.5  # the older one overran (taken to finish now); the newer has 1.5 s left

    async def wait() -> None:
        await limit.acquire()

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(wait)
        await settle()
        # slots free at 0 and 1.5 s; the 3 ahead take them, the first again at 0 + 2: the
        # fourth request's slot is the newer one's, one hold later
        assert limit.expected_wait_s() == pytest.approx(1.5 + 2.0)
        assert limit.expected_wait_s("interactive") == pytest.approx(0.0)  # skips "normal" ones
        tg.cancel_scope.cancel()
    assert limit.waiting == 0


async def test_the_forecast_subtracts_how_long_the_holder_has_run() -> None:
    now = [0.0]
    limit = ConcurrencyLimit("cloud", 1, clock=lambda: now[0])
    await limit.acquire()
    now[0] = 4.0
    limit.release(4.0)  # a request holds the slot 4 s
    await limit.acquire()  # the holder took the slot at t=4
    now[0] = 5.0
    assert limit.expected_wait_s() == pytest.approx(3.0)  # 4 s, 1 s of it run already
    now[0] = 7.5
    assert limit.expected_wait_s() == pytest.approx(0.5)
    now[0] = 9.0
    assert limit.expected_wait_s() == 0.0  # past the average: taken to finish now
    limit.release(5.0)  # it held the slot 5 s: the forecast forgets it
    assert limit.in_flight == 0 and limit.expected_wait_s() == 0.0


@pytest.mark.virtual_clock  # tests/unit/conftest.py
async def test_retry_after_holds_requests_and_shows_in_the_forecast() -> None:
    limit = ConcurrencyLimit("cloud", 4)
    limit.note_retry_after(0.2)
    assert limit.expected_wait_s() == pytest.approx(0.2)
    with anyio.fail_after(2):
        waited = await limit.acquire()  # held by the Retry-After, though every slot is free
    assert waited == pytest.approx(0.2) and limit.in_flight == 1
    assert limit.expected_wait_s() == 0.0


def test_retry_after_without_a_limit_informs_only() -> None:
    limit = ConcurrencyLimit("cloud", None)
    limit.note_retry_after(2.0)
    assert 1.9 < limit.expected_wait_s() <= 2.0
    assert limit._free()  # nothing waits


def test_engine_options_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        OpenAIEngine(api_key="k", max_concurrency=0)
    with pytest.raises(InvalidArgumentError, match="queue_timeout_s"):
        OpenAIEngine(api_key="k", max_concurrency=2, queue_timeout_s=-1)
    info = OpenAIEngine(api_key="k", max_concurrency=2, queue_timeout_s=1.0).info()
    assert info.expected_wait_s == 0.0 and info.unavailable is None


def _pred(engine: str, ttft: float, queue: float = 0.0) -> Prediction:
    return Prediction(engine, ttft, ttft * 1.2, ttft + 1, ttft + 2, 0.02, queue)  # type: ignore[arg-type]


def test_routing_sends_a_request_local_when_the_cloud_queue_misses_the_deadline() -> None:
    policy = Policy(name="p", routing={"prefer": "cloud", "ttft_deadline_ms": 500})
    facts = RequestFacts(prompt_tokens=20, max_tokens=64)
    queued = LiveState(
        latency={"cloud": _pred("cloud", 1.3, queue=1.0), "local": _pred("local", 0.2)},
        cloud_queue_s=1.0,
    )
    d = decide(facts, policy, queued)
    assert (d.primary, d.fallback) == ("local", "cloud")
    assert d.load == "cloud_queue" and "cloud_queue" in d.codes
    # no queue: the cloud serves
    free = LiveState(latency={"cloud": _pred("cloud", 0.3), "local": _pred("local", 0.2)})
    assert decide(facts, policy, free).primary == "cloud"
    # the cloud would miss even without its queue: not the queue's doing (the usual rule says)
    slow = LiveState(
        latency={"cloud": _pred("cloud", 1.3, queue=0.1), "local": _pred("local", 0.2)},
        cloud_queue_s=0.1,
    )
    assert "cloud_queue" not in decide(facts, policy, slow).codes


async def test_requests_routed_here_count_ahead_until_they_reach_the_queue() -> None:
    now = [0.0]
    limit = ConcurrencyLimit("cloud", 2, clock=lambda: now[0])
    limit.hold_s = 1.0
    for _ in range(3):
        limit.expect("normal")  # routed here, not yet in the queue
    # the fourth: two take the free slots, the third waits a hold, so the fourth one too
    assert limit.expected_wait_s() == pytest.approx(1.0)
    assert limit.expected_wait_s("interactive") == 0.0  # the announced are "normal"
    await limit.acquire()  # an announced one arrives: a holder now, no longer announced
    assert limit.in_flight == 1 and len(limit._expected) == 2
    assert limit.expected_wait_s() == pytest.approx(1.0)
    now[0] = EXPECT_S  # announced ones that never came are forgotten
    assert limit.expected_wait_s() == 0.0 and not limit._expected
    unlimited = ConcurrencyLimit("cloud", None)
    unlimited.expect("normal")
    assert unlimited.expected_wait_s() == 0.0 and not unlimited._expected


def test_a_burst_decided_at_once_sees_itself_in_the_cloud_queue() -> None:
    """Routing announces each request it sends to a limited cloud: a burst of decisions made
    before any request reaches the queue goes local once the queue would miss the deadline."""
    from hybridllm import HybridClient
    from hybridllm.engines.base import GenerationRequest
    from hybridllm.testing import ScriptedEngine

    cloud = OpenAIEngine(api_key="k", base_url="http://127.0.0.1:9/v1", max_concurrency=2)
    cloud.limit.hold_s = 0.4
    client = HybridClient(local=ScriptedEngine("local"), cloud=cloud, router=None)
    client.routing.latency.seed("cloud", prefill_tps=1e4, tpot_s=0.01, overhead_s=0.1)
    client.routing.latency.seed("local", prefill_tps=1e4, tpot_s=0.02, overhead_s=0.2)
    policy = Policy(
        name="burst", routing={"prefer": "cloud", "ttft_deadline_ms": 600, "objective": "latency"}
    )
    req = GenerationRequest([{"role": "user", "content": "hi"}], max_tokens=8)

    def decided() -> str | None:  # as stream() decides (a preview would announce nothing)
        return client.routing.decide(req, policy, client.engines, client.breakers).decision.primary

    primaries = [decided() for _ in range(8)]
    # 2 free slots, then 2 more after each 0.4 s hold: with 0.1 s to a first token, the
    # fifth would start at 0.8 s, past the 0.6 s deadline
    assert primaries == ["cloud"] * 4 + ["local"] * 4, primaries
    assert client.decide("hi", policy, max_tokens=8).decision.primary == "local"  # a preview
    assert len(cloud.limit._expected) == 4
