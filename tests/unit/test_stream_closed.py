"""A stream closed by the app ends with a typed signal (issue 42, item 6): `s.aclose()` from
another task ends the consumer's loop, and the trace says why (`finish_reason == "cancelled"`,
the attempt "cancelled"), where it used to say nothing (`None`, no error)."""

from __future__ import annotations

import anyio
import pytest

from hybridllm import HybridClient, Policy
from hybridllm.events import Event, Token
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

CLOUD = Policy(name="c", routing={"prefer": "cloud", "retries": 0})


async def test_aclose_from_another_task_ends_the_loop_with_a_typed_finish() -> None:
    cloud = ScriptedEngine("cloud", tokens=["a", "b", "c", "d"], ttft_s=0.01, tpot_s=0.5)
    local = ScriptedEngine("local", tokens=["l"])
    seen: list[Event] = []
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD) as client:
        s = client.stream("q")
        first = anyio.Event()

        async def consume() -> None:
            async for e in s.events():
                seen.append(e)
                if isinstance(e, Token):
                    first.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await first.wait()
            await s.aclose()  # another task closes the stream while the consumer waits
    assert [e.text for e in seen if isinstance(e, Token)] == ["a"]
    assert s.trace.finish_reason == "cancelled" and s.trace.error is None
    assert s.trace.attempts[-1].outcome == "cancelled" and cloud.active == 0


async def test_a_completed_stream_keeps_its_engines_finish_reason() -> None:
    cloud = ScriptedEngine("cloud", tokens=["a", "b"])
    async with HybridClient(cloud=cloud, router=None, policy=CLOUD) as client:
        async with client.stream("q") as s:
            _ = [e async for e in s.events()]
        await s.aclose()  # closing a finished stream changes nothing
    assert s.trace.finish_reason == "stop"
