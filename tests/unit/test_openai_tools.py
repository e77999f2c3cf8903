"""`OpenAIEngine` with tools (issue 26, the cloud engine): the request carries `tools`,
`tool_choice` and `response_format` as given and a tool loop's messages whole; streamed
`delta.tool_calls` pieces come out as complete calls (`Called`), never partial; a malformed piece
is a `CloudProtocolError`. The endpoint is a loopback server that plays chunks in OpenAI's
documented streaming shapes and keeps every request body; `CallAssembler` is also driven piece
by piece, to see when each call is handed back."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

import pytest

from hybridllm import GenerationRequest, HybridClient, OpenAIEngine, ToolCall
from hybridllm.engines.call_deltas import CallAssembler
from hybridllm.errors import CloudProtocolError
from hybridllm.events import Called, CallOpened, Chunk, Delta, Finish
from hybridllm.tools import tool_spec
from tests.unit.sse_endpoint import Endpoint, chunk, serving

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIMER = {
    "type": "function",
    "function": {
        "name": "set_timer",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}},
    },
}
ASK = ({"role": "user", "content": "Weather in Paris and a 5 minute timer?"},)


def opens(index: int, call_id: str, name: str) -> dict[str, Any]:
    """The first piece of a call: its id and name, empty arguments (OpenAI's shape)."""
    function = {"name": name, "arguments": ""}
    return {"index": index, "id": call_id, "type": "function", "function": function}


def piece(index: int, arguments: str) -> dict[str, Any]:
    """A later piece of a call: a few characters of its arguments."""
    return {"index": index, "function": {"arguments": arguments}}


def pieces(index: int, arguments: str, size: int = 3) -> list[dict[str, Any]]:
    return [piece(index, arguments[i : i + size]) for i in range(0, len(arguments), size)]


def calls(*parts: dict[str, Any]) -> dict[str, Any]:
    """A chunk carrying tool-call pieces."""
    return chunk({"tool_calls": list(parts)})


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    yield from serving(Endpoint([]))


def request(messages: Sequence[dict[str, Any]] = ASK, **tools: Any) -> GenerationRequest:
    given = {"tools": [WEATHER, TIMER], "tool_choice": "auto", "response_format": None}
    spec = tool_spec(**{**given, **tools})
    return GenerationRequest(messages, max_tokens=64, tools=spec)


async def play(ep: Endpoint, req: GenerationRequest | None = None) -> list[Chunk]:
    """The chunks the engine yields for one request (its text, calls and finish)."""
    engine = OpenAIEngine(base_url=ep.url, api_key="none", model="m")
    out: list[Chunk] = []
    try:
        stream: AsyncGenerator[Chunk, None] = engine.stream(req or request())
        async for c in stream:
            if isinstance(c, Delta | Called | CallOpened | Finish):
                out.append(c)
    finally:
        await engine.aclose()
    return out


def called(chunks: Sequence[Chunk]) -> list[tuple[str, str, str]]:
    return [(c.id, c.name, c.arguments) for c in chunks if isinstance(c, Called)]


# ---- what is sent ----------------------------------------------------------------------------


async def test_tools_tool_choice_and_response_format_are_sent_as_given(endpoint: Endpoint) -> None:
    endpoint.chunks = [chunk({"content": "{}"}), chunk({}, "stop")]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    fmt = {"type": "json_object"}
    await play(endpoint, request(tool_choice=forced, response_format=fmt))
    body = endpoint.bodies[0]
    assert body["tools"] == [WEATHER, TIMER]
    assert body["tool_choice"] == forced and body["response_format"] == fmt


async def test_a_tool_loop_goes_out_whole(endpoint: Endpoint) -> None:
    """An assistant message's `tool_calls` and a tool message's `tool_call_id` are sent as
    given: nothing on the way (chat_messages, the engine's copy) drops a field."""
    endpoint.chunks = [chunk({"content": "Sunny."}), chunk({}, "stop")]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    loop: list[dict[str, Any]] = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
    ]
    chunks = await play(endpoint, request(loop))
    assert endpoint.bodies[0]["messages"] == loop
    assert [c.text for c in chunks if isinstance(c, Delta)] == ["Sunny."]


async def test_a_request_without_tools_sends_no_tool_fields(endpoint: Endpoint) -> None:
    endpoint.chunks = [chunk({"content": "hi"}), chunk({}, "stop")]
    await play(endpoint, GenerationRequest(ASK, max_tokens=8))
    assert not {"tools", "tool_choice", "response_format"} & set(endpoint.bodies[0])


# ---- assembly, through the engine ----------------------------------------------------------


