"""Tools and structured output (issue 26): the arguments checked at the edge (`hybridllm.tools`),
what an engine produced checked before it is delivered (`runtime.checked`), the plans a whole
answer allows (`routing.decide`), and the `ToolCall` events and `Completion` fields. Scripted
engines on the virtual clock (orchestration only); the real engines: tests/integration."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybridllm import Done, Fallback, HybridClient, PartialJSON, Policy, Retract, Token, ToolCall
from hybridllm.errors import (
    AllEnginesFailedError,
    InvalidArgumentError,
    InvalidOutputError,
    UnsureCallError,
)
from hybridllm.events import DeadlineMissed
from hybridllm.routing.decide import decide
from hybridllm.routing.decision import LiveState, RequestFacts
from hybridllm.runtime.checked import snapshot
from hybridllm.testing import ScriptedCall, ScriptedEngine
from hybridllm.tools import check_answer, check_call, tool_spec

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

TIMER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "set_timer",
        "description": "Start a kitchen timer.",
        "parameters": {
            "type": "object",
            "properties": {
                "minutes": {"type": "integer", "minimum": 1},
                "label": {"type": "string", "enum": ["tea", "pasta"]},
            },
            "required": ["minutes"],
            "additionalProperties": False,
        },
    },
}
WEATHER: dict[str, Any] = {"type": "function", "function": {"name": "weather"}}
PERSON = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    },
}
CLOUD_FIRST = Policy(name="q", routing={"prefer": "cloud", "ttft_deadline_ms": 500})
LOCAL_FIRST = Policy(name="l", routing={"prefer": "local", "ttft_deadline_ms": 500})


# ---- the arguments -------------------------------------------------------------------------------


def test_no_tool_argument_is_no_spec_and_the_wire_is_what_was_given() -> None:
    assert tool_spec(None, None, None) is None
    spec = tool_spec([TIMER, WEATHER], "auto", {"type": "json_object"})
    assert spec is not None and [t.name for t in spec.tools] == ["set_timer", "weather"]
    assert spec.wire() == {
        "tools": [TIMER, WEATHER],
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
    }
    assert spec.tool("weather") is not None and spec.tool("weather").parameters["type"] == "object"  # type: ignore[union-attr]


def test_a_named_tool_choice_forces_that_tool_alone() -> None:
    spec = tool_spec([TIMER, WEATHER], {"type": "function", "function": {"name": "weather"}}, None)
    assert spec is not None and spec.must_call and spec.forced == "weather"
    assert [t.name for t in spec.callable_tools] == ["weather"]
    none = tool_spec([TIMER], "none", None)
    assert none is not None and not none.may_call and none.callable_tools == ()


BAD = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [TIMER, TIMER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function",
                 "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters.type"),
    ({"tools": [{"type": "function", "function": {"name": "f",
                                                  "parameters": {"type": "object",
                                                                 "required": "x"}}}]},
     "tools[0].function.parameters['required']"),
    ({"tools": [TIMER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [TIMER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": 3}}},
     "response_format.json_schema.schema"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "argument"), BAD)
async def test_a_bad_tool_argument_is_refused_by_name_and_nothing_is_sent(
    args: dict[str, Any], argument: str
) -> None:
    local, cloud = ScriptedEngine("local", tokens=["x"]), ScriptedEngine("cloud", tokens=["y"])
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        with pytest.raises(InvalidArgumentError) as info:
            client.stream("set a timer", **args)
    assert info.value.argument == argument
    assert not local.requests and not cloud.requests


# ---- what an engine produced ---------------------------------------------------------------------


def test_a_call_must_name_a_callable_tool_with_arguments_of_its_schema() -> None:
    spec = tool_spec([TIMER], None, None)
    assert spec is not None
    assert check_call(spec, "set_timer", '{"minutes": 5, "label": "tea"}', engine="local") == {
        "minutes": 5,
        "label": "tea",
    }
    for name, arguments, says in [
        ("set_alarm", "{}", "not a tool it may call"),
        ("set_timer", '{"minutes": 5', "not JSON"),
        ("set_timer", '{"minutes": "5"}', "at minutes"),
        ("set_timer", '{"minutes": 5, "label": "soup"}', "at label"),
        ("set_timer", "{}", "'minutes' is a required property"),
        ("set_timer", '{"minutes": 5, "x": 1}', "Additional properties"),
    ]:
        with pytest.raises(InvalidOutputError) as info:
            check_call(spec, name, arguments, engine="cloud")
        assert info.value.what == "tool_call" and info.value.engine == "cloud"
        assert says in info.value.problem and arguments in info.value.produced


def test_a_json_answer_must_parse_and_match_the_format() -> None:
    spec = tool_spec(None, None, PERSON)
    assert spec is not None
    assert check_answer(spec, '{"name": "Ada", "age": 36}', engine="local")["age"] == 36
    for text in ('{"name": "Ada"}', "Ada, 36", '{"name": "Ada", "age": "36"}'):
        with pytest.raises(InvalidOutputError) as info:
            check_answer(spec, text, engine="local")
        assert info.value.what == "json" and info.value.produced == text
    loose = tool_spec(None, None, {"type": "json_object"})
    assert loose is not None and check_answer(loose, '{"a": [1]}', engine="local") == {"a": [1]}
    with pytest.raises(InvalidOutputError):
        check_answer(loose, "[1, 2]", engine="local")  # json_object: an object


# ---- through the client --------------------------------------------------------------------------


async def test_a_valid_call_reaches_the_app_whole_with_the_text_before_it() -> None:
    local = ScriptedEngine(
        "local", script=[0.05, "Setting it. ", 0.01, ScriptedCall("set_timer", '{"minutes": 5}')]
    )
    async with HybridClient(local=local, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("tea timer, 5 min", tools=[TIMER]) as s:
            events = [e async for e in s.events()]
        done = await client.complete("tea timer, 5 min", tools=[TIMER])
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.parsed(), c.engine) for c in calls] == [
        ("set_timer", {"minutes": 5}, "local")
    ]
    assert [type(e).__name__ for e in events].index("ToolCall") > [
        type(e).__name__ for e in events
    ].index("Token")
    assert s.trace.finish_reason == "tool_calls"
    assert done.text == "Setting it. " and done.finish_reason == "tool_calls"
    assert [c.message() for c in done.tool_calls] == [
        {"id": "call_1", "type": "function",
         "function": {"name": "set_timer", "arguments": '{"minutes": 5}'}}
    ]  # fmt: skip
    assert local.requests[0].tools is not None and local.requests[0].tools.may_call


async def test_an_invalid_local_call_is_never_delivered_and_the_cloud_answers() -> None:
    local = ScriptedEngine("local", script=[0.05, ScriptedCall("set_timer", '{"minutes": "five"}')])
    cloud = ScriptedEngine("cloud", script=[0.2, ScriptedCall("set_timer", '{"minutes": 5}')])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("tea timer", tools=[TIMER]) as s:
            events = [e async for e in s.events()]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.engine, c.parsed()) for c in calls] == [("cloud", {"minutes": 5})]
    assert any(isinstance(e, Fallback) and e.to_engine == "cloud" for e in events)
    assert s.trace.engine == "cloud"


async def _alone_failing(script: list[Any], prompt: str) -> InvalidOutputError:
    """The `InvalidOutputError` a local engine alone (no engine left) ends `script` on."""
    local = ScriptedEngine("local", script=script)
    async with HybridClient(local=local, router=None, policy=LOCAL_FIRST) as client:
        with pytest.raises((InvalidOutputError, AllEnginesFailedError)) as info:
            await client.complete(prompt, tools=[TIMER])
    error = info.value
    if isinstance(error, AllEnginesFailedError):
        error = error.attempts[-1][1]  # type: ignore[assignment]
    assert isinstance(error, InvalidOutputError)
    return error


async def test_an_invalid_call_with_no_engine_left_raises_what_was_produced() -> None:
    error = await _alone_failing([0.05, ScriptedCall("set_alarm", "{}")], "wake me")
    assert error.produced == "set_alarm({})"


async def test_a_required_call_that_never_comes_escalates() -> None:
    local = ScriptedEngine("local", script=[0.05, "I cannot set timers."])
    cloud = ScriptedEngine("cloud", script=[0.2, ScriptedCall("set_timer", '{"minutes": 3}')])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        done = await client.complete("timer 3", tools=[TIMER], tool_choice="required")
    assert done.text == "" and [c.engine for c in done.tool_calls] == ["cloud"]


async def test_a_json_answer_is_held_whole_checked_and_parsed() -> None:
    local = ScriptedEngine("local", script=[0.05, '{"name": ', 0.01, '"Ada", "age": 36}'])
    async with HybridClient(local=local, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("who?", response_format=PERSON) as s:
            tokens = [e async for e in s.events() if isinstance(e, Token)]
        done = await client.complete("who?", response_format=PERSON)
    assert [t.text for t in tokens] == ['{"name": "Ada", "age": 36}']  # one piece, at the end
    assert tokens[0].t - s.trace.t_start == pytest.approx(0.06)
    assert done.parsed == {"name": "Ada", "age": 36} and done.finish_reason == "stop"


async def test_an_invalid_json_answer_escalates_before_any_text_is_shown() -> None:
    local = ScriptedEngine("local", script=[0.05, '{"name": "Ada"}'])
    cloud = ScriptedEngine("cloud", script=[0.3, '{"name": "Ada", "age": 36}'])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("who?", response_format=PERSON) as s:
            tokens = [e async for e in s.events() if isinstance(e, Token)]
    assert [(t.engine, json.loads(t.text)["age"]) for t in tokens] == [("cloud", 36)]


async def test_a_json_answer_streams_partial_snapshots_and_done_carries_the_object() -> None:
    """Each piece that grows the object is a `PartialJSON` as it comes (the last string cut
    where the text is); the answer itself is still one checked `Token` at the end, and `Done`
    carries the object."""
    script = [0.05, '{"name": ', 0.01, '"Ad', 0.01, 'a", ', 0.01, '"age": 36}']
    local = ScriptedEngine("local", script=script)
    async with HybridClient(local=local, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("who?", response_format=PERSON) as s:
            events = [e async for e in s.events()]
    partials = [e for e in events if isinstance(e, PartialJSON)]
    assert [p.value for p in partials] == [
        {},
        {"name": "Ad"},
        {"name": "Ada"},
        {"name": "Ada", "age": 36},
    ]
    assert [round(p.t - s.trace.t_start, 3) for p in partials] == [0.05, 0.06, 0.07, 0.08]
    assert {p.engine for p in partials} == {"local"}
    assert s.trace.marks["partial_json"] - s.trace.t_start == pytest.approx(0.05)
    tokens = [e for e in events if isinstance(e, Token)]
    assert [t.text for t in tokens] == ['{"name": "Ada", "age": 36}']
    assert events.index(tokens[0]) > events.index(partials[-1])
    done = events[-1]
    assert isinstance(done, Done) and done.parsed == {"name": "Ada", "age": 36}
    assert not any(isinstance(e, Retract) for e in events)


async def test_snapshots_of_an_answer_that_fails_its_check_are_retracted_before_the_next() -> None:
    """The local answer lacks the required "age": its snapshots were shown, so a `Retract`
    with their text takes them back before the cloud's snapshots and answer."""
    local = ScriptedEngine("local", script=[0.05, '{"name": ', 0.01, '"Ada"}'])
    cloud = ScriptedEngine("cloud", script=[0.3, '{"name": "Bo", ', 0.01, '"age": 7}'])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("who?", response_format=PERSON) as s:
            events = [e for e in [e async for e in s.events()] if isinstance(e, SHOWN)]
    kinds = [(type(e).__name__, getattr(e, "engine", None)) for e in events]
    assert kinds == [
        ("PartialJSON", "local"),
        ("PartialJSON", "local"),
        ("Retract", None),
        ("PartialJSON", "cloud"),
        ("PartialJSON", "cloud"),
        ("Token", "cloud"),
    ]
    retract = events[2]
    assert isinstance(retract, Retract) and retract.text == '{"name": "Ada"}'
    assert [e.value for e in events if isinstance(e, PartialJSON)][-1] == {"name": "Bo", "age": 7}


