"""`complete(..., timeout=)` (issue 42, item 6): seconds for the whole answer, as openai-python
has. Past it the request is closed (its engine freed, its trace "cancelled") and
`AnswerTimeoutError` (also a `TimeoutError`) holds what had come: nothing received is lost.
Scripted engines on the virtual clock (orchestration timing only)."""

from __future__ import annotations

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.errors import AnswerTimeoutError, InvalidArgumentError
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

CLOUD = Policy(name="c", routing={"prefer": "cloud", "retries": 0})


def engines() -> tuple[ScriptedEngine, ScriptedEngine]:
    cloud = ScriptedEngine("cloud", tokens=["a", "b", "c", "d"], ttft_s=0.1, tpot_s=0.5)
    return ScriptedEngine("local", tokens=["l"]), cloud


async def test_a_slow_answer_past_the_timeout_raises_with_what_had_come() -> None:
    local, cloud = engines()
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD) as client:
        with pytest.raises(AnswerTimeoutError) as caught:
            await client.complete("q", timeout=1.2)  # a at 0.1 s, b at 0.6, c at 1.1, d at 1.6
    err = caught.value
    assert isinstance(err, TimeoutError) and err.timeout_s == 1.2
    assert err.text == "abc" and err.tool_calls == ()
    assert err.trace.finish_reason == "cancelled" and cloud.active == 0  # type: ignore[attr-defined]


async def test_an_answer_inside_the_timeout_is_whole() -> None:
    local, cloud = engines()
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD) as client:
        done = await client.complete("q", timeout=5.0)
        unbounded = await client.complete("q")
    assert done.text == "abcd" and done.finish_reason == "stop"
    assert unbounded.text == "abcd"


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "5", True])
async def test_a_bad_timeout_is_refused_before_anything_runs(bad: object) -> None:
    local, cloud = engines()
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD) as client:
        with pytest.raises(InvalidArgumentError) as caught:
            await client.complete("q", timeout=bad)  # type: ignore[arg-type]
    assert caught.value.argument == "timeout" and cloud.requests == []
