"""The handoff plan with the real engines: SmolLM2 through llama-cpp-python as the local engine,
the real `llama_cpp.server` on loopback behind a `FaultProxy` as the cloud. The local engine
gives the first tokens; the cloud is asked to continue from exactly that text and the answer
moves to it; a cloud that fails leaves the local engine to finish. Each test judges one
generation against its own trace and the bytes the cloud received (never two generations)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import Handoff, HybridClient, LlamaCppEngine, OpenAIEngine, Policy, Token
from hybridllm.engines.base import CONTINUE_INSTRUCTION
from hybridllm.engines.openai_engine import Continuation
from hybridllm.engines.template import ChatTemplate
from hybridllm.events import Event
from hybridllm.runtime.trace import Trace
from hybridllm.testing import FaultProxy, Faults, LlamaServer
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

PROMPT = "Write three sentences about the sea."
POLICY = Policy(
    name="handoff",
    routing={"prefer": "local", "retries": 0, "stall_ms": 20_000},
    sampling={"max_tokens": 40, "temperature": 0.0},
    handoff={"after_tokens": 4},
)


async def handoff_run(
    model_path: Path,
    proxy: FaultProxy,
    continuation: Continuation = "instruction",
    policy: Policy = POLICY,
) -> tuple[list[Event], Trace]:
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
    cloud = OpenAIEngine(
        base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS, continuation=continuation
    )
    async with HybridClient(local=local, cloud=cloud, policy=policy, router=None) as client:
        async with client.stream(PROMPT, plan="handoff") as s:
            events = [e async for e in s.events()]
    return events, s.trace


def parts(events: list[Event]) -> tuple[str, list[str]]:
    tokens = [e for e in events if isinstance(e, Token)]
    return "".join(t.text for t in tokens), [t.engine for t in tokens]


@pytest.mark.parametrize("continuation", ["instruction", "continue_final_message"])
async def test_handoff_moves_the_answer_to_the_cloud_at_the_seam(
    model_path: Path, proxy: FaultProxy, continuation: Continuation
) -> None:
    proxy.record = True
    events, trace = await handoff_run(model_path, proxy, continuation)
    text, who = parts(events)
    rec = trace.handoff
    assert rec is not None and rec.outcome == "switched", rec
    # one visible stream: the local engine's tokens, then the cloud's, one switch
    k = rec.local_tokens
    assert k == POLICY.handoff.after_tokens and who == ["local"] * k + ["cloud"] * (len(who) - k)
    local_text = "".join(e.text for e in events if isinstance(e, Token) and e.engine == "local")
    cloud_text = "".join(e.text for e in events if isinstance(e, Token) and e.engine == "cloud")
    assert text == local_text + cloud_text and len(local_text) == rec.local_chars
    assert [e for e in events if isinstance(e, Handoff)][0].chars == rec.local_chars
    # the cloud was asked to continue from exactly what the app had been shown: nothing the
    # local engine produced after it reached the app, so nothing is repeated or lost
    bodies = [json.loads(body) for head, body in proxy.requests() if b"/chat/completions" in head]
    assert len(bodies) == 1
    messages = bodies[0]["messages"]
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": local_text}]
    if continuation == "continue_final_message":  # the open final message, no instruction
        assert messages[-1] == assistant[0] and len(messages) == 2
        assert bodies[0]["continue_final_message"] is True
        assert bodies[0]["add_generation_prompt"] is False
    else:
        assert messages[-1] == {"role": "user", "content": CONTINUE_INSTRUCTION}
    assert trace.engine == "cloud" and trace.finish_reason in ("stop", "length")
    assert trace.started == ("local", "cloud") and trace.error is None
    assert trace.continuation == continuation  # the cloud's marks reach the trace at the switch


async def test_a_warm_cloud_reads_the_prompt_first_then_continues_the_delivered_text(
    model_path: Path, proxy: FaultProxy
) -> None:
    """handoff_warm_cloud: one token of the prompt is asked at once, then the continuation: the
    stream is still the local part plus the cloud's continuation of exactly that text."""
    proxy.record = True
    policy = Policy(
        name="handoff",
        routing={"prefer": "local", "retries": 0, "stall_ms": 20_000},
        sampling={"max_tokens": 40, "temperature": 0.0},
        handoff={"after_tokens": 4, "warm_cloud": True},
    )
    events, trace = await handoff_run(model_path, proxy, "continue_final_message", policy)
    rec = trace.handoff
    assert rec is not None and rec.outcome == "switched", rec
    local_text = "".join(e.text for e in events if isinstance(e, Token) and e.engine == "local")
    warm, cont = [json.loads(b) for h, b in proxy.requests() if b"/chat/completions" in h]
    assert warm["max_tokens"] == 1 and warm["messages"] == [{"role": "user", "content": PROMPT}]
    assert cont["messages"] == [*warm["messages"], {"role": "assistant", "content": local_text}]
    assert len(local_text) == rec.local_chars and trace.engine == "cloud" and trace.error is None


async def test_cloud_failure_during_the_handoff_local_continues(
    model_path: Path, proxy: FaultProxy
) -> None:
    proxy.faults = Faults(http_status=503)
    events, trace = await handoff_run(model_path, proxy)
    text, who = parts(events)
    rec = trace.handoff
    assert rec is not None and rec.outcome == "cloud_failed", rec
    assert text and set(who) == {"local"} and len(who) > POLICY.handoff.after_tokens
    assert not any(isinstance(e, Handoff) for e in events)
    assert trace.engine == "local" and trace.error is None and trace.finish_reason is not None


async def test_llama_cpp_servers_continue_the_delivered_text_as_raw_completions(
    model_path: Path, llama_cpp_server: LlamaServer
) -> None:
    """llama-cpp-python's server closes a trailing assistant turn and starts a new answer; given
    the model's chat template, the engine's probe finds its `/v1/completions` (issue 43), and
    the handoff's continuation is the template's prompt with the delivered text in the opened
    assistant turn."""
    up = ("127.0.0.1", llama_cpp_server.port)
    with FaultProxy(upstream=up, faults=Faults()) as proxy:
        proxy.record = True
        local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
        template = ChatTemplate.of_gguf(model_path)
        cloud = OpenAIEngine(
            base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS, chat_template=template
        )
        async with HybridClient(local=local, cloud=cloud, policy=POLICY, router=None) as client:
            async with client.stream(PROMPT, plan="handoff") as s:
                events = [e async for e in s.events()]
        sent = [json.loads(body) for head, body in proxy.requests() if b"/completions" in head]
    trace = s.trace
    local_text = "".join(e.text for e in events if isinstance(e, Token) and e.engine == "local")
    assert trace.continuation == "raw_completion" and trace.handoff is not None
    assert trace.handoff.outcome == "switched" and trace.engine == "cloud"
    raw = [b for b in sent if b.get("stream") and "prompt" in b]
    assert len(raw) == 1 and "messages" not in raw[0]
    assert raw[0]["prompt"] == template.prompt([{"role": "user", "content": PROMPT}], local_text)
