"""What `OpenAIEngine` puts in a request body for the output bound (issue 24): `max_tokens` has a
hard ceiling, an engine that knows its context sends at most what the context leaves, the field
is the one the endpoint accepts (`max_completion_tokens` for OpenAI's reasoning models), and the
trace says what was sent. The endpoint is a loopback recorder of request bodies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hybridllm import GenerationRequest, HybridClient, OpenAIEngine
from hybridllm.engines.base import estimate_prompt_tokens
from hybridllm.engines.validate import MAX_TOKENS
from hybridllm.errors import InvalidArgumentError
from hybridllm.events import TokenLimit
from tests.unit.sse_endpoint import Endpoint as Recorder, serving

pytestmark = pytest.mark.anyio
MSGS = ({"role": "user", "content": "hi"},)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    yield from serving(Recorder())


async def _complete(engine: OpenAIEngine, **kwargs: Any) -> Any:
    async with HybridClient(cloud=engine, router=None) as client:
        return await client.complete("hi", **kwargs)


# ---- the ceiling and the context -------------------------------------------------------------


async def test_max_tokens_above_the_ceiling_is_refused_before_anything_is_sent(
    recorder: Recorder,
) -> None:
    engine = OpenAIEngine(base_url=recorder.url, api_key="k", model="m")
    async with HybridClient(cloud=engine, router=None) as client:
        with pytest.raises(InvalidArgumentError, match="max_tokens must be an int from 1 to"):
            client.stream("hi", max_tokens=10**9)
        with pytest.raises(InvalidArgumentError):
            GenerationRequest(MSGS, max_tokens=MAX_TOKENS + 1)
        done = await client.complete("hi", max_tokens=MAX_TOKENS)  # the ceiling itself passes
    assert [b["max_tokens"] for b in recorder.bodies] == [MAX_TOKENS]  # no context: as asked
    assert done.trace.token_limit == TokenLimit("max_tokens", MAX_TOKENS, MAX_TOKENS)


async def test_a_known_context_bounds_what_is_sent_and_the_trace_says_so(
    recorder: Recorder,
) -> None:
    engine = OpenAIEngine(base_url=recorder.url, api_key="k", model="m", max_context=100)
    done = await _complete(engine, max_tokens=500_000)
    sent = recorder.bodies[0]["max_tokens"]
    assert 1 <= sent < 100 and sent + estimate_prompt_tokens(MSGS) == 100
    assert done.trace.token_limit == TokenLimit("max_tokens", sent, 500_000)
    assert engine.info().n_ctx == 100
    small = await _complete(engine, max_tokens=5)  # what fits is sent as asked
    assert recorder.bodies[1]["max_tokens"] == 5 and small.trace.token_limit.sent == 5


def test_max_context_is_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="max_context must be an int >= 1"):
        OpenAIEngine(max_context=0)
    with pytest.raises(InvalidArgumentError, match="token_limit_param must be one of"):
        OpenAIEngine(token_limit_param="max_output_tokens")  # type: ignore[arg-type]


# ---- max_tokens or max_completion_tokens -----------------------------------------------------


async def test_max_completion_tokens_is_sent_when_asked_for(recorder: Recorder) -> None:
    engine = OpenAIEngine(
        base_url=recorder.url, api_key="k", model="m", token_limit_param="max_completion_tokens"
    )
    done = await _complete(engine, max_tokens=7)
    body = recorder.bodies[0]
    assert body["max_completion_tokens"] == 7 and "max_tokens" not in body
    assert done.trace.token_limit == TokenLimit("max_completion_tokens", 7, 7)


async def test_auto_sends_max_tokens_to_an_endpoint_that_is_not_openai(recorder: Recorder) -> None:
    engine = OpenAIEngine(base_url=recorder.url, api_key="k", model="o3-mini")  # e.g. a vLLM
    await _complete(engine, max_tokens=7)
    body = recorder.bodies[0]
    assert body["max_tokens"] == 7 and "max_completion_tokens" not in body


@pytest.mark.parametrize(
    ("base_url", "model", "param"),
    [
        (None, "o1", "max_completion_tokens"),  # the SDK's default host: api.openai.com
        ("https://api.openai.com/v1", "o3-mini", "max_completion_tokens"),
        ("https://api.openai.com/v1", "o4-mini-2025-04-16", "max_completion_tokens"),
        ("https://api.openai.com/v1", "gpt-5", "max_completion_tokens"),
        ("https://api.openai.com/v1", "gpt-5.1-mini", "max_completion_tokens"),
        ("https://me.openai.azure.com/openai/v1", "o3", "max_completion_tokens"),
        ("https://api.openai.com/v1", "gpt-4o-mini", "max_tokens"),
        ("https://api.openai.com/v1", "omni-moderation", "max_tokens"),
        ("http://127.0.0.1:8000/v1", "gpt-5", "max_tokens"),
    ],
)
def test_auto_chooses_by_host_and_model(base_url: str | None, model: str, param: str) -> None:
    engine = OpenAIEngine(base_url=base_url, api_key="k", model=model)
    assert engine.token_limit(GenerationRequest(MSGS, max_tokens=9)) == TokenLimit(param, 9, 9)


# ---- prefix caching ----------------------------------------------------------------------------


async def test_cached_prompt_tokens_the_usage_reports_reach_the_trace() -> None:
    from tests.unit.sse_endpoint import Endpoint, chunk

    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 1,
        "total_tokens": 901,
        "prompt_tokens_details": {"cached_tokens": 768},
    }
    chunks = [chunk({"content": "ok"}), {**chunk({}, "stop"), "usage": usage}]
    for endpoint in serving(Endpoint(chunks)):
        done = await _complete(OpenAIEngine(base_url=endpoint.url, api_key="k", model="m"))
        assert done.trace.cached_prompt_tokens == 768 and done.trace.prompt_tokens == 900


async def test_no_prompt_cache_key_to_an_endpoint_that_is_not_openai(recorder: Recorder) -> None:
    await _complete(OpenAIEngine(base_url=recorder.url, api_key="k", model="m"))
    assert "prompt_cache_key" not in recorder.bodies[0]


def test_a_conversation_keeps_its_cache_key_from_turn_to_turn() -> None:
    from hybridllm.engines.openai_engine import conversation_key

    sys_ = {"role": "system", "content": "Be brief."}
    first = [sys_, {"role": "user", "content": "Plan a trip."}]
    later = [
        *first,
        {"role": "assistant", "content": "Where?"},
        {"role": "user", "content": "Rome"},
    ]
    other = [sys_, {"role": "user", "content": "Write a poem."}]
    assert conversation_key(first) == conversation_key(later) != conversation_key(other)
    assert "trip" not in conversation_key(first)
    engine = OpenAIEngine(api_key="k", model="gpt-4o-mini")  # OpenAI's own host
    request = GenerationRequest(tuple(later))
    fields = engine._fields(request, engine.token_limit(request))
    assert fields["prompt_cache_key"] == conversation_key(first)
    # the app's own key (`conversation=`) decides instead, hashed: never sent as given
    keyed = GenerationRequest(tuple(later), conversation="user-42@example.com")
    fields = engine._fields(keyed, engine.token_limit(keyed))
    assert fields["prompt_cache_key"] == conversation_key(later, "user-42@example.com")
    assert fields["prompt_cache_key"] not in (conversation_key(first), conversation_key(other))
    assert "user-42" not in str(fields) and "example.com" not in str(fields)


@pytest.mark.parametrize(
    ("base_url", "model", "sampled"),
    [
        ("https://api.openai.com/v1", "o3-mini", False),  # refuses temperature and top_p
        ("https://api.openai.com/v1", "gpt-5", False),
        ("https://api.openai.com/v1", "gpt-4o-mini", True),
        ("http://127.0.0.1:8000/v1", "gpt-5", True),  # another host: sent as asked
    ],
)
def test_temperature_and_top_p_follow_the_reasoning_rule(
    base_url: str, model: str, sampled: bool
) -> None:
    """Issue 42 item 6: the hosts that get `max_completion_tokens` get no sampling fields."""
    engine = OpenAIEngine(base_url=base_url, api_key="k", model=model)
    request = GenerationRequest(MSGS, max_tokens=9, temperature=0.3, top_p=0.9)
    fields = engine._fields(request, engine.token_limit(request))
    assert ("temperature" in fields, "top_p" in fields) == (sampled, sampled)
    if sampled:
        assert (fields["temperature"], fields["top_p"]) == (0.3, 0.9)
