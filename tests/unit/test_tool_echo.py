"""An answer that only echoes the last tool result is a failed answer (issue 43, item 4): the
local model answering `{"ok": true, "minutes": 5}` with that same text is never delivered; the
request escalates where the policy allows, like call markup written as text. An answer that
merely starts like the result goes on once it differs. Scripted engines on the virtual clock
(orchestration only)."""

from __future__ import annotations

from typing import Any

import pytest

from hybridllm import HybridClient, Policy, Token
from hybridllm.errors import AllEnginesFailedError, InvalidOutputError
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

RESULT = '{"ok": true, "minutes": 5}'
CALL = {"id": "call_1", "type": "function", "function": {"name": "set_timer", "arguments": "{}"}}
LOOP: list[dict[str, Any]] = [
    {"role": "user", "content": "Set a tea timer for five minutes."},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
]
LOCAL_FIRST = Policy(name="l", routing={"prefer": "local", "ttft_deadline_ms": 500})


def pieces(text: str) -> list[float | str]:
    out: list[float | str] = []
    for i in range(0, len(text), 4):
        out += [0.02, text[i : i + 4]]
    return out


async def answer(local_text: str) -> tuple[str, Any, ScriptedEngine]:
    local = ScriptedEngine("local", script=pieces(local_text))
    cloud = ScriptedEngine("cloud", tokens=["Your ", "timer ", "is ", "set."])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream(LOOP) as s:
            text = "".join([e.text async for e in s.events() if isinstance(e, Token)])
    return text, s.trace, cloud


@pytest.mark.parametrize(
    "echo", [RESULT, f"```json\n{RESULT}\n```", f"'{RESULT}'", '{"ok": true,', RESULT + "\n"]
)
async def test_an_echo_of_the_tool_result_is_never_delivered_and_the_cloud_answers(
    echo: str,
) -> None:
    text, trace, cloud = await answer(echo)
    assert text == "Your timer is set." and trace.engine == "cloud"
    assert trace.attempts[0].engine == "local"
    assert trace.attempts[0].error_type is InvalidOutputError


@pytest.mark.parametrize(
    "said", ["The timer is set for 5 minutes.", '{"ok": true} means the timer is running.']
)
async def test_an_answer_that_differs_from_the_result_is_delivered_whole(said: str) -> None:
    text, trace, cloud = await answer(said)
    assert text == said and trace.engine == "local" and cloud.requests == []


async def test_with_no_other_engine_the_echo_is_the_error() -> None:
    local = ScriptedEngine("local", script=pieces(RESULT))
    async with HybridClient(local=local, router=None, policy=LOCAL_FIRST) as client:
        with pytest.raises((InvalidOutputError, AllEnginesFailedError)) as caught:
            await client.complete(LOOP)
    err = caught.value
    found = err if isinstance(err, InvalidOutputError) else err.attempts[-1][1]
    assert isinstance(found, InvalidOutputError) and found.what == "echo"


async def test_a_prose_tool_result_read_back_is_an_answer() -> None:
    prose = "It is sunny and 21 degrees Celsius in Lisbon."
    local = ScriptedEngine("local", script=pieces(prose))
    cloud = ScriptedEngine("cloud", tokens=["c"])
    loop = [*LOOP[:2], {"role": "tool", "tool_call_id": "call_1", "content": prose}]
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        done = await client.complete(loop)
    assert done.text == prose and done.trace.engine == "local" and cloud.requests == []
