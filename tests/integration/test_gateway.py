"""The gateway (`hybridllm serve`) end to end: the real openai SDK and curl as clients, the real
local engine (Qwen2.5-Coder 0.5B through llama-cpp-python) and the stand-in cloud (`hybridllm
serve-model`, SmolLM2, behind a `FaultProxy`) on loopback. Streaming and not, usage, the
"hybridllm" extension and its spans, a tool call, disconnects on both engines, auth, limits,
429 under saturation, bad input.
Every answer is short (24 tokens by the test policies); the disconnect tests ask for more and
leave after the first chunk."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.testing import FaultProxy, Faults, HybridServer
from tests.integration.gateway_fixture import InProcessGateway, local_engine, write_policies
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

KEY = "sk-gateway-test"
COUNT = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]
HELLO = [{"role": "user", "content": "Say hello in five words."}]
LONG = 300  # max_tokens of the disconnect tests: far more than they wait for


@pytest.fixture(scope="module")
def cloud_proxy(cloud_server: HybridServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", cloud_server.port), faults=Faults()) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def local() -> LlamaCppEngine:
    return local_engine()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, local: LlamaCppEngine, cloud_proxy: FaultProxy
) -> Iterator[InProcessGateway]:
    cloud = OpenAIEngine(base_url=f"{cloud_proxy.url}/v1", api_key=API_KEY, model=ALIAS)
    policies = write_policies(tmp_path_factory.mktemp("gateway-policies"))
    client = HybridClient(local=local, cloud=cloud, router=None, policy_dirs=[policies])
    with InProcessGateway(client, GatewayLimits(max_concurrency=2), api_key=KEY) as gw:
        yield gw


Sdk = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def sdk(gateway: InProcessGateway) -> AsyncIterator[Sdk]:
    """The openai SDK's async client at the gateway (`sdk(max_retries=0, api_key=...)`)."""
    made: list[openai.AsyncOpenAI] = []

    def make(**kw: Any) -> openai.AsyncOpenAI:
        made.append(openai.AsyncOpenAI(base_url=gateway.url, api_key=kw.pop("api_key", KEY), **kw))
        return made[-1]

    yield make
    for client in made:
        await client.close()


