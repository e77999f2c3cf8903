"""The policy's `retries` in every plan (issue 24, section 6): a retryable cloud failure before
any content is retried before the local engine takes over, whichever plan runs; a failure that is
not retryable, or one after content came, is never retried. Scripted engines only: what is
judged is who was asked how often and who answered, never how long it took."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest

from hybridllm import HybridClient, Policy, Token
from hybridllm.engines.base import EngineInfo, GenerationRequest, Message
from hybridllm.errors import AuthenticationError, RateLimitError, ServerError
from hybridllm.events import Chunk
from hybridllm.testing import ScriptedEngine
from tests.unit.test_cascade_scripted import (
    FakeRouter,
    SignalScriptedEngine,
    policy as cascade_policy,
)

pytestmark = pytest.mark.anyio


def unavailable() -> ServerError:
    return ServerError("service unavailable", status_code=503)


class Takes:
    """A cloud engine whose n-th request plays the n-th script (the last one for the rest)."""

    def __init__(self, *scripts: list[Any]) -> None:
        self.name = "cloud"
        self.plays = [ScriptedEngine("cloud", script=s) for s in scripts]
        self.requests: list[GenerationRequest] = []

    async def start(self) -> None:
        pass

    def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        self.requests.append(request)
        return self.plays[min(len(self.requests), len(self.plays)) - 1].stream(request)

    def info(self) -> EngineInfo:
        return self.plays[0].info()

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return None

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return None

    async def aclose(self) -> None:
        pass


async def answer(
    local: Any, cloud: Takes, policy: Policy, plan: Any = None, router: Any = None
) -> tuple[list[Token], Any]:
    async with HybridClient(local=local, cloud=cloud, policy=policy, router=router) as client:
        async with client.stream("q", plan=plan) as s:
            tokens = [e async for e in s.events() if isinstance(e, Token)]
    return tokens, s.trace


async def test_the_race_retries_the_cloud_before_the_local_engine_takes_over() -> None:
    local = ScriptedEngine("local", tokens=["L"])
    cloud = Takes([unavailable()], [unavailable()], ["C", "!"])
    tokens, trace = await answer(
        local, cloud, Policy(name="r", routing={"prefer": "cloud", "retries": 2})
    )
    assert [(t.engine, t.text) for t in tokens] == [("cloud", "C"), ("cloud", "!")]
    assert len(cloud.requests) == 3 and trace.retries == 2
    assert not local.requests and trace.started == ("cloud",)


async def test_a_hedge_retries_the_cloud_and_the_retry_can_win() -> None:
    local = ScriptedEngine("local", script=[0.5, "slow"])
    cloud = Takes([RateLimitError("slow down", status_code=429, retry_after=0.0)], ["fast"])
    pol = Policy(name="h", routing={"prefer": "local", "retries": 1}, hedge={"after_ms": 10})
    tokens, trace = await answer(local, cloud, pol)
    assert [(t.engine, t.text) for t in tokens] == [("cloud", "fast")]
    assert len(cloud.requests) == 2 and trace.retries == 1 and trace.hedged


async def test_the_handoff_retries_the_cloud_continuation() -> None:
    local = ScriptedEngine("local", tokens=["A", "B", "C", "D"], tpot_s=0.01)
    cloud = Takes([unavailable()], ["x", "y"])
    pol = Policy(
        name="h",
        routing={"prefer": "local", "stall_ms": 2000, "retries": 1},
        handoff={"after_tokens": 2},
    )
    tokens, trace = await answer(local, cloud, pol, plan="handoff")
    assert "".join(t.text for t in tokens) == "ABxy"
    assert [r.assistant_prefix for r in cloud.requests] == ["AB", "AB"]
    assert trace.handoff.outcome == "switched" and trace.retries == 1


async def test_the_cascade_retries_the_cloud_it_defers_to() -> None:
    local = SignalScriptedEngine(hold_s=0.01, tokens=["lo"])
    cloud = Takes([unavailable()], ["C1", "C2"])
    pol = cascade_policy(routing={"retries": 1})
    tokens, trace = await answer(local, cloud, pol, plan="cascade", router=FakeRouter(0.9))
    assert [(t.engine, t.text) for t in tokens] == [("cloud", "C1"), ("cloud", "C2")]
    assert trace.cascade.decision == "cloud"
    assert len(cloud.requests) == 2 and trace.retries == 1


async def test_a_failure_that_is_not_retryable_goes_to_the_local_engine_at_once() -> None:
    local = ScriptedEngine("local", tokens=["L"])
    cloud = Takes([AuthenticationError("bad key", status_code=401)], ["C"])
    tokens, trace = await answer(
        local, cloud, Policy(name="r", routing={"prefer": "cloud", "retries": 3})
    )
    assert [(t.engine, t.text) for t in tokens] == [("local", "L")]
    assert len(cloud.requests) == 1 and trace.retries == 0


async def test_content_received_is_never_retried() -> None:
    """The error claims nothing was received (so `retryable` is true), but the stream had
    yielded text: the relay knows better, and the local engine continues the answer."""
    local = ScriptedEngine("local", tokens=["b"])
    cloud = Takes(["a", unavailable()], ["never"])
    tokens, trace = await answer(
        local, cloud, Policy(name="r", routing={"prefer": "cloud", "retries": 3})
    )
    assert [(t.engine, t.text) for t in tokens] == [("cloud", "a"), ("local", "b")]
    assert len(cloud.requests) == 1 and trace.retries == 0
    assert local.requests[0].assistant_prefix == "a"


async def test_no_retry_past_the_first_token_deadline_where_a_fallback_exists() -> None:
    local = ScriptedEngine("local", tokens=["L"])
    cloud = Takes([RateLimitError("slow down", status_code=429, retry_after=30.0)], ["C"])
    pol = Policy(name="d", routing={"prefer": "cloud", "ttft_deadline_ms": 500, "retries": 3})
    tokens, trace = await answer(local, cloud, pol)
    assert [(t.engine, t.text) for t in tokens] == [("local", "L")]
    assert len(cloud.requests) == 1 and trace.retries == 0