SHOWN = (PartialJSON, Retract, Token)


def test_snapshot_reads_the_start_of_an_object_only() -> None:
    assert snapshot('```json\n{"a": [1, 2') == {"a": [1, 2]}
    assert snapshot('{"a": "he') == {"a": "he"}
    assert snapshot("Sure, here it is") is None
    assert snapshot('"just a string"') is None
    assert snapshot("```") is None


async def test_a_tool_call_counts_as_the_first_token_for_the_deadline() -> None:
    """The call at 0.3 s beats the local text at 0.8 s: a quality decision's cloud call wins
    inside the 500 ms deadline, and the local rescue's text is never shown."""
    local = ScriptedEngine("local", script=[0.8, "Sure"])
    cloud = ScriptedEngine("cloud", script=[0.3, ScriptedCall("set_timer", '{"minutes": 1}')])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        async with client.stream("timer", tools=[TIMER]) as s:
            events = [e async for e in s.events()]
    assert not any(isinstance(e, Token) for e in events)
    assert [e.engine for e in events if isinstance(e, ToolCall)] == ["cloud"]
    assert s.trace.ttft_ms == pytest.approx(300.0) and s.trace.deadline_missed_ms is None


async def _called(
    local: ScriptedEngine, cloud: ScriptedEngine, policy: Policy, prompt: str
) -> tuple[list[Any], Any]:
    """The events and trace of one streamed request offering the timer tool."""
    async with HybridClient(local=local, cloud=cloud, router=None, policy=policy) as client:
        async with client.stream(prompt, tools=[TIMER]) as s:
            events = [e async for e in s.events()]
    return events, s.trace