async def test_arguments_split_across_many_deltas_make_one_call(endpoint: Endpoint) -> None:
    args = '{"city": "Paris", "unit": "celsius"}'
    opening = [opens(0, "c1", "get_weather")]
    first = chunk({"role": "assistant", "content": None, "tool_calls": opening})
    endpoint.chunks = [first, *(calls(p) for p in pieces(0, args, 2)), chunk({}, "tool_calls")]
    out = await play(endpoint)
    assert called(out) == [("c1", "get_weather", args)]
    finish = out[-1]
    assert isinstance(finish, Finish) and finish.reason == "tool_calls"


async def test_two_parallel_calls_come_whole_in_index_order(endpoint: Endpoint) -> None:
    a, b = '{"city": "Paris"}', '{"minutes": 5}'
    endpoint.chunks = [
        calls(opens(0, "c1", "get_weather")),
        *(calls(p) for p in pieces(0, a)),
        calls(opens(1, "c2", "set_timer")),
        *(calls(p) for p in pieces(1, b)),
        chunk({}, "tool_calls"),
    ]
    out = await play(endpoint)
    assert called(out) == [("c1", "get_weather", a), ("c2", "set_timer", b)]
    # each call said as its first piece names it, before its arguments come
    said = [(type(c).__name__, getattr(c, "call_name", getattr(c, "name", None))) for c in out]
    assert said[:3] == [("CallOpened", "get_weather"), ("CallOpened", "set_timer"),
                        ("Called", "get_weather")]  # fmt: skip


async def test_two_calls_interleaved_by_index(endpoint: Endpoint) -> None:
    """A server that sends the pieces of two calls alternately: each call still comes whole."""
    a, b = '{"city": "Paris"}', '{"minutes": 5}'
    mixed = [p for pair in zip(pieces(0, a, 4), pieces(1, b, 4), strict=False) for p in pair]
    mixed += pieces(0, a, 4)[len(pieces(1, b, 4)) :]
    endpoint.chunks = [
        calls(opens(0, "c1", "get_weather"), opens(1, "c2", "set_timer")),
        *(calls(p) for p in mixed),
        chunk({}, "tool_calls"),
    ]
    assert called(await play(endpoint)) == [("c1", "get_weather", a), ("c2", "set_timer", b)]


async def test_text_before_a_call_streams_as_text(endpoint: Endpoint) -> None:
    endpoint.chunks = [
        chunk({"role": "assistant", "content": "Let me "}),
        chunk({"content": "check."}),
        calls(opens(0, "c1", "get_weather")),
        *(calls(p) for p in pieces(0, '{"city": "Oslo"}')),
        chunk({}, "tool_calls"),
    ]
    out = await play(endpoint)
    kinds = [type(c).__name__ for c in out]
    assert kinds == ["Delta", "Delta", "CallOpened", "Called", "Finish"]
    assert "".join(c.text for c in out if isinstance(c, Delta)) == "Let me check."


async def test_a_forced_call_that_finishes_with_stop_finishes_as_tool_calls(
    endpoint: Endpoint,
) -> None:
    """OpenAI ends an answer whose tool `tool_choice` named with "stop": the answer called."""
    endpoint.chunks = [
        calls(opens(0, "c1", "set_timer")),
        calls(piece(0, '{"minutes": 2}')),
        chunk({}, "stop"),
    ]
    out = await play(endpoint)
    assert called(out) == [("c1", "set_timer", '{"minutes": 2}')]
    assert isinstance(out[-1], Finish) and out[-1].reason == "tool_calls"


async def test_a_call_with_no_arguments_has_an_empty_object(endpoint: Endpoint) -> None:
    endpoint.chunks = [calls(opens(0, "c1", "set_timer")), chunk({}, "tool_calls")]
    assert called(await play(endpoint)) == [("c1", "set_timer", "{}")]


async def test_through_the_client_the_app_gets_checked_tool_calls(endpoint: Endpoint) -> None:
    args = '{"city": "Paris"}'
    endpoint.chunks = [
        calls(opens(0, "c1", "get_weather")),
        *(calls(p) for p in pieces(0, args)),
        chunk({}, "tool_calls"),
    ]
    cloud = OpenAIEngine(base_url=endpoint.url, api_key="none", model="m")
    async with HybridClient(cloud=cloud, router=None) as client:
        done = await client.complete(list(ASK), tools=[WEATHER, TIMER])
    assert done.finish_reason == "tool_calls" and done.text == ""
    assert [(c.id, c.name, c.arguments, c.engine) for c in done.tool_calls] == [
        ("c1", "get_weather", args, "cloud")
    ]
    assert isinstance(done.tool_calls[0], ToolCall) and done.tool_calls[0].parsed() == {
        "city": "Paris"
    }


