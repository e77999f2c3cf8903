"""Privacy and budget cover tools (issue 26): the scan reads the tool definitions, the arguments of
the tool calls in assistant messages and the tool results, each finding located; under
"keep-local" such a request never reaches the cloud; the budget's prompt bound (and the estimate)
counts the tool definitions and the calls' arguments, so a request with large tool schemas
reserves for them. `ScriptedEngine` doubles behind `HybridClient`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybridllm import Cap, GuardedEngine, HybridClient, ModelPrice, Policy, Prices, SQLiteLedger
from hybridllm.engines.base import GenerationRequest, estimate_prompt_tokens, prompt_token_bound
from hybridllm.guard.guarded import RequestContext, request_texts, request_token_bound
from hybridllm.guard.privacy import scan, tool_texts
from hybridllm.guard.privacy_ner import default_scanner
from hybridllm.testing import ScriptedCall, ScriptedEngine
from hybridllm.tools import ToolSpec, tool_spec
from tests.parts import skip_unless

pytestmark = pytest.mark.anyio

EMAIL = "bob.jones@corp-mail.org"
ADDRESS = "42 Baker Street"
CLOUD_FIRST = Policy(name="chat", routing={"prefer": "cloud"})


def weather(description: str = "The weather in a city.", unit_doc: str = "") -> dict[str, Any]:
    unit = {"type": "string", "enum": ["celsius", "fahrenheit"], "description": unit_doc}
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": unit},
            },
        },
    }


def loop(arguments: str, result: str) -> list[dict[str, Any]]:
    """A tool loop: the question, the assistant's call with `arguments`, the tool's `result`."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    return [
        {"role": "user", "content": "What is the weather where I live?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]


def spec(*tools: dict[str, Any]) -> ToolSpec:
    made = tool_spec(list(tools), None, None)
    assert made is not None
    return made


# ---- the scan covers tools ----------------------------------------------------------------


def test_an_email_in_a_tool_result_is_found_there() -> None:
    found = scan(loop('{"city": "Paris"}', json.dumps({"owner": EMAIL, "sky": "sunny"})))
    assert [(f.kind, f.location) for f in found] == [("email", "messages[2].content")]


def test_an_email_in_call_arguments_is_found_there() -> None:
    found = scan(loop(json.dumps({"city": "Paris", "notify": EMAIL}), "sunny"))
    where = "messages[1].tool_calls[0].function.arguments"
    assert [(f.kind, f.location) for f in found] == [("email", where)]


def test_an_address_in_call_arguments_is_found_by_the_ner_layer() -> None:
    scanner = default_scanner()
    skip_unless(scanner.deep, "the NER layer (hybridllm[privacy]) is not installed")
    found = scanner.scan(loop(json.dumps({"city": f"{ADDRESS}, London"}), "sunny"))
    where = "messages[1].tool_calls[0].function.arguments"
    assert ("address", where) in [(f.kind, f.location) for f in found]


def test_the_ner_layer_reads_the_tool_definitions_apart_and_locates_them() -> None:
    scanner = default_scanner()
    skip_unless(scanner.deep, "the NER layer (hybridllm[privacy]) is not installed")
    tools = spec(weather(f"Deliveries go to {ADDRESS}, London."))
    messages = loop('{"city": "Paris"}', "sunny")
    found = scanner.scan(messages, extra=tool_texts(tools))
    assert ("address", "tools[0].function.description") in [(f.kind, f.location) for f in found]
    assert not [f for f in found if f.location.startswith("messages")]


def test_every_string_of_the_tool_definitions_is_scanned_and_located() -> None:
    tools = spec(weather(f"Mail {EMAIL} on failure.", unit_doc=f"ask {EMAIL}"))
    texts = dict(tool_texts(tools))
    assert texts["tools[0].function.name"] == "get_weather"
    assert texts["tools[0].function.parameters.properties.unit.enum[1]"] == "fahrenheit"
    found = scan((), extra=tool_texts(tools))
    assert [f.location for f in found] == [
        "tools[0].function.description",
        "tools[0].function.parameters.properties.unit.description",
    ]


def test_the_guard_reads_the_tools_with_the_messages() -> None:
    tools = tool_spec([weather()], "auto", {"type": "json_object"})
    request = GenerationRequest(loop('{"city": "Paris"}', "sunny"), tools=tools)
    where = dict(request_texts(request))
    assert where["messages[1].tool_calls[0].function.arguments"] == '{"city": "Paris"}'
    assert where["messages[2].tool_call_id"] == "c1"
    assert where["tools[0].function.description"] == "The weather in a city."
    assert where["tool_choice"] == "auto" and where["response_format.type"] == "json_object"


# ---- keep-local keeps a tool loop with personal data local ------------------------------------


async def _ask(messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kw: Any) -> Any:
    local = ScriptedEngine("local", tokens=["local"])
    cloud = ScriptedEngine("cloud", tokens=["cloud"])
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST, **kw) as client:
        done = await client.complete(messages, tools=tools)
    return done, cloud


async def test_keep_local_keeps_a_tool_result_with_an_email_on_the_device() -> None:
    result = json.dumps({"owner": EMAIL})
    done, cloud = await _ask(loop('{"city": "Paris"}', result), [weather()], privacy="keep-local")
    assert done.text == "local" and done.trace.engine == "local"
    assert cloud.requests == []
    assert "privacy_local" in done.trace.reason_codes  # routing saw it