async def test_a_call_named_inside_the_deadline_has_started_the_answer() -> None:
    """Local first, a 500 ms deadline, the cloud's call ready at 0.1 s once started. The
    local call is named at 0.3 s and comes whole at 1.3 s: its name inside the deadline starts
    the answer (the cloud is never started, no deadline is missed), the call stays atomic."""
    named = ScriptedCall("set_timer", '{"minutes": 1}', arguments_s=1.0)
    local = ScriptedEngine("local", script=[0.3, named])
    cloud = ScriptedEngine("cloud", script=[0.1, ScriptedCall("set_timer", '{"minutes": 2}')])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("timer", tools=[TIMER]) as s:
            events = [e async for e in s.events()]
        trace = s.trace
        predicted = client.routing.latency.predict("local", 10, 1).ttft_s
    assert [(e.engine, e.parsed()) for e in events if isinstance(e, ToolCall)] == [
        ("local", {"minutes": 1})
    ]
    assert not cloud.requests and not any(isinstance(e, DeadlineMissed) for e in events)
    assert trace.marks["call_opened"] - trace.t_start == pytest.approx(0.3)
    assert trace.ttft_ms == pytest.approx(1300.0) and trace.deadline_missed_ms is None
    assert predicted < 0.5  # learnt from the call's opening, not its end: no parallel start next


