"""A prompt that does not fit is a routing fact, not a crash (issue 42, item 1), with scripted
engines: each engine's context (`EngineInfo.n_ctx`: the local n_ctx, `OpenAIEngine(max_context=)`)
is a fact of `gather`; `decide()` sends a prompt plus its output bound that an engine cannot hold
to one that can, before any work (the "context_overflow" code), and where none can, the request
ends at once with `ContextOverflowError` (the gateway: 400 `context_length_exceeded`)."""

from __future__ import annotations

import httpx
import pytest

from hybridllm import HybridClient, Policy
from hybridllm.errors import ContextOverflowError
from hybridllm.events import Fallback, Token
from hybridllm.gateway.app import create_app
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.routing import LiveState, RequestFacts, decide
from hybridllm.runtime.trace import Trace
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

LONG = 40_000  # the prompt's tokens, as the local tokenizer counts them
LOCAL_FIRST = Policy(name="local-first", routing={"prefer": "local", "ttft_deadline_ms": 400})


def engines(prompt_tokens: int, cloud_ctx: int | None = None) -> tuple[ScriptedEngine, ...]:
    local = ScriptedEngine("local", tokens=["l"], n_ctx=4096, token_count=prompt_tokens)
    cloud = ScriptedEngine("cloud", tokens=["c"], n_ctx=cloud_ctx)
    return local, cloud


def test_decide_sends_a_prompt_the_local_context_cannot_hold_to_the_cloud() -> None:
    facts = RequestFacts(prompt_tokens=LONG, max_tokens=256)
    state = LiveState(context={"local": 4096, "cloud": 128_000})
    d = decide(facts, LOCAL_FIRST, state)
    assert d.primary == "cloud" and d.fallback is None  # the local engine cannot rescue it
    assert "context_overflow" in d.codes and d.objective == "availability"
    fits = decide(RequestFacts(prompt_tokens=3000, max_tokens=256), LOCAL_FIRST, state)
    assert fits.primary == "local" and "context_overflow" not in fits.codes


def test_an_engine_that_holds_the_prompt_stays_though_the_answer_may_be_cut() -> None:
    """3,900 prompt tokens + 256 output tokens in a local context of 4,096: the local engine
    holds the prompt and answers what its context leaves (engines bound `max_tokens`), so it
    stays, primary or the cloud's rescue; only a prompt it cannot hold sends it out."""
    facts = RequestFacts(prompt_tokens=3900, max_tokens=256)
    both = LiveState(context={"local": 4096, "cloud": 128_000})
    d = decide(facts, LOCAL_FIRST, both)
    assert d.primary == "local" and d.fallback == "cloud" and not d.overflowed
    cloud_first = decide(facts, LOCAL_FIRST.with_(routing={"prefer": "cloud"}), both)
    assert cloud_first.primary == "cloud" and cloud_first.fallback == "local"  # the rescue stays
    full = decide(RequestFacts(prompt_tokens=4096, max_tokens=256), LOCAL_FIRST, both)
    assert full.primary == "cloud" and full.overflowed == ("local",)


def test_a_context_nobody_reported_is_no_limit() -> None:
    d = decide(RequestFacts(prompt_tokens=LONG, max_tokens=256), LOCAL_FIRST, LiveState())
    assert d.primary == "local" and "context_overflow" not in d.codes


async def test_the_client_routes_a_long_prompt_to_the_cloud_before_any_local_work() -> None:
    local, cloud = engines(LONG)
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("a very long prompt") as s:
            events = [e async for e in s.events()]
    assert "".join(e.text for e in events if isinstance(e, Token)) == "c"
    assert not local.requests and not any(isinstance(e, Fallback) for e in events)
    assert s.trace.engine == "cloud" and "context_overflow" in s.trace.reason_codes
    assert s.trace.decision is not None and s.trace.decision.overflowed == ("local",)
    assert Trace.from_dict(s.trace.to_dict()).decision == s.trace.decision


@pytest.mark.parametrize("how", ["stream", "complete", "decide"])
async def test_where_no_engine_can_hold_it_the_error_comes_at_once(how: str) -> None:
    local, cloud = engines(LONG, cloud_ctx=32_000)
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        with pytest.raises(ContextOverflowError) as caught:
            if how == "stream":
                async for _ in client.stream("a very long prompt"):
                    pass
            elif how == "complete":
                await client.complete("a very long prompt")
            else:
                client.decide("a very long prompt")
    err = caught.value
    assert (err.engine, err.n_ctx, err.prompt_tokens, err.max_tokens) == (
        "cloud",
        32_000,
        LONG,
        256,
    )
    assert not local.requests and not cloud.requests  # no engine did any work


async def test_a_private_prompt_too_long_for_the_device_is_never_sent_out() -> None:
    """Privacy keeps it local; the local context cannot hold it: the error, not the cloud (whose
    larger context is not the one that mattered)."""
    local, cloud = engines(LONG, cloud_ctx=128_000)
    keep = LOCAL_FIRST.with_(privacy={"mode": "keep-local"})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=keep) as client:
        with pytest.raises(ContextOverflowError) as caught:
            await client.complete("mail me at ada@example.com about the long report")
    assert caught.value.engine == "local" and caught.value.n_ctx == 4096
    assert not cloud.requests and not local.requests


async def test_the_gateway_answers_400_context_length_exceeded_before_any_work() -> None:
    local, cloud = engines(LONG, cloud_ctx=8192)
    hybrid = HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST)
    app = create_app(hybrid, GatewayLimits(), api_key="sk-gw")
    body = {"model": "hybridllm/chat", "messages": [{"role": "user", "content": "a long prompt"}]}
    async with hybrid:
        transport = httpx.ASGITransport(app=app)
        auth = {"authorization": "Bearer sk-gw"}
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=auth) as h:
            whole = await h.post("/v1/chat/completions", json=body)
    assert whole.status_code == 400
    assert whole.json()["error"]["code"] == "context_length_exceeded"
    assert not local.requests and not cloud.requests
