"""Unit tests of continuity across engines: after a turn the cloud wrote, the client has the
local engine prefill the conversation with the cloud's answer, in the background, one at a
time; never after a local turn, and a client that closes stops it. `ScriptedEngine` doubles
(scripted test engines) on the virtual clock; the local one records what it was asked to warm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from hybridllm import HybridClient, Policy, errors
from hybridllm.engines.capabilities import Warms
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]
CLOUD_FIRST = Policy(name="c", routing={"prefer": "cloud", "objective": "latency"})


class WarmingLocal(ScriptedEngine):
    """A scripted local engine that also warms (taking `warm_s` of virtual time)."""

    def __init__(self, warm_s: float = 0.5, **kw: Any) -> None:
        super().__init__("local", **kw)
        self.warm_s = warm_s
        self.warmed: list[list[dict[str, Any]]] = []
        self.keys: list[str | None] = []
        self.forgotten: list[str] = []
        self.finished = 0

    async def warm(self, messages: Sequence[Any], conversation: str | None = None) -> int:
        self.warmed.append([dict(m) for m in messages])
        self.keys.append(conversation)
        await anyio.sleep(self.warm_s)
        self.finished += 1
        return 10

    async def forget(self, conversation: str) -> int:
        self.forgotten.append(conversation)
        return 0


async def test_a_cloud_turn_is_warmed_locally_with_its_answer() -> None:
    local = WarmingLocal(tokens=["x"])
    cloud = ScriptedEngine("cloud", tokens=["Hel", "lo"])
    assert isinstance(local, Warms)
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        _ = [t async for t in client.stream("hi")]
        await anyio.sleep(1.0)
    assert local.warmed == [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]
    ]
    assert local.finished == 1


async def test_no_warm_after_a_local_turn_one_at_a_time_and_stopped_at_close() -> None:
    local = WarmingLocal(warm_s=10.0, tokens=["x"])
    cloud = ScriptedEngine("cloud", tokens=["a"])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        _ = [t async for t in client.stream("one", engine="local")]
        assert local.warmed == []
        _ = [t async for t in client.stream("two")]
        _ = [t async for t in client.stream("three")]  # the first still runs
        await anyio.sleep(0.1)
        assert len(local.warmed) == 1  # the second waits its turn
        await anyio.sleep(10.0)
        assert local.finished == 1 and len(local.warmed) == 2  # then it runs
    assert local.finished == 1  # closing the client stopped the one under way


async def test_no_warm_for_a_turn_sent_to_the_cloud_or_a_policy_without_the_local_engine() -> None:
    local = WarmingLocal(tokens=["x"])
    cloud = ScriptedEngine("cloud", tokens=["a"])
    cloud_only = Policy(name="o", routing={"fallback_order": ["cloud"]})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        _ = [t async for t in client.stream("hi", engine="cloud")]  # the caller chose the cloud
        _ = [t async for t in client.stream("hi", policy=cloud_only)]
        await anyio.sleep(1.0)
    assert local.warmed == []


async def test_a_keyed_conversation_waits_once_under_its_key_and_forget_drops_it() -> None:
    """`conversation=` (the app's key): the key reaches the warm-up; a newer cloud turn of the
    same conversation replaces its waiting warm-up (the older one would only be cut short);
    `forget` drops the waiting one and tells the local engine."""
    local = WarmingLocal(warm_s=10.0, tokens=["x"])
    cloud = ScriptedEngine("cloud", tokens=["a"])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        _ = [t async for t in client.stream("busy", conversation="z")]  # warming for 10 s
        await anyio.sleep(0.1)
        _ = [t async for t in client.stream("one", conversation="a")]
        _ = [t async for t in client.stream([{"role": "user", "content": "two"}], conversation="a")]
        _ = [t async for t in client.stream("other", conversation="b")]
        await client.forget("b")
        await anyio.sleep(25.0)
    assert local.keys == ["z", "a"]  # "a" once (its newer turn), "b" forgotten before its turn
    assert local.warmed[1][0]["content"] == "two"
    assert local.forgotten == ["b"]


@pytest.mark.parametrize("bad", ["", "   ", "x" * 257, 7, b"key"])
async def test_a_bad_conversation_key_is_refused_before_anything_is_sent(bad: object) -> None:
    local, cloud = WarmingLocal(tokens=["x"]), ScriptedEngine("cloud", tokens=["a"])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        with pytest.raises(errors.InvalidArgumentError) as info:
            await client.complete("hi", conversation=bad)  # type: ignore[arg-type]
        assert info.value.argument == "conversation"
        with pytest.raises(errors.InvalidArgumentError):
            await client.forget(bad)  # type: ignore[arg-type]
    assert cloud.requests == [] and local.requests == []