async def test_a_call_not_named_by_the_deadline_is_rescued_by_the_cloud() -> None:
    """The same local call, named at 0.7 s: past the deadline the cloud starts, and its call
    (at 0.6 s + 0.1 s) comes before the local one is even named."""
    named = ScriptedCall("set_timer", '{"minutes": 1}', arguments_s=1.0)
    local = ScriptedEngine("local", script=[0.7, named])
    cloud = ScriptedEngine("cloud", script=[0.1, ScriptedCall("set_timer", '{"minutes": 2}')])
    events, trace = await _called(local, cloud, LOCAL_FIRST, "timer")
    assert [(e.engine, e.parsed()) for e in events if isinstance(e, ToolCall)] == [
        ("cloud", {"minutes": 2})
    ]
    assert "call_opened" not in trace.marks and trace.engine == "cloud"


# ---- the plans a whole answer allows -------------------------------------------------------------


@pytest.mark.parametrize("plan", ["handoff", "cascade", "speculative"])
@pytest.mark.parametrize("atomic", ["tools", "json"])
def test_no_plan_splits_or_verifies_a_whole_answer(plan: str, atomic: str) -> None:
    policy = Policy(name="p", plans=["single", "hedge", plan], routing={"ttft_deadline_ms": 400})
    state = LiveState(
        speculation=(True, "pays"), reads_signals=frozenset({"local"}), has_router=True
    )
    facts = RequestFacts(prompt_tokens=20, max_tokens=64, plan=plan, atomic=atomic)  # type: ignore[arg-type]
    decision = decide(facts, policy, state)
    assert decision.plan in ("single", "hedge")
    assert "whole_answer" in decision.codes
    plain = decide(RequestFacts(prompt_tokens=20, max_tokens=64, plan=plan), policy, state)  # type: ignore[arg-type]
    assert plain.plan == plan  # the same request in plain text runs the plan


