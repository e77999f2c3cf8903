"""hybridllm against HTTP- and network-level faults: the real llama_cpp.server behind the
FaultProxy as the cloud, the real llama-cpp-python engine as the local one.

Each test states what the app should see: retries that reach the real server, Retry-After
honoured, local fallback, the circuit opening, typed errors for malformed streams, keep-alives
that never count as a first token, and nothing left running (engine, connection, thread, task,
socket) when a request is cancelled.

The local engine runs on one thread: the loopback server uses the other core.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from hybridllm import Fallback, HybridClient, LlamaCppEngine, OpenAIEngine, Policy, Token
from hybridllm.errors import CloudError, CloudProtocolError, CloudTimeoutError, RateLimitError
from hybridllm.testing import FaultProxy, Faults
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

LONG = "Count from 1 to 500, separated by commas."
# ~880 SmolLM2 tokens with the chat template (the engine estimates ~970 from its length)
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 85


def cloud_engine(proxy: FaultProxy) -> OpenAIEngine:
    return OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)


def local_engine(model_path: Path) -> LlamaCppEngine:
    return LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)


async def client_closed_at(proxy: FaultProxy, conn_id: int | None = None) -> float | None:
    return await anyio.to_thread.run_sync(lambda: proxy.wait_client_closed(conn_id, timeout=3.0))


async def wait_until(cond: Callable[[], bool], limit_s: float) -> float:
    """Poll `cond()` (plain engine state, no event to wait on) every 5 ms; return when it became
    true (monotonic)."""
    with anyio.fail_after(limit_s):
        while not cond():  # noqa: ASYNC110
            await anyio.sleep(0.005)
    return time.monotonic()


# ---- HTTP status faults -----------------------------------------------------------------------


async def test_500_is_retried_and_the_retry_reaches_the_server(proxy: FaultProxy) -> None:
    proxy.faults = Faults(http_status=500, fail_first=1)
    policy = Policy(
        name="retry", routing={"prefer": "cloud", "retries": 2}, sampling={"max_tokens": 8}
    )
    async with HybridClient(cloud=cloud_engine(proxy), policy=policy) as client:
        done = await client.complete("Say hi.")
    assert done.text and done.trace.engine == "cloud" and done.trace.error is None
    assert done.trace.retries == 1
    first, second = proxy.connections[:2]
    assert first.http_fault == "HTTP 500" and second.http_fault is None
    assert second.bytes_down > 0  # the retry was answered by the real server


async def test_429_retry_after_is_honoured(proxy: FaultProxy) -> None:
    proxy.faults = Faults(http_status=429, retry_after_s=1, fail_first=1)
    policy = Policy(
        name="retry", routing={"prefer": "cloud", "retries": 2}, sampling={"max_tokens": 8}
    )
    async with HybridClient(cloud=cloud_engine(proxy), policy=policy) as client:
        done = await client.complete("Say hi.")
    tr = done.trace
    assert tr.engine == "cloud" and tr.retries == 1
    assert tr.ttft_ms is not None and tr.ttft_ms >= 1000
    first, second = proxy.connections[:2]
    assert first.closed_at is not None and second.opened_at - first.closed_at >= 0.95


async def test_429_retry_after_past_the_deadline_is_not_waited_for(proxy: FaultProxy) -> None:
    proxy.faults = Faults(http_status=429, retry_after_s=30)
    policy = Policy(
        name="retry",
        routing={"prefer": "cloud", "retries": 2, "ttft_deadline_ms": 500},
        sampling={"max_tokens": 8},
    )
    async with HybridClient(cloud=cloud_engine(proxy), policy=policy) as client:
        t0 = time.perf_counter()
        with pytest.raises(RateLimitError) as info:
            await client.complete("Say hi.")
    assert time.perf_counter() - t0 < 2.0
    assert info.value.retry_after == 30 and info.value.status_code == 429
    assert len(proxy.connections) == 1


async def test_500_on_every_request_falls_back_to_local(
    proxy: FaultProxy, model_path: Path
) -> None:
    proxy.faults = Faults(http_status=500)
    policy = Policy(name="failover", routing={"prefer": "cloud"}, sampling={"max_tokens": 8})
    async with HybridClient(
        local=local_engine(model_path), cloud=cloud_engine(proxy), policy=policy
    ) as client:
        async with client.stream("Say hi.") as s:
            events = [e async for e in s.events()]
    tr = s.trace
    assert tr.engine == "local" and tr.n_tokens > 0 and tr.error is None
    assert tr.started == ("cloud", "local")
    (fb,) = [e for e in events if isinstance(e, Fallback)]
    assert "500" in fb.reason and tr.fallback_reason == fb.reason
    assert fb.cause == tr.fallback_cause == "failed"
    assert all(t.engine == "local" for t in events if isinstance(t, Token))


# ---- connection refused: fallback, then the circuit opens -------------------------------------


async def test_refused_connections_open_the_circuit(proxy: FaultProxy, model_path: Path) -> None:
    proxy.faults = Faults(refuse=True)
    policy = Policy(
        name="failover", routing={"prefer": "cloud", "retries": 0}, sampling={"max_tokens": 4}
    )  # one try each
    async with HybridClient(
        local=local_engine(model_path), cloud=cloud_engine(proxy), policy=policy
    ) as client:
        threshold = client.breakers["cloud"].threshold
        assert threshold <= 3
        for i in range(threshold):
            assert client.breakers["cloud"].state == "closed"
            done = await client.complete("Say hi.")
            assert done.text and done.trace.engine == "local"
            assert done.trace.started == ("cloud", "local"), i
        assert client.breakers["cloud"].state == "open"
        assert len(proxy.connections) == threshold
        assert all(c.refused for c in proxy.connections)
        done = await client.complete("Say hi.")
    tr = done.trace
    assert tr.engine == "local" and tr.started == ("local",)  # routed local at once
    assert "circuit" in tr.route_reason
    assert "fallback_started" not in tr.marks
    assert len(proxy.connections) == threshold  # the cloud was not even tried


# ---- malformed streams --------------------------------------------------------------------------


async def test_malformed_sse_is_a_typed_cloud_error(proxy: FaultProxy) -> None:
    proxy.faults = Faults(sse_garbage=True)
    async with HybridClient(cloud=cloud_engine(proxy)) as client:
        with pytest.raises(CloudError) as info:
            await client.complete("Say hi.", engine="cloud", max_tokens=8)
    assert isinstance(info.value, CloudProtocolError)
    assert not info.value.received_content


async def test_malformed_sse_falls_back_to_local(proxy: FaultProxy, model_path: Path) -> None:
    proxy.faults = Faults(sse_garbage=True)
    policy = Policy(name="failover", routing={"prefer": "cloud"}, sampling={"max_tokens": 8})
    async with HybridClient(
        local=local_engine(model_path), cloud=cloud_engine(proxy), policy=policy
    ) as client:
        done = await client.complete("Say hi.")
        failures = client.breakers["cloud"].failures
    assert done.text and done.trace.engine == "local"
    assert done.trace.started == ("cloud", "local")
    assert failures == 1, "a malformed stream counts against the cloud's health"


# ---- keep-alives are not tokens ---------------------------------------------------------------


async def test_keepalives_only_lose_the_deadline_race(proxy: FaultProxy, model_path: Path) -> None:
    proxy.faults = Faults(keepalive_only_s=10, keepalive_interval_ms=50)
    policy = Policy(
        name="race",
        routing={"prefer": "cloud", "ttft_deadline_ms": 300},
        sampling={"max_tokens": 8},
    )
    async with HybridClient(
        local=local_engine(model_path), cloud=cloud_engine(proxy), policy=policy
    ) as client:
        async with client.stream("Say hi.") as s:
            events = [e async for e in s.events()]
        closed = await client_closed_at(proxy)
    tr = s.trace
    assert tr.engine == "local" and tr.n_tokens > 0
    assert all(t.engine == "local" for t in events if isinstance(t, Token))
    # the timer fired: the keep-alives that came before it did not count as a first token; the
    # local engine, a quality decision's rescue (issue 25), started ahead of the deadline by its
    # predicted TTFT (at once, on a machine where it could not be ready by 300 ms otherwise) and
    # its tokens were held until the deadline passed
    assert tr.started == ("cloud", "local") and tr.fallback_cause in ("deadline", "rescue")
    assert tr.ttft_ms is not None and tr.ttft_ms >= 300 and "rescue_released" in tr.marks
    (rec,) = proxy.connections
    assert rec.http_fault == "keepalive"
    assert rec.first_byte_down_at is not None and rec.first_byte_down_at - rec.opened_at < 0.3
    assert closed is not None, "the cloud connection was left open"
    assert tr.t_done is not None and rec.bytes_down < 2000  # closed, not played to the end


async def test_a_real_local_rescue_parks_at_its_first_token_and_goes_on_from_it(
    proxy: FaultProxy, model_path: Path
) -> None:
    """Issue 25: a quality decision's rescue, started at once by a fixed hedge, stops at its
    first token (nothing decodes beside the cloud while it is held); at the deadline that token
    goes out and the llama.cpp engine goes on from it (the same answer, no token twice)."""
    proxy.faults = Faults(keepalive_only_s=10, keepalive_interval_ms=50)
    policy = Policy(
        name="rescue",
        routing={"prefer": "cloud", "ttft_deadline_ms": 2500},
        hedge={"after_ms": 0},
        plans=["single", "hedge"],
        sampling={"max_tokens": 12, "temperature": 0.0},
    )
    async with HybridClient(
        local=local_engine(model_path), cloud=cloud_engine(proxy), policy=policy
    ) as client:
        async with client.stream("Count from one to five, in words.") as s:
            tokens = [t.text async for t in s.events() if isinstance(t, Token)]
    tr = s.trace
    assert tr.engine == "local" and "rescue_resumed" in tr.marks and tokens
    held, cont = [a for a in tr.attempts if a.engine == "local"]
    assert held.outcome == "cancelled" and held.t_end is not None and held.t_first is not None
    assert held.t_end < tr.marks["rescue_released"]  # parked before the release
    assert cont.role == "continuation" and cont.t_start >= tr.marks["rescue_released"]
    assert tr.ttft_ms is not None and tr.ttft_ms >= 2500
    assert tr.completion_tokens is not None and 1 < tr.completion_tokens <= 12
    assert tr.token_times[0] <= tr.token_times[1]  # the held token first, then the rest


# ---- cancellation -------------------------------------------------------------------------------


async def test_app_cancel_during_the_race_stops_both_engines(
    proxy: FaultProxy, model_path: Path
) -> None:
    proxy.faults = Faults(first_byte_stall_ms=10_000)
    policy = Policy(
        name="race",
        routing={"prefer": "cloud", "ttft_deadline_ms": 200},
        sampling={"max_tokens": 200},
    )
    local = local_engine(model_path)
    tokens: list[str] = []
    async with HybridClient(local=local, cloud=cloud_engine(proxy), policy=policy) as client:

        async def consume() -> None:
            async for tok in client.stream(LONG_PROMPT + LONG):
                tokens.append(tok)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            # past the deadline the local engine starts its (long) prefill; the cloud is stalled
            # (its connection may open a moment after the local engine is busy: wait for both)
            await wait_until(lambda: local.busy and bool(proxy.connections), 10.0)
            (rec,) = proxy.connections
            cloud_open = rec.closed_at is None
            t_cancel = time.monotonic()
            tg.cancel_scope.cancel()
        t_local = await wait_until(lambda: not local.busy, 2.0)
        closed = await client_closed_at(proxy, rec.id)
    assert cloud_open and not tokens, "both engines were running when the app cancelled"
    assert t_local - t_cancel < 0.5
    assert closed is not None and closed - t_cancel < 0.5


# ---- predicted TTFT past the deadline -----------------------------------------------------------


async def test_long_local_prompt_starts_the_cloud_at_once(
    proxy: FaultProxy, model_path: Path
) -> None:
    policy = Policy(
        name="race",
        routing={"prefer": "local", "ttft_deadline_ms": 150},
        sampling={"max_tokens": 8},
    )
    local = local_engine(model_path)
    async with HybridClient(local=local, cloud=cloud_engine(proxy), policy=policy) as client:
        assert local.prefill_tps is not None and 880 / local.prefill_tps > 0.15
        async with client.stream(LONG_PROMPT) as s:
            async for event in s.events():
                if isinstance(event, Fallback):
                    break  # enough: leaving stops both engines
    tr = s.trace
    assert tr.started == ("local", "cloud")
    reason = tr.fallback_reason
    assert reason is not None and "predicted at" in reason and "in parallel" in reason
    assert tr.fallback_cause == "parallel"
    assert tr.segments_ms["fallback_started"] < 50
    assert not local.busy


# ---- no leaks over many cancelled requests ------------------------------------------------------


def _open_sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # closed meanwhile
    return n


def _counts() -> tuple[int, int, int]:
    return threading.active_count(), len(asyncio.all_tasks()), _open_sockets()


async def test_start_and_cancel_cycles_leak_nothing(proxy: FaultProxy, model_path: Path) -> None:
    rng = random.Random(5)
    proxy.faults = Faults(first_byte_stall_ms=150, stall_probability=0.3, jitter_ms=10, seed=5)
    race = Policy(
        name="race",
        routing={"prefer": "cloud", "ttft_deadline_ms": 60},
        sampling={"max_tokens": 64},
    )
    local = local_engine(model_path)

    async def cycle(client: HybridClient) -> None:
        engine = rng.choice(["local", "cloud", None])
        how = rng.choice(["timeout", "break", "aclose"])
        kw: dict[str, object] = {"engine": engine} if engine else {}
        s = client.stream(LONG, max_tokens=64, **kw)  # type: ignore[arg-type]
        if how == "timeout":  # the app's task is cancelled at a random point
            with anyio.move_on_after(rng.uniform(0.0, 0.1)):
                async for _ in s:
                    pass
        elif how == "break":  # leaves the loop after a few tokens
            n = rng.randint(1, 4)
            async for _ in s:
                n -= 1
                if n == 0:
                    break
        else:  # closes right after the call, often before anything started
            await anyio.sleep(rng.uniform(0.0, 0.05))
            await s.aclose()
        del s

    async def settle(limit: tuple[int, int, int] | None) -> tuple[int, int, int]:
        """Wait until the proxy saw every connection close (and counts are at `limit`)."""
        for _ in range(300):
            await anyio.sleep(0.01)
            now = _counts()
            if (
                all(c.closed_at is not None for c in proxy.connections)
                and not local.busy
                and (limit is None or all(a <= b for a, b in zip(now, limit, strict=True)))
            ):
                break
        return _counts()

    t0 = time.monotonic()
    async with HybridClient(local=local, cloud=cloud_engine(proxy), policy=race) as client:
        for _ in range(40):
            await cycle(client)
        base = await settle(None)
        for _ in range(960):
            await cycle(client)
        threads, tasks, sockets = await settle(base)
        elapsed = time.monotonic() - t0
        n_conns = len(proxy.connections)
        open_conns = [c for c in proxy.connections if c.closed_at is None]
    print(f"1,000 cycles in {elapsed:.1f}s, {n_conns} cloud connections; base {base}")
    assert n_conns > 200, "the cloud engine took part"
    assert not open_conns
    assert tasks <= base[1], f"asyncio tasks grew: {base[1]} -> {tasks}"
    assert sockets <= base[2], f"open sockets grew: {base[2]} -> {sockets}"
    # anyio keeps idle worker threads for a while: allow the pool one or two more than warm
    assert threads <= base[0] + 2, f"threads grew: {base[0]} -> {threads}"
    assert not local.busy


async def test_keepalives_without_end_time_out_a_cloud_only_request(proxy: FaultProxy) -> None:
    """Keep-alives are bytes, so the HTTP read timeout never fires on them; the engine's read
    timeout counts stream events instead (found by the soak: such a request never ended)."""
    proxy.faults = Faults(keepalive_only_s=math.inf, keepalive_interval_ms=50)
    policy = Policy(
        name="only",
        routing={"prefer": "cloud", "fallback_order": ("cloud",), "retries": 0},
        sampling={"max_tokens": 8},
    )
    engine = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS, timeout=1.0)
    async with HybridClient(cloud=engine, policy=policy) as client:
        t0 = time.perf_counter()
        with anyio.fail_after(10), pytest.raises(CloudTimeoutError) as info:
            await client.complete("Say hi.")
        elapsed = time.perf_counter() - t0
        closed = await client_closed_at(proxy)
    assert 0.9 <= elapsed < 3.0
    assert not info.value.received_content and "no event" in str(info.value)
    (rec,) = proxy.connections
    assert rec.http_fault == "keepalive" and rec.bytes_down > 0  # pings did arrive
    assert closed is not None, "the cloud connection was left open"
