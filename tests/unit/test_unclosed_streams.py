"""Every memory object stream a request opens is closed on every path: no
`ResourceWarning: Unclosed <MemoryObjectSendStream ...>` after a request, whatever plan ran and
however it ended (issue 24: the race and the handoff left their send side open)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Awaitable, Callable

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.errors import ServerError
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio
Use = Callable[[HybridClient], Awaitable[object]]


async def _complete(client: HybridClient) -> object:
    return await client.complete("hi")


async def _local_only(client: HybridClient) -> object:
    return await client.complete("hi", engine="local")


async def _handoff(client: HybridClient) -> object:
    return await client.complete("hi", plan="handoff")


async def _left_early(client: HybridClient) -> object:
    async for _ in client.stream("hi"):
        break
    return None


async def _cloud_fails(client: HybridClient) -> object:
    return await client.complete("hi", policy=Policy(name="c", routing={"prefer": "cloud"}))


async def _serve(use: Use) -> tuple[int, int]:
    """Run `use` on a fresh client; the engines (and an error a script holds, whose traceback
    keeps the plan's frames alive) are dropped on return. Returns the requests each engine got."""
    local = ScriptedEngine("local", tokens=["a", "b", "c"])
    cloud = ScriptedEngine("cloud", tokens=["x", "y"])
    if use is _cloud_fails:
        cloud = ScriptedEngine("cloud", script=[ServerError("down", status_code=503)])
    pol = Policy(name="p", handoff={"after_tokens": 1})
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
        await use(client)
    return len(local.requests), len(cloud.requests)


@pytest.mark.parametrize("use", [_complete, _local_only, _handoff, _left_early, _cloud_fails])
async def test_a_request_leaves_no_memory_stream_unclosed(use: Use) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        served = await _serve(use)
        gc.collect()  # a stream left open warns when it is collected
    unclosed = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert unclosed == []
    assert sum(served) >= 1  # the request ran
    if use is _cloud_fails:  # the cloud failed first, the local engine answered
        assert served == (1, 3)  # the cloud and its 2 retries (a 503 is retryable)
