"""Continuation dialects, probed (issue 43, item 1): `OpenAIEngine(continuation="auto")` (the
default) probes the endpoint once with a tiny count and sends every continuation in the first
dialect that continued it (`continue_final_message`, a trailing assistant message, raw text to
`/v1/completions` written from the model's chat template where the engine has it, else the
instruction); a dialect whose fields the endpoint refuses (a 4xx) is skipped; the dialect is in
`RequestSent` and `Trace.continuation`. The endpoint is a loopback server in OpenAI's documented
streaming shape that answers per request body (no model: vLLM is not available here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hybridllm import GenerationRequest, OpenAIEngine
from hybridllm.engines.continuation import PROBE_START
from hybridllm.engines.template import ChatTemplate
from hybridllm.errors import InvalidArgumentError
from hybridllm.events import Delta, Finish, RequestSent
from hybridllm.runtime.trace import Trace
from hybridllm.tools import tool_spec
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


# ---- the raw-completion dialect: the prompt written here from the model's chat template ------

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def text_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    """One `text_completion` chunk as `/v1/completions` streams it."""
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [choice],
    }


def completion(text: str) -> dict[str, Any]:
    """A whole (unstreamed) `text_completion`, as the probe asks for one: the same shape as
    a streamed chunk, with its finish reason."""
    return text_chunk(text, "stop")


def llama_cpp_server(body: dict[str, Any]) -> list[dict[str, Any]] | dict[str, Any]:
    """llama-cpp-python's server: a chat request's trailing assistant turn is closed and a new
    answer starts (it restarts); raw text goes on from where it stops."""
    if "prompt" not in body:
        return RESTARTS
    if not body.get("stream"):
        return completion(" 6, 7")
    usage = {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}
    return [text_chunk(" were"), text_chunk(" painted", "stop"), {**text_chunk(""), "usage": usage}]


async def test_a_server_that_continues_only_raw_text_gets_the_raw_completion(
    ep: Endpoint,
) -> None:
    marks, _ = await continue_twice(ep, llama_cpp_server, chat_template=CHATML)
    assert [m.continuation for m in marks] == ["raw_completion"] * 2
    raw = [b for b in ep.bodies if "prompt" in b and b.get("stream")]
    assert len(raw) == 2 and all("messages" not in b for b in raw)
    prompt = "<|im_start|>user\nWrite about lighthouses.<|im_end|>\n<|im_start|>assistant\n"
    assert raw[0]["prompt"] == prompt + "Lighthouses were"  # the turn opened, the text in it
    assert raw[0]["max_tokens"] == 8 and "prediction" not in raw[0]


async def test_the_raw_dialect_streams_the_text_and_its_finish(ep: Endpoint) -> None:
    ep.answer = llama_cpp_server
    engine = OpenAIEngine(
        base_url=ep.url,
        api_key="none",
        model="m",
        chat_template=ChatTemplate(CHATML),
        continuation="raw_completion",
    )
    req = GenerationRequest(ASK, max_tokens=8, assistant_prefix="Lighthouses")
    chunks = [c async for c in engine.stream(req)]
    await engine.aclose()
    assert "".join(c.text for c in chunks if isinstance(c, Delta)) == " were painted"
    finish = [c for c in chunks if isinstance(c, Finish)]
    assert finish[0].reason == "stop" and finish[0].completion_tokens == 2
    assert finish[0].prompt_tokens == 20 and not finish[0].usage_estimated


async def test_without_the_chat_template_the_probe_ends_at_the_instruction(ep: Endpoint) -> None:
    marks, _ = await continue_twice(ep, llama_cpp_server)
    assert [m.continuation for m in marks] == ["instruction"] * 2
    assert not any("prompt" in b for b in ep.bodies)


async def test_a_server_without_raw_completions_is_probed_past_them(ep: Endpoint) -> None:
    ep.answer = lambda b: 404 if "prompt" in b else RESTARTS
    marks, _ = await continue_twice(ep, ep.answer, chat_template=CHATML)
    assert [m.continuation for m in marks] == ["instruction"] * 2


async def test_a_raw_continuation_with_tools_goes_as_the_instruction(ep: Endpoint) -> None:
    ep.answer = llama_cpp_server
    engine = OpenAIEngine(
        base_url=ep.url,
        api_key="none",
        model="m",
        chat_template=CHATML,
        continuation="raw_completion",
    )
    tools = tool_spec([{"type": "function", "function": {"name": "f"}}], None, None)
    req = GenerationRequest(ASK, max_tokens=8, assistant_prefix="Light", tools=tools)
    sent = [c async for c in engine.stream(req) if isinstance(c, RequestSent)]
    await engine.aclose()
    assert sent[0].continuation == "instruction" and "messages" in ep.bodies[0]


async def test_a_template_that_refuses_the_messages_sends_the_instruction(ep: Endpoint) -> None:
    ep.answer = llama_cpp_server
    strict = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    )
    engine = OpenAIEngine(
        base_url=ep.url,
        api_key="none",
        model="m",
        chat_template=strict,
        continuation="raw_completion",
    )
    req = GenerationRequest(ASK, max_tokens=8, assistant_prefix="Light")
    sent = [c async for c in engine.stream(req) if isinstance(c, RequestSent)]
    await engine.aclose()
    assert sent[0].continuation == "instruction"


@pytest.mark.parametrize(
    ("kw", "argument"),
    [
        ({"continuation": "raw_completion"}, "chat_template"),
        ({"chat_template": "{% if %}"}, "chat_template"),
        ({"chat_template": "  "}, "chat_template"),
        ({"chat_template": 3}, "chat_template"),
        ({"continuation": "completion"}, "continuation"),
    ],
)
def test_bad_templates_and_dialects_are_typed_errors(kw: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        OpenAIEngine(base_url="http://127.0.0.1:9/v1", api_key="none", model="m", **kw)
    assert caught.value.argument == argument


def test_the_template_renders_like_transformers() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "[{{ m['role'] }}]{{ m['content'] | tojson }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}",
        bos_token="<s>",
    )
    msgs = [
        {"role": "user", "content": "café"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "y"},
    ]
    assert template.prompt(msgs, "go") == '<s>[user]"café"[assistant]"x"[assistant]go'