# ---- malformed pieces ----------------------------------------------------------------------


async def test_arguments_that_never_close_are_a_protocol_error(endpoint: Endpoint) -> None:
    """An answer cut by its token limit inside a call: the partial call is never delivered."""
    endpoint.chunks = [
        chunk({"content": "Checking."}),
        calls(opens(0, "c1", "get_weather")),
        calls(piece(0, '{"city": "Par')),
        chunk({}, "length"),
    ]
    with pytest.raises(CloudProtocolError, match="never closed") as info:
        await play(endpoint)
    assert info.value.received_content


async def test_a_call_without_an_id_is_a_protocol_error(endpoint: Endpoint) -> None:
    endpoint.chunks = [
        calls({"index": 0, "type": "function", "function": {"name": "set_timer"}}),
        calls(piece(0, "{}")),
        chunk({}, "tool_calls"),
    ]
    with pytest.raises(CloudProtocolError, match="without an id"):
        await play(endpoint)


async def test_a_call_without_a_name_is_a_protocol_error(endpoint: Endpoint) -> None:
    endpoint.chunks = [
        calls({"index": 0, "id": "c1", "function": {"arguments": "{}"}}),
        chunk({}, "tool_calls"),
    ]
    with pytest.raises(CloudProtocolError, match="without a function name"):
        await play(endpoint)


async def test_a_piece_without_an_index_is_a_protocol_error(endpoint: Endpoint) -> None:
    endpoint.chunks = [calls({"id": "c1", "function": {"name": "set_timer"}})]
    with pytest.raises(CloudProtocolError, match="index"):
        await play(endpoint)


async def test_a_call_begun_after_the_finish_reason_is_a_protocol_error(endpoint: Endpoint) -> None:
    endpoint.chunks = [chunk({"content": "Hi."}, "stop"), calls(opens(0, "c1", "set_timer"))]
    with pytest.raises(CloudProtocolError, match="after the finish reason"):
        await play(endpoint)


# ---- the assembler, piece by piece -----------------------------------------------------------


def test_a_call_is_handed_back_once_a_later_index_starts_and_not_before() -> None:
    calls = CallAssembler()
    assert calls.add(opens(0, "c1", "get_weather")) == []
    assert calls.add(piece(0, '{"city": ')) == []
    assert calls.add(piece(0, '"Paris"}')) == []  # whole, but a later piece could still come
    first = calls.add(opens(1, "c2", "set_timer"))
    assert [(c.id, c.arguments) for c in first] == [("c1", '{"city": "Paris"}')]
    assert calls.add(piece(1, '{"minutes": 5}')) == []
    assert [(c.id, c.arguments) for c in calls.finish("tool_calls")] == [("c2", '{"minutes": 5}')]


def test_an_open_call_waits_while_a_later_one_interleaves() -> None:
    calls = CallAssembler()
    calls.add(opens(0, "c1", "get_weather"))
    calls.add(piece(0, '{"city": "Pa'))
    assert calls.add(opens(1, "c2", "set_timer")) == []  # call 0 is not closed yet
    assert calls.add(piece(1, '{"minutes": 5}')) == []  # call 1 waits for call 0
    done = calls.add(piece(0, 'ris"}'))
    assert [c.id for c in done] == ["c1"]  # call 1 is handed back at the finish (last index)
    assert [c.id for c in calls.finish()] == ["c2"]


def test_a_piece_for_a_call_already_handed_back_is_a_protocol_error() -> None:
    calls = CallAssembler()
    calls.add(opens(0, "c1", "set_timer"))
    calls.add(piece(0, "{}"))
    assert len(calls.add(opens(1, "c2", "set_timer"))) == 1
    with pytest.raises(CloudProtocolError, match="after that call was complete"):
        calls.add(piece(0, " "))


def test_a_repeated_id_is_accepted_and_a_changed_one_is_not() -> None:
    calls = CallAssembler()
    calls.add(opens(0, "c1", "set_timer"))
    calls.add({"index": 0, "id": "c1", "function": {"arguments": "{}"}})  # repeated: fine
    with pytest.raises(CloudProtocolError, match="changed its id"):
        calls.add({"index": 0, "id": "c9", "function": {"arguments": ""}})


def test_a_missing_index_in_between_is_a_protocol_error() -> None:
    calls = CallAssembler()
    calls.add(opens(1, "c2", "set_timer"))
    with pytest.raises(CloudProtocolError, match="call 0 never came"):
        calls.finish("tool_calls")


def test_arguments_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(TypeError, match="arguments"):
        CallAssembler().add({"index": 0, "id": "c", "function": {"arguments": {"a": 1}}})