async def test_keep_local_keeps_call_arguments_with_an_email_on_the_device() -> None:
    args = json.dumps({"city": "Paris", "notify": EMAIL})
    done, cloud = await _ask(loop(args, "sunny"), [weather()], privacy="keep-local")
    assert done.text == "local" and cloud.requests == []
    assert "privacy_local" in done.trace.reason_codes  # routing saw it


async def test_keep_local_keeps_a_tool_definition_with_an_email_on_the_device() -> None:
    """Routing's scan and the guard's read the tool definitions: the request is served locally
    from the start."""
    tools = [weather(f"Mail {EMAIL} on failure.")]
    done, cloud = await _ask(loop('{"city": "Paris"}', "sunny"), tools, privacy="keep-local")
    assert done.text == "local" and cloud.requests == []
    # routing's scan reads the tool definitions as the guard's does: local from the start
    assert done.trace.fallback_cause is None and "privacy_local" in done.trace.reason_codes


async def test_a_clean_tool_loop_goes_to_the_cloud_whole() -> None:
    messages = loop('{"city": "Paris"}', "sunny")
    done, cloud = await _ask(messages, [weather()], privacy="keep-local")
    assert done.text == "cloud" and len(cloud.requests) == 1
    sent = cloud.requests[0]
    assert [dict(m) for m in sent.messages] == messages and sent.tools is not None


# ---- the budget counts tools -----------------------------------------------------------------


def test_the_bound_and_the_estimate_grow_with_the_tools_size() -> None:
    messages = [{"role": "user", "content": "hi"}]
    small, large = spec(weather()), spec(weather("word " * 2_000))
    bare = prompt_token_bound(messages)
    assert bare < prompt_token_bound(messages, small) < prompt_token_bound(messages, large)
    assert prompt_token_bound(messages, large) - prompt_token_bound(messages, small) >= 9_900
    est = estimate_prompt_tokens(messages)
    assert est < estimate_prompt_tokens(messages, small) < estimate_prompt_tokens(messages, large)


def test_the_bound_holds_the_tool_definitions_as_a_template_writes_them() -> None:
    """At least one token per byte of the definitions' JSON (`tojson`: non-ASCII escaped)."""
    tools = spec(weather("Météo à Zürich <ville>"))
    raw = json.dumps([dict(t.raw) for t in tools.tools])
    messages = [{"role": "user", "content": "hi"}]
    assert prompt_token_bound(messages, tools) - prompt_token_bound(messages) > len(raw)


def test_the_bound_counts_the_call_arguments_in_messages() -> None:
    short = loop('{"city": "Paris"}', "sunny")
    long = loop(json.dumps({"city": "Paris", "note": "x" * 3_000}), "sunny")
    assert prompt_token_bound(long) - prompt_token_bound(short) >= 3_000
    assert estimate_prompt_tokens(long) > estimate_prompt_tokens(short) + 500
    # Qwen2.5's template writes the arguments text through `tojson`: escaped once more
    accented = json.dumps({"city": "Zürich", "note": "é" * 100})
    written = len(json.dumps(accented))  # each "\u00e9" becomes "\\u00e9"
    empty = prompt_token_bound(loop("", "sunny"))
    assert prompt_token_bound(loop(accented, "sunny")) - empty >= written - 2


def test_the_reservation_holds_the_tools() -> None:
    messages = [{"role": "user", "content": "hi"}]
    large = spec(weather("word " * 2_000))
    bare = request_token_bound(GenerationRequest(messages))
    assert request_token_bound(GenerationRequest(messages, tools=large)) >= bare + 10_000


async def test_a_request_whose_tools_break_the_cap_is_kept_from_the_cloud() -> None:
    """A cap one request of small tools fits, but not one with large tool schemas: routing's
    budget check bounds the tools as the guard's reservation does, so the local engine answers
    from the start."""
    price = ModelPrice(input_per_million=1.0, output_per_million=1.0)
    budget: dict[str, Any] = {
        "prices": Prices(models={"scripted": price}),
        "budget_caps": [Cap(None, "request", 2_000 / 1e6)],  # about 2,000 tokens
    }
    question = [{"role": "user", "content": "Weather in Paris?"}]
    small, _ = await _ask(question, [weather()], **budget)
    large, cloud = await _ask(question, [weather("word " * 2_000)], **budget)
    assert small.text == "cloud"
    assert large.text == "local" and cloud.requests == []
    assert large.trace.fallback_cause is None and "budget_local" in large.trace.reason_codes


async def test_a_call_without_reported_usage_is_settled_with_its_tokens() -> None:
    """An endpoint that reports no usage: the settlement counts the call's tokens (estimated)
    beside the text deltas, so a long call is not settled as an empty answer."""
    args = json.dumps({"city": "Paris", "note": "word " * 200})
    cloud = ScriptedEngine("cloud", script=["Checking.", ScriptedCall("get_weather", args)])
    price = ModelPrice(input_per_million=1.0, output_per_million=1.0)
    guard = GuardedEngine(
        cloud, privacy="off", ledger=SQLiteLedger(), prices=Prices(models={"scripted": price})
    )
    settled: list[int] = []
    context = RequestContext(
        on_settle=lambda usage, cost, over: settled.append(usage.completion_tokens)
    )
    request = GenerationRequest([{"role": "user", "content": "hi"}], tools=spec(weather()))
    async for _ in guard.stream(request, context):
        pass
    assert len(settled) == 1 and settled[0] > 200  # 1 delta + the call's ~200+ tokens