async def test_the_preview_shows_what_a_whole_answer_allows() -> None:
    local, cloud = ScriptedEngine("local", tokens=["x"]), ScriptedEngine("cloud", tokens=["y"])
    policy = Policy(name="h", plans=["single", "handoff"], routing={"prefer": "local"})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=policy) as client:
        plain = client.decide("write a story", plan="handoff")
        tooled = client.decide("write a story", plan="handoff", tools=[TIMER])
        formatted = client.decide("who?", plan="handoff", response_format=PERSON)
    assert plain.decision.plan == "handoff" and plain.facts.atomic is None
    assert tooled.decision.plan == "single" and tooled.facts.atomic == "tools"
    assert formatted.decision.plan == "single" and formatted.facts.atomic == "json"
    assert not local.requests and not cloud.requests


def test_the_blocking_form_takes_tools_too() -> None:
    local = ScriptedEngine("local", script=[0.01, ScriptedCall("set_timer", '{"minutes": 2}')])
    with HybridClient(local=local, router=None, policy=LOCAL_FIRST) as client:
        done = client.complete_sync("timer 2", tools=[TIMER], tool_choice="required")
    assert [(c.name, c.parsed()) for c in done.tool_calls] == [("set_timer", {"minutes": 2})]


# ---- the local model's confidence decides whether its call stands ------------------------------

SURE = Policy(name="s", routing={"prefer": "local"}, tools={"min_call_confidence": 0.6})


@pytest.mark.parametrize(
    ("confidence", "served"), [(0.9, "local"), (0.4, "cloud"), (None, "local")]
)
async def test_an_unsure_local_call_goes_to_the_cloud(
    confidence: float | None, served: str
) -> None:
    call = ScriptedCall("set_timer", '{"minutes": 4}', confidence=confidence)
    local = ScriptedEngine("local", script=[0.05, call])
    cloud = ScriptedEngine("cloud", script=[0.2, ScriptedCall("set_timer", '{"minutes": 5}')])
    events, trace = await _called(local, cloud, SURE, "timer")
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [c.engine for c in calls] == [served] and len(calls) == 1
    assert calls[0].confidence == (confidence if served == "local" else None)
    assert bool(cloud.requests) == (served == "cloud")
    if served == "cloud":
        fallback = next(e for e in events if isinstance(e, Fallback))
        assert fallback.cause == "failed"  # the unsure local call (0.40 < 0.6) was not delivered
        local_attempt = trace.attempts[0]
        assert (local_attempt.engine, local_attempt.error_type) == ("local", UnsureCallError)


async def test_an_unsure_call_stands_where_no_other_engine_can_answer() -> None:
    call = ScriptedCall("set_timer", '{"minutes": 4}', confidence=0.1)
    local = ScriptedEngine("local", script=[0.05, call])
    async with HybridClient(local=local, router=None, policy=SURE) as client:
        done = await client.complete("timer", tools=[TIMER])
    assert [(c.engine, c.confidence) for c in done.tool_calls] == [("local", 0.1)]


def test_the_confidence_bound_is_checked_like_every_policy_number() -> None:
    from hybridllm.errors import PolicyError

    for bad in (1.5, -0.1, "high", True):
        with pytest.raises(PolicyError) as info:
            Policy(tools={"min_call_confidence": bad})
        assert info.value.field == "tools.min_call_confidence"


async def test_a_later_unsure_call_of_a_parallel_answer_stands() -> None:
    """The first call was delivered: the answer cannot move, so the second stands."""
    first = ScriptedCall("set_timer", '{"minutes": 4}', confidence=0.9)
    second = ScriptedCall("set_timer", '{"minutes": 9}', confidence=0.2)
    local = ScriptedEngine("local", script=[0.05, first, 0.01, second])
    cloud = ScriptedEngine("cloud", script=[0.2, ScriptedCall("set_timer", '{"minutes": 5}')])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=SURE) as client:
        done = await client.complete("two timers", tools=[TIMER])
    assert [(c.engine, c.parsed()["minutes"]) for c in done.tool_calls] == [
        ("local", 4),
        ("local", 9),
    ]
    assert not cloud.requests


# ---- a call to a tool the request does not name ------------------------------------------------

FITTING = Policy(name="f", routing={"prefer": "local"}, tools={"min_tool_fit": 0.5})