async def test_streamed_local_answer_through_the_openai_sdk(
    gateway: InProcessGateway, sdk: Sdk
) -> None:
    stream = await sdk().chat.completions.create(
        model="hybridllm/gw-local",
        messages=HELLO,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=16,
    )
    chunks = [c async for c in stream]
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert text and all(c.model_extra["hybridllm"] == {"engine": "local"} for c in content)
    (final,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    found = final.model_extra["hybridllm"]
    assert found["engine"] == "local" and found["policy"] == "gw-local"
    assert found["spans"] == [{"engine": "local", "start": 0, "end": len(text)}]
    assert found["ttft_ms"] > 0 and found["plan"] and found["reason"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert 0 < chunks[-1].usage.completion_tokens <= 16 and chunks[-1].usage.prompt_tokens > 0


async def test_whole_cloud_answer_with_the_decision_in_headers(
    gateway: InProcessGateway, sdk: Sdk
) -> None:
    raw = await sdk().chat.completions.with_raw_response.create(
        model="hybridllm/gw-local",  # the header overrides it
        messages=HELLO,  # type: ignore[arg-type]
        extra_headers={"x-hybridllm-policy": "gw-cloud"},
    )
    done = raw.parse()
    assert raw.headers["x-hybridllm-engine"] == "cloud"
    assert raw.headers["x-hybridllm-policy"] == "gw-cloud"
    assert float(raw.headers["x-hybridllm-ttft-ms"]) > 0
    text = done.choices[0].message.content or ""
    assert text and done.choices[0].finish_reason in ("stop", "length")
    assert done.model_extra is not None
    assert done.model_extra["hybridllm"]["spans"] == [
        {"engine": "cloud", "start": 0, "end": len(text)}
    ]
    assert done.usage is not None and done.usage.completion_tokens > 0


async def test_a_tool_call_passes_through(gateway: InProcessGateway, sdk: Sdk) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    done = await sdk().chat.completions.create(
        model="hybridllm/gw-local",
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=48,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)


def curl(gw: InProcessGateway, body: dict[str, Any], *headers: str) -> tuple[int, str]:
    """POST with curl; its status and body."""
    args = ["curl", "-sN", "-o", "-", "-w", "\n%{http_code}", f"{gw.url}/chat/completions"]
    for h in ("content-type: application/json", *headers):
        args += ["-H", h]
    out = subprocess.run(
        [*args, "--data-binary", "@-"],  # the body on stdin: no argv limit
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    text, _, status = out.rpartition("\n")
    return int(status), text


def test_curl_streams_a_cloud_answer_is_refused_without_the_key_and_past_the_body_limit(
    gateway: InProcessGateway,
) -> None:
    body = {"model": "hybridllm/gw-cloud", "messages": HELLO, "stream": True}
    status, text = curl(gateway, body, f"authorization: Bearer {KEY}")
    lines = [ln[len("data: ") :] for ln in text.splitlines() if ln.startswith("data: ")]
    assert status == 200 and lines[-1] == "[DONE]"
    chunks = [json.loads(ln) for ln in lines[:-1]]
    assert chunks[-1]["hybridllm"]["engine"] == "cloud"
    assert all(c["hybridllm"] == {"engine": "cloud"} for c in chunks[1:-1])
    for headers in ((), ("authorization: Bearer sk-wrong",)):
        status, text = curl(gateway, body, *headers)
        assert status == 401 and json.loads(text)["error"]["code"] == "invalid_api_key"
    huge = {**body, "messages": [{"role": "user", "content": "x" * 1_100_000}]}
    status, text = curl(gateway, huge, f"authorization: Bearer {KEY}")
    assert status == 413 and json.loads(text)["error"]["code"] == "request_too_large"


async def test_bad_input_gets_openai_errors_through_the_sdk(
    gateway: InProcessGateway, sdk: Sdk
) -> None:
    client = sdk(max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="gpt-4o", messages=HELLO)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as unsupported:
        await client.chat.completions.create(model="gw-local", messages=HELLO, n=2)  # type: ignore[arg-type]
    assert unsupported.value.param == "n"
    with pytest.raises(openai.BadRequestError) as too_many:
        await client.chat.completions.create(model="gw-local", messages=HELLO, max_tokens=10**6)  # type: ignore[arg-type]
    assert too_many.value.param == "max_tokens"
    with pytest.raises(openai.AuthenticationError):
        await sdk(api_key="sk-wrong", max_retries=0).models.list()


async def read_first_chunk_and_leave(
    gw: InProcessGateway, policy: str, at_first: Callable[[], None] = lambda: None
) -> None:
    """Stream a long answer, read its first content chunk (then call `at_first`), close the
    socket."""
    body = {"model": policy, "messages": COUNT, "stream": True, "max_tokens": LONG}
    headers = {"authorization": f"Bearer {KEY}"}
    url = f"{gw.url}/chat/completions"
    async with httpx.AsyncClient(timeout=60.0) as http:
        async with http.stream("POST", url, json=body, headers=headers) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if '"content": "' in line and '"content": ""' not in line:
                    at_first()
                    break  # leaving the block closes the connection


async def wait_for(check: Any, what: str, timeout_s: float = 30.0) -> None:
    """Poll until `check()` (a bound on the wait, not a timed assertion)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)


async def test_a_disconnect_stops_local_decoding_and_frees_the_engine(
    gateway: InProcessGateway, local: LlamaCppEngine, sdk: Sdk
) -> None:
    steps = local.steps_total
    await read_first_chunk_and_leave(gateway, "gw-local")
    await wait_for(lambda: not local.busy, "the local engine let go")
    assert local.steps_total - steps < LONG  # stopped, not decoded to max_tokens
    assert local.info().queue_depth == 0
    done = await sdk().chat.completions.create(
        model="gw-local",
        messages=HELLO,
        max_tokens=4,  # type: ignore[arg-type]
    )
    assert done.choices[0].message.content  # the next request is served


async def test_a_disconnect_closes_the_cloud_connection(
    gateway: InProcessGateway, cloud_proxy: FaultProxy
) -> None:
    before = {c.id: c.bytes_down for c in cloud_proxy.connections}
    streaming: list[int] = []

    def find_the_stream() -> None:  # the gateway's connection that the answer comes down
        now = cloud_proxy.connections
        streaming.extend(
            c.id for c in now if c.closed_at is None and c.bytes_down > before.get(c.id, 0)
        )

    await read_first_chunk_and_leave(gateway, "gw-cloud", find_the_stream)
    assert len(streaming) == 1
    closed = await asyncio.to_thread(cloud_proxy.wait_client_closed, streaming[0], 30.0)
    assert closed is not None  # the gateway's engine closed its side
    (rec,) = [c for c in cloud_proxy.connections if c.id == streaming[0]]
    assert rec.closed_by == "client"


async def test_saturation_answers_429_with_retry_after_and_loses_nobody(
    gateway: InProcessGateway, sdk: Sdk
) -> None:
    async def one(i: int) -> int:
        client = sdk(max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model="gw-local",
                messages=HELLO,
                stream=True,
                max_tokens=8,  # type: ignore[arg-type]
            )
            assert [c async for c in stream]
            return 200
        except openai.RateLimitError as exc:
            assert exc.response.headers["retry-after"] == "1"
            assert exc.code == "concurrency_limit"
            return 429

    statuses = await asyncio.gather(*(one(i) for i in range(5)))
    assert len(statuses) == 5 and set(statuses) == {200, 429}  # limit 2: some wait their turn
    assert statuses.count(200) >= 2
