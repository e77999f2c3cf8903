"""The cloud concurrency limit against the real stand-in cloud (llama_cpp.server, SmolLM2, on
loopback through a FaultProxy): requests beyond the limit wait for a slot, a request that
cannot get one in time fails with the typed error, the latency model learns the queue wait,
and routing sends a request to the local engine when the cloud queue would miss its
deadline."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.errors import CloudQueueTimeoutError
from hybridllm.runtime.stream import Stream
from hybridllm.testing import FaultProxy
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

COUNT = "Count from 1 to 100, separated by commas."


def cloud(proxy: FaultProxy, **kw: object) -> OpenAIEngine:
    return OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS, **kw)  # type: ignore[arg-type]


async def test_requests_past_the_limit_wait_for_a_slot(proxy: FaultProxy) -> None:
    engine = cloud(proxy, max_concurrency=1, queue_timeout_s=30.0)
    peak = 0
    async with HybridClient(cloud=engine) as client:
        streams: list[Stream] = []

        async def one() -> None:
            async with client.stream(COUNT, max_tokens=16, temperature=0.0) as s:
                assert "".join([t async for t in s])
            streams.append(s)

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, engine.limit.in_flight)
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            async with anyio.create_task_group() as reqs:
                for _ in range(3):
                    reqs.start_soon(one)
            tg.cancel_scope.cancel()
        waits = list(client.routing.latency.engine("cloud").queue_waits)
    assert peak == 1
    starts = sorted(s.trace.marks["started"] - s.trace.marks["queued"] for s in streams)
    assert starts[0] < 0.05 and starts[2] > starts[1] > 0.05  # the 2nd and 3rd waited in turn
    spans = sorted((s.trace.marks["started"], s.trace.marks["done"]) for s in streams)
    for (_, done), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= done - 0.01  # one at a time
    assert max(waits) > 0.05  # the latency model saw the queue wait
    assert engine.limit.hold_s is not None and engine.limit.hold_s > 0


async def test_a_request_that_gets_no_slot_in_time_fails_typed(proxy: FaultProxy) -> None:
    engine = cloud(proxy, max_concurrency=1, queue_timeout_s=0.2)
    async with HybridClient(cloud=engine) as client:
        async with client.stream(COUNT, max_tokens=200, temperature=0.0) as long:
            await long.__anext__()  # it holds the only slot
            with pytest.raises(CloudQueueTimeoutError) as info:
                await client.complete("Say hi.", max_tokens=4)
            assert info.value.max_concurrency == 1
            assert client.breakers["cloud"].state == "closed"  # the client's limit, not a fault


async def test_routing_goes_local_when_the_cloud_queue_would_miss_the_deadline(
    model_path: Path, proxy: FaultProxy
) -> None:
    engine = cloud(proxy, max_concurrency=1)
    local = LlamaCppEngine(model_path, n_ctx=1024)
    policy = Policy(
        name="fast",
        routing={"prefer": "cloud", "ttft_deadline_ms": 600},
        sampling={"max_tokens": 8},
    )
    async with HybridClient(local=local, cloud=engine, router=None) as client:
        for _ in range(3):  # learn the cloud (past its cold start) and its slot hold time
            await client.complete(COUNT, engine="cloud", max_tokens=60, temperature=0.0)
        assert engine.limit.hold_s is not None and engine.limit.hold_s > 0.6
        decision = client.decide("Say hi.", policy, max_tokens=8).decision
        assert decision.primary == "cloud", decision.reasons  # a free slot: the cloud serves
        async with client.stream(COUNT, engine="cloud", max_tokens=120) as long:
            await long.__anext__()  # it holds the only slot
            done = await client.complete("Say hi.", policy=policy)
        assert done.trace.engine == "local"
        assert "cloud_queue" in done.trace.reason_codes