@pytest.mark.parametrize(
    ("prompt", "served"),
    [
        ("set a timer for my tea, 4 minutes", "local"),  # "timer" stated: fit 1.0
        ("what is the perimeter of a rectangle 5 by 4?", "cloud"),  # fit 0.0
        ("Stelle einen Kurzzeitwecker auf 4 Minuten", "cloud"),  # not English: no word stated
    ],
)
async def test_a_local_call_to_a_tool_the_request_does_not_name_goes_to_the_cloud(
    prompt: str, served: str
) -> None:
    local = ScriptedEngine("local", script=[0.05, ScriptedCall("set_timer", '{"minutes": 4}')])
    cloud = ScriptedEngine("cloud", script=[0.2, "A rectangle's perimeter is 18."])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=FITTING) as client:
        async with client.stream(prompt, tools=[TIMER]) as s:
            events = [e async for e in s.events()]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert bool(calls) == (served == "local") and bool(cloud.requests) == (served == "cloud")
    if served == "cloud":
        fallback = next(e for e in events if isinstance(e, Fallback))
        assert fallback.reason.endswith("(fit 0.00 < 0.5)")
        assert "".join(e.text for e in events if isinstance(e, Token)).startswith("A rectangle")


async def test_an_unfit_call_stands_where_no_other_engine_can_answer() -> None:
    local = ScriptedEngine("local", script=[0.05, ScriptedCall("set_timer", '{"minutes": 4}')])
    async with HybridClient(local=local, router=None, policy=FITTING) as client:
        done = await client.complete("perimeter of a rectangle 5 by 4", tools=[TIMER])
    assert [c.name for c in done.tool_calls] == ["set_timer"]


async def test_the_fit_bound_reaches_the_check_as_an_unfit_call_error() -> None:
    """The local attempt ends on the typed `UnfitCallError`; the cloud's call is not judged by
    the bound (the cloud is where an unfit call goes)."""
    from hybridllm.errors import UnfitCallError

    local = ScriptedEngine("local", script=[0.05, ScriptedCall("set_timer", '{"minutes": 4}')])
    cloud = ScriptedEngine("cloud", script=[0.2, ScriptedCall("set_timer", '{"minutes": 5}')])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=FITTING) as client:
        done = await client.complete("perimeter of a rectangle 5 by 4", tools=[TIMER])
    failed = [(a.engine, a.error_type) for a in done.trace.attempts if a.error_type]
    assert failed == [("local", UnfitCallError)]
    assert [(c.engine, c.parsed()["minutes"]) for c in done.tool_calls] == [("cloud", 5)]


def test_the_fit_bound_is_checked_like_every_policy_number() -> None:
    from hybridllm.errors import PolicyError

    for bad in (1.5, -0.1, "high", True):
        with pytest.raises(PolicyError) as info:
            Policy(tools={"min_tool_fit": bad})
        assert info.value.field == "tools.min_tool_fit"


# ---- a call written as text is not an answer -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ('<tools>\n{"type": "function"}', True),
        ('  <tool_call>\n{"name": "set_timer"}', True),
        ("[TOOL_CALLS] [{}]", True),
        ("<tool", None),  # could still become markup
        ("", None),
        ("<b>bold</b>", False),
        ("The timer is set.", False),
        ("Use <tools> in XML", False),  # markup only counts at the start
    ],
)
def test_template_call_markup_at_the_start_is_a_call_written_as_text(
    text: str, written: bool | None
) -> None:
    from hybridllm.tools import written_call

    assert written_call(text) is written


async def test_a_call_written_as_text_escalates_before_any_of_it_is_shown() -> None:
    markup = ["<to", "ols>\n", '{"type": "function", ', '"function": {"name": "set_timer"}}']
    local = ScriptedEngine("local", script=[0.05, *markup])
    cloud = ScriptedEngine("cloud", script=[0.2, ScriptedCall("set_timer", '{"minutes": 5}')])
    events, trace = await _called(local, cloud, LOCAL_FIRST, "tea timer")
    assert not [e for e in events if isinstance(e, Token)]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.engine, c.parsed()) for c in calls] == [("cloud", {"minutes": 5})]


