"""Continuation dialects, probed (issue 43, item 1): `OpenAIEngine(continuation="auto")` (the
default) probes the endpoint once with a tiny count and sends every continuation in the first
dialect that continued it (`continue_final_message`, a trailing assistant message, else the
instruction); a dialect whose fields the endpoint refuses (a 4xx) is skipped; the dialect is in
`RequestSent` and `Trace.continuation`. The endpoint is a loopback server in OpenAI's documented
streaming shape that answers per request body (no model: vLLM is not available here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hybridllm import GenerationRequest, OpenAIEngine
from hybridllm.engines.continuation import PROBE_START
from hybridllm.events import Delta, RequestSent
from hybridllm.runtime.trace import Trace
from tests.unit.sse_endpoint import Endpoint, chunk, serving

pytestmark = pytest.mark.anyio

ASK = ({"role": "user", "content": "Write about lighthouses."},)
GOES_ON = [chunk({"content": " 6, 7"}), chunk({}, "stop")]
RESTARTS = [chunk({"content": "1, 2, 3"}), chunk({}, "stop")]


def final_open(body: dict[str, Any]) -> bool:
    return body["messages"][-1]["role"] == "assistant"


def probed(body: dict[str, Any]) -> bool:
    return body["messages"][-1].get("content") == PROBE_START


def vllm(body: dict[str, Any]) -> list[dict[str, Any]] | int:
    """Continues a final message only with `continue_final_message` (vLLM's way)."""
    if (body.get("continue_final_message") and final_open(body)) or not probed(body):
        return GOES_ON
    return RESTARTS


def prefix_host(body: dict[str, Any]) -> list[dict[str, Any]] | int:
    """Refuses vLLM's fields (a 400), continues a trailing assistant message."""
    if "continue_final_message" in body:
        return 400
    return GOES_ON if final_open(body) else RESTARTS


def restarts_always(body: dict[str, Any]) -> list[dict[str, Any]] | int:
    return RESTARTS


@pytest.fixture
def ep() -> Iterator[Endpoint]:
    yield from serving(Endpoint([]))


async def continue_twice(
    ep: Endpoint, answer: Callable[[dict[str, Any]], Any], **kw: Any
) -> tuple[list[RequestSent], OpenAIEngine]:
    ep.answer = answer
    engine = OpenAIEngine(base_url=ep.url, api_key="none", model="m", **kw)
    marks: list[RequestSent] = []
    try:
        for _ in range(2):
            req = GenerationRequest(ASK, max_tokens=8, assistant_prefix="Lighthouses were")
            async for c in engine.stream(req):
                if isinstance(c, RequestSent):
                    marks.append(c)
                assert not isinstance(c, Delta) or c.text
    finally:
        await engine.aclose()
    return marks, engine


async def test_an_endpoint_that_takes_continue_final_message_gets_it(ep: Endpoint) -> None:
    marks, _ = await continue_twice(ep, vllm)
    assert [m.continuation for m in marks] == ["continue_final_message"] * 2
    probes = [b for b in ep.bodies if probed(b)]
    assert len(probes) == 1  # probed once, then kept
    sent = [b for b in ep.bodies if not probed(b)]
    assert all(b["continue_final_message"] and final_open(b) for b in sent)
    assert sent[0]["messages"][-1]["content"] == "Lighthouses were"


async def test_a_host_that_refuses_the_fields_continues_a_trailing_assistant_turn(
    ep: Endpoint,
) -> None:
    marks, _ = await continue_twice(ep, prefix_host)
    assert [m.continuation for m in marks] == ["trailing_assistant"] * 2
    sent = [b for b in ep.bodies if not probed(b)]
    assert all(final_open(b) and "continue_final_message" not in b for b in sent)


async def test_an_endpoint_that_restarts_gets_the_instruction(ep: Endpoint) -> None:
    marks, _ = await continue_twice(ep, restarts_always)
    assert [m.continuation for m in marks] == ["instruction"] * 2
    sent = [b for b in ep.bodies if not probed(b)]
    assert all(b["messages"][-1]["role"] == "user" for b in sent)  # the instruction turn


async def test_a_dialect_given_is_not_probed(ep: Endpoint) -> None:
    marks, _ = await continue_twice(ep, vllm, continuation="trailing_assistant")
    assert [m.continuation for m in marks] == ["trailing_assistant"] * 2
    assert not any(probed(b) for b in ep.bodies)


async def test_a_plain_request_is_not_a_continuation_and_probes_nothing(ep: Endpoint) -> None:
    ep.answer = vllm
    engine = OpenAIEngine(base_url=ep.url, api_key="none", model="m")
    marks = [c async for c in engine.stream(GenerationRequest(ASK, max_tokens=8))]
    await engine.aclose()
    sent = [m for m in marks if isinstance(m, RequestSent)]
    assert sent[0].continuation is None and len(ep.bodies) == 1


def test_the_trace_keeps_the_dialect() -> None:
    trace = Trace(continuation="trailing_assistant").frozen()
    assert Trace.from_dict(trace.to_dict()).continuation == "trailing_assistant"
