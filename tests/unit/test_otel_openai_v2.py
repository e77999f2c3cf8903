"""hybridllm's OpenTelemetry beside opentelemetry-instrumentation-openai-v2 (the real package):
a cloud request through the real `OpenAIEngine` against a loopback SSE endpoint
(tests/unit/sse_endpoint.py, no model) is counted once, and the instrumentor's chat span nests
under hybridllm's request span.

The instrumentor runs as released: `opentelemetry-instrumentation-openai-v2==2.4b0` with
`opentelemetry-util-genai==1.1b0` (the dev extra's pin: 1.3b0 renamed a module 2.4b0 imports).
With that pair it follows the newer GenAI conventions (util-genai's experimental mode), and
records the cloud's gen_ai metrics itself; hybridllm records none for the cloud then."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hybridllm import HybridClient, Telemetry
from hybridllm.engines.openai_engine import OpenAIEngine
from hybridllm.telemetry.otel import openai_v2_active
from tests.unit.otel_sdk import Sdk, make_sdk
from tests.unit.sse_endpoint import Endpoint, chunk, serving

pytestmark = pytest.mark.anyio

DURATION = "gen_ai.client.operation.duration"
TOKENS = "gen_ai.client.token.usage"
TTFC = "gen_ai.client.operation.time_to_first_chunk"
USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
CHUNKS = [chunk({"content": "o"}), chunk({"content": "k"}), {**chunk({}, "stop"), "usage": USAGE}]


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    yield from serving(Endpoint(CHUNKS))


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    made = make_sdk()
    yield made
    made.shutdown()


@pytest.fixture
def instrumented(sdk: Sdk) -> Iterator[Any]:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=sdk.tracer_provider, meter_provider=sdk.meter_provider)
    try:
        yield instrumentor
    finally:
        instrumentor.uninstrument()


async def _ask(endpoint: Endpoint, sdk: Sdk) -> str:
    tel = Telemetry(otel=True)
    tel.otel = sdk.recorder()
    cloud = OpenAIEngine(model="m", base_url=endpoint.url, api_key="k")
    async with HybridClient(cloud=cloud, telemetry=tel) as client:
        return (await client.complete("hi")).text


async def test_beside_openai_v2_each_cloud_metric_is_counted_once(
    endpoint: Endpoint, sdk: Sdk, instrumented: Any
) -> None:
    assert openai_v2_active()
    assert await _ask(endpoint, sdk) == "ok"
    theirs, ours = sdk.span("chat m"), sdk.span("hybridllm.attempt cloud")
    parent = sdk.span("hybridllm.request")
    assert theirs.parent is not None and theirs.parent.span_id == parent.context.span_id
    assert ours.parent is not None and ours.parent.span_id == parent.context.span_id
    assert theirs.kind.name == "CLIENT" and ours.kind.name == "INTERNAL"
    assert not any(k.startswith("gen_ai.") for k in ours.attributes or {})
    assert (ours.attributes or {})["hybridllm.role"] == "primary"
    assert [s.name for s in sdk.spans()].count("chat m") == 1
    assert sdk.count(DURATION) == 1  # the instrumentor's
    assert (ours.attributes or {})["hybridllm.outcome"] == "finished"
    # the token usage is the instrumentor's, once per type; hybridllm adds none for the cloud
    assert sdk.count(TOKENS, **{"gen_ai.token.type": "input"}) == 1
    assert sdk.count(TOKENS, **{"gen_ai.token.type": "output"}) == 1
    assert sdk.count(TTFC) == 0  # 2.4b0 records no chunk times; hybridllm leaves the cloud to it


async def test_without_openai_v2_the_cloud_attempt_is_our_chat_span(
    endpoint: Endpoint, sdk: Sdk
) -> None:
    assert not openai_v2_active()
    assert await _ask(endpoint, sdk) == "ok"
    ours = sdk.span("chat m")
    assert (
        ours.kind.name == "CLIENT" and (ours.attributes or {})["gen_ai.provider.name"] == "openai"
    )
    assert (ours.attributes or {})["gen_ai.usage.input_tokens"] == 7
    assert sdk.count(DURATION) == 1 and sdk.count(TTFC) == 1
    assert sdk.count(TOKENS, **{"gen_ai.token.type": "output"}) == 1