async def test_text_that_only_starts_like_markup_is_delivered_whole_and_in_order() -> None:
    local = ScriptedEngine("local", script=[0.05, "<", "b>bold", "</b> and", " plain"])
    async with HybridClient(local=local, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream("format it", tools=[TIMER]) as s:
            tokens = [e.text async for e in s.events() if isinstance(e, Token)]
    assert "".join(tokens) == "<b>bold</b> and plain"
    assert tokens[-2:] == ["</b> and", " plain"]  # streamed as they came once it diverged


async def test_a_call_written_as_text_with_no_engine_left_raises_what_was_produced() -> None:
    error = await _alone_failing([0.05, "<tool_call>", '{"name": "set_timer"}'], "tea timer")
    assert error.produced == "<tool_call>" and error.what == "tool_call"


async def test_a_named_call_that_fails_its_check_still_goes_to_the_cloud() -> None:
    """Named inside the deadline (the answer started), then invalid: nothing was delivered, so
    the cloud answers, as for a call that came whole."""
    bad = ScriptedCall("set_timer", '{"minutes": "five"}', arguments_s=0.1)
    local = ScriptedEngine("local", script=[0.05, bad])
    cloud = ScriptedEngine("cloud", script=[0.2, ScriptedCall("set_timer", '{"minutes": 5}')])
    events, trace = await _called(local, cloud, LOCAL_FIRST, "tea timer")
    assert [(e.engine, e.parsed()) for e in events if isinstance(e, ToolCall)] == [
        ("cloud", {"minutes": 5})
    ]
    assert any(isinstance(e, Fallback) and e.to_engine == "cloud" for e in events)


async def test_after_a_named_call_fails_the_next_engine_has_its_first_token_time() -> None:
    """The stall limit is for gaps in a started answer: after a named local call fails its
    check (nothing delivered), a cloud that takes longer than `stall_ms` to its first token
    still answers (it was cut as a stall before)."""
    policy = LOCAL_FIRST.with_(routing={"stall_ms": 1000})
    bad = ScriptedCall("set_timer", '{"minutes": "five"}', arguments_s=0.1)
    local = ScriptedEngine("local", script=[0.05, bad])
    cloud = ScriptedEngine("cloud", script=[3.0, ScriptedCall("set_timer", '{"minutes": 5}')])
    events, trace = await _called(local, cloud, policy, "tea timer")
    assert [(e.engine, e.parsed()) for e in events if isinstance(e, ToolCall)] == [
        ("cloud", {"minutes": 5})
    ]
    # a named call that stops writing its arguments is a stall, as any started answer
    stuck = ScriptedCall("set_timer", '{"minutes": 1}', arguments_s=5.0)
    local = ScriptedEngine("local", script=[0.05, stuck])
    cloud = ScriptedEngine("cloud", script=[0.1, ScriptedCall("set_timer", '{"minutes": 2}')])
    events, trace = await _called(local, cloud, policy, "tea timer")
    assert [(e.engine, e.parsed()) for e in events if isinstance(e, ToolCall)] == [
        ("cloud", {"minutes": 2})
    ]


async def test_a_call_named_after_the_deadline_does_not_stop_the_racing_cloud() -> None:
    """Named at 0.7 s, past the 500 ms deadline: the cloud started at the deadline keeps
    racing. The local call, whole at 0.9 s, comes first and serves (a missed deadline, said);
    when it fails its check instead, the cloud already under way answers (no second request)."""
    late = ScriptedCall("set_timer", '{"minutes": 1}', arguments_s=0.2)
    local = ScriptedEngine("local", script=[0.7, late])
    cloud = ScriptedEngine("cloud", script=[1.0, ScriptedCall("set_timer", '{"minutes": 2}')])
    events, trace = await _called(local, cloud, LOCAL_FIRST, "timer")
    assert [(e.engine, e.parsed()) for e in events if isinstance(e, ToolCall)] == [
        ("local", {"minutes": 1})
    ]
    assert len(cloud.requests) == 1 and any(isinstance(e, DeadlineMissed) for e in events)
    bad = ScriptedCall("set_timer", '{"minutes": "one"}', arguments_s=0.2)
    local = ScriptedEngine("local", script=[0.7, bad])
    cloud = ScriptedEngine("cloud", script=[1.0, ScriptedCall("set_timer", '{"minutes": 2}')])
    events, trace = await _called(local, cloud, LOCAL_FIRST, "timer")
    assert [(e.engine, e.parsed()) for e in events if isinstance(e, ToolCall)] == [
        ("cloud", {"minutes": 2})
    ]
    assert len(cloud.requests) == 1
