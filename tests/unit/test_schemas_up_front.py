"""Bad schemas are refused before anything is sent (issue 42, item 4): a schema the local
grammar converter cannot take is an `InvalidArgumentError` at the call wherever the local engine
may serve (before, the cloud was tried first and the request ended `AllEnginesFailedError`); an
unknown schema keyword is logged at WARNING, or refused under `strict: true`; a tool call whose
arguments are not an object is refused whatever the schema's "type"; `response_format` "text"
and `tool_choice` "none" are sent as given; `n` other than 1 is refused.

The local engine here is a real `LlamaCppEngine` whose model is never loaded (its start is a
no-op: the check converts the schema with llama.cpp's own converter and needs no model); the
cloud is a scripted engine (it records what it was sent) or, for the wire, a loopback endpoint
in OpenAI's streaming shapes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from hybridllm import GenerationRequest, HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.engines.options import OpenAIOptions
from hybridllm.errors import InvalidArgumentError, InvalidOutputError
from hybridllm.testing import ScriptedEngine
from hybridllm.tools import check_call, tool_spec
from hybridllm.tools.keywords import unknown_keywords
from tests.unit.sse_endpoint import Endpoint, chunk, serving

pytestmark = pytest.mark.anyio

NOT_STRING = {
    "type": "json_schema",
    "json_schema": {
        "name": "thing",
        "schema": {"type": "object", "properties": {"id": {"not": {"type": "string"}}}},
    },
}
CLOUD_FIRST = Policy(name="q", routing={"prefer": "cloud", "ttft_deadline_ms": 500})
ASK = [{"role": "user", "content": "Give me a thing."}]


class _Unloaded(LlamaCppEngine):
    """The real engine's schema check (`check_constraints`, llama.cpp's own converter, which
    needs no model), its model never loaded: these requests never run on it."""

    async def start(self) -> None:
        return None


def local() -> LlamaCppEngine:
    return _Unloaded("qwen2.5-coder-0.5b-instruct", warm_up=False)


def tool(parameters: dict[str, Any], *, strict: bool | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": "f", "parameters": parameters}
    if strict is not None:
        fn["strict"] = strict
    return {"type": "function", "function": fn}


# ---- a schema the local grammar cannot take -------------------------------------------------


async def test_a_schema_the_local_grammar_cannot_take_is_refused_before_the_cloud_is_sent() -> None:
    cloud = ScriptedEngine("cloud", tokens=['{"id": 5}'])
    async with HybridClient(local=local(), cloud=cloud, policy=CLOUD_FIRST) as client:
        with pytest.raises(InvalidArgumentError) as caught:
            client.stream(ASK, response_format=NOT_STRING)
        with pytest.raises(InvalidArgumentError):
            client.decide(ASK, response_format=NOT_STRING)
    assert caught.value.argument == "response_format.json_schema.schema"
    assert cloud.requests == []


async def test_a_tool_schema_the_local_grammar_cannot_take_is_refused_on_tools() -> None:
    bad = tool({"type": "object", "properties": {"x": {"not": {"type": "integer"}}}})
    cloud = ScriptedEngine("cloud", tokens=["hello"])
    async with HybridClient(local=local(), cloud=cloud, policy=CLOUD_FIRST) as client:
        with pytest.raises(InvalidArgumentError) as caught:
            client.stream(ASK, tools=[bad])
    assert caught.value.argument == "tools"
    assert cloud.requests == []


async def test_a_request_forced_to_the_cloud_keeps_a_schema_only_the_cloud_can_take() -> None:
    cloud = ScriptedEngine("cloud", tokens=['{"id": 5}'])
    async with HybridClient(local=local(), cloud=cloud, policy=CLOUD_FIRST) as client:
        done = await client.complete(ASK, response_format=NOT_STRING, engine="cloud")
    assert done.parsed == {"id": 5} and len(cloud.requests) == 1


# ---- unknown keywords ------------------------------------------------------------------------

TYPO = {"type": "object", "properties": {"a": {"type": "string"}}, "requried": ["a"]}


def test_unknown_keywords_are_found_in_subschemas_never_in_property_names() -> None:
    schema = {
        "type": "object",
        "properties": {
            "requried": {"type": "string", "maxLenght": 3},  # a property may have any name
            "list": {"type": "array", "items": {"type": "integer", "minimun": 0}},
        },
        "anyOf": [{"required": ["list"]}, {"x-note": "the author's own"}],
        "requried": ["list"],
    }
    found = {(u.path, u.closest) for u in unknown_keywords(schema)}
    assert found == {
        ("requried", "required"),
        ("properties.requried.maxLenght", "maxLength"),
        ("properties.list.items.minimun", "minimum"),
    }


def test_an_unknown_keyword_is_logged_once_per_schema(caplog: pytest.LogCaptureFixture) -> None:
    schema = {**TYPO, "title": "once"}  # a schema no other test has checked
    with caplog.at_level(logging.WARNING, logger="hybridllm.tools"):
        spec = tool_spec([tool(schema)], None, None)
        tool_spec([tool(schema)], None, None)
    assert spec is not None  # accepted: not strict
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "requried" in warned[0].args  # type: ignore[operator]


def test_under_strict_an_unknown_keyword_is_refused_with_its_place() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        tool_spec([tool(TYPO, strict=True)], None, None)
    assert caught.value.argument == "tools[0].function.parameters.requried"
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TYPO, "strict": True}}
    with pytest.raises(InvalidArgumentError) as fmt_caught:
        tool_spec(None, None, fmt)
    assert fmt_caught.value.argument == "response_format.json_schema.schema.requried"


# ---- arguments that are not an object -------------------------------------------------------


@pytest.mark.parametrize("arguments", ["[1, 2]", "5", "null", '"x"'])
def test_call_arguments_that_are_not_an_object_are_refused_without_a_type(arguments: str) -> None:
    spec = tool_spec([tool({"properties": {"a": {"type": "integer"}}})], "auto", None)
    assert spec is not None
    with pytest.raises(InvalidOutputError) as caught:
        check_call(spec, "f", arguments, engine="cloud")
    assert caught.value.engine == "cloud"
    assert check_call(spec, "f", '{"a": 1}', engine="cloud") == {"a": 1}


# ---- sent as given ---------------------------------------------------------------------------


@pytest.fixture
def sse() -> Iterator[Endpoint]:
    yield from serving(Endpoint([]))


async def sent(ep: Endpoint, **given: Any) -> dict[str, Any]:
    ep.chunks = [chunk({"content": "hi"}), chunk({}, "stop")]
    engine = OpenAIEngine(base_url=ep.url, api_key="none", model="m")
    spec = tool_spec(given.get("tools"), given.get("tool_choice"), given.get("response_format"))
    try:
        async for _ in engine.stream(GenerationRequest(tuple(ASK), max_tokens=8, tools=spec)):
            pass
    finally:
        await engine.aclose()
    return ep.bodies[-1]


async def test_response_format_text_is_sent_as_given(sse: Endpoint) -> None:
    body = await sent(sse, response_format={"type": "text"})
    assert body["response_format"] == {"type": "text"}


async def test_tool_choice_none_is_sent_as_given_with_its_tools(sse: Endpoint) -> None:
    timer = tool({"type": "object", "properties": {"m": {"type": "integer"}}})
    body = await sent(sse, tools=[timer], tool_choice="none")
    assert body["tool_choice"] == "none" and body["tools"] == [timer]
    alone = await sent(sse, tool_choice="none")
    assert alone["tool_choice"] == "none" and "tools" not in alone


# ---- n > 1 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 0, True, "2"])
def test_more_than_one_choice_is_refused(n: object) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        OpenAIOptions(extra_body={"n": n})
    assert caught.value.argument == "extra_body.n"
    assert OpenAIOptions(extra_body={"n": 1, "top_k": 4}).fields()["extra_body"] == {
        "n": 1,
        "top_k": 4,
    }
