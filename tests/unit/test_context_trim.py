"""A conversation that outgrows the local context (issue 42, item 1): `[sampling] overflow`.
"route" (the default) sends it to an engine that can hold it; "trim" drops the oldest turns
after the system message until it fits the local context, keeps a tool call with its result,
and says how many messages went in the trace; "error" fails at once with
`ContextOverflowError`. `trim_to_fit` is driven with a counting function; the client with
scripted engines on the virtual clock (their prompt counted by the script-aware estimate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.engines.base import GenerationRequest, Message, estimate_prompt_tokens
from hybridllm.errors import ContextOverflowError, PolicyError
from hybridllm.runtime.trace import Trace
from hybridllm.runtime.trim import room_for_output, trim_to_fit
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

SYSTEM = {"role": "system", "content": "You are terse."}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def words(messages: Sequence[Message]) -> int:
    """A count for the pure tests: one token per word, 2 per message."""
    return sum(2 + len(str(m.get("content") or "").split()) for m in messages)


def chat(turns: int, size: int = 10, *, tool_turn: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [SYSTEM]
    for i in range(turns):
        out.append({"role": "user", "content": f"q{i} " + "w " * size})
        if i == tool_turn:
            out.append({"role": "assistant", "content": None, "tool_calls": [CALL]})
            out.append({"role": "tool", "tool_call_id": "call_1", "content": "r " * size})
        out.append({"role": "assistant", "content": f"a{i} " + "w " * size})
    out[-1:] = []  # it ends on the user's question
    return out


def test_the_oldest_turns_go_the_system_message_and_the_question_stay() -> None:
    messages = tuple(chat(8))  # 1 + 8 user + 7 assistant messages, 13 "tokens" each
    request = GenerationRequest(messages, max_tokens=20)
    trimmed, dropped = trim_to_fit(request, n_ctx=100, count=words)
    kept = trimmed.messages
    assert kept[0] == SYSTEM and kept[-1] == messages[-1] and dropped == len(messages) - len(kept)
    assert words(kept) <= 100 - room_for_output(100, 20)
    assert kept[1]["role"] == "user"  # cut at a turn's start
    # the fewest dropped: one more turn would not have fitted
    one_more = (SYSTEM, *messages[len(messages) - len(kept) - 1 :])
    assert words(one_more) > 100 - room_for_output(100, 20)


def test_a_tool_call_leaves_with_its_result_or_stays_with_it() -> None:
    messages = tuple(chat(6, tool_turn=2))
    for n_ctx in range(40, 140, 4):
        kept, _ = trim_to_fit(GenerationRequest(messages, max_tokens=8), n_ctx=n_ctx, count=words)
        calls = [m for m in kept.messages if m.get("tool_calls")]
        results = [m for m in kept.messages if m["role"] == "tool"]
        assert len(calls) == len(results)


def test_a_prompt_that_fits_or_has_one_turn_is_kept_whole() -> None:
    request = GenerationRequest(tuple(chat(3)), max_tokens=8)
    assert trim_to_fit(request, n_ctx=10_000, count=words) == (request, 0)
    single = GenerationRequest(({"role": "user", "content": "w " * 500},), max_tokens=8)
    assert trim_to_fit(single, n_ctx=100, count=words) == (single, 0)  # routing decides
    last_too_long = [*chat(3), {"role": "assistant", "content": "x"}]
    last_too_long.append({"role": "user", "content": "w " * 500})
    cut, dropped = trim_to_fit(
        GenerationRequest(tuple(last_too_long), max_tokens=8), n_ctx=100, count=words
    )
    assert cut.messages == (SYSTEM, last_too_long[-1]) and dropped == len(last_too_long) - 2


# ---- the policy knob, through the client ----------------------------------------------------

LONG_CHAT = chat(12, size=150)  # about 1,700 tokens by the estimate: more than 600
POLICY = Policy(name="p", routing={"prefer": "local", "ttft_deadline_ms": 400})


def engines() -> tuple[ScriptedEngine, ScriptedEngine]:
    return ScriptedEngine("local", tokens=["l"], n_ctx=600), ScriptedEngine("cloud", tokens=["c"])


async def serve(overflow: str) -> tuple[Trace, ScriptedEngine, ScriptedEngine]:
    local, cloud = engines()
    pol = POLICY.with_(sampling={"overflow": overflow, "max_tokens": 64})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=pol) as client:
        done = await client.complete(LONG_CHAT)
    return done.trace, local, cloud


async def test_route_sends_a_long_conversation_whole_to_the_engine_that_holds_it() -> None:
    assert estimate_prompt_tokens(LONG_CHAT) > 600
    trace, local, cloud = await serve("route")
    assert trace.engine == "cloud" and trace.trimmed_messages == 0
    assert list(cloud.requests[0].messages) == LONG_CHAT and local.requests == []


async def test_trim_keeps_it_local_and_says_how_many_messages_went() -> None:
    trace, local, cloud = await serve("trim")
    assert trace.engine == "local" and cloud.requests == []
    sent = local.requests[0].messages
    assert sent[0] == SYSTEM and sent[-1] == LONG_CHAT[-1]
    assert trace.trimmed_messages == len(LONG_CHAT) - len(sent) > 0
    assert estimate_prompt_tokens(sent) <= 600 - room_for_output(600, 64)
    assert Trace.from_dict(trace.to_dict()).trimmed_messages == trace.trimmed_messages


async def test_error_fails_at_once_though_another_engine_could_hold_it() -> None:
    local, cloud = engines()
    pol = POLICY.with_(sampling={"overflow": "error"})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=pol) as client:
        with pytest.raises(ContextOverflowError) as caught:
            await client.complete(LONG_CHAT)
    assert caught.value.engine == "local" and caught.value.n_ctx == 600
    assert local.requests == [] and cloud.requests == []


def test_an_unknown_overflow_is_a_policy_error_naming_the_field() -> None:
    with pytest.raises(PolicyError) as caught:
        Policy(name="x", sampling={"overflow": "drop"})
    assert caught.value.field == "sampling.overflow"
