"""Unit tests of the OpenTelemetry recorder (`telemetry/otel.py`): spans, their nesting and real
times, the GenAI attributes and metrics, content only when captured.

`ScriptedEngine` doubles (scripted test engines) on the virtual clock; the SDK's in-memory span
exporter and metric reader, on providers each test makes (tests/unit/otel_sdk.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from hybridllm import HybridClient, Policy, Telemetry
from hybridllm.errors import AllEnginesFailedError, CloudConnectionError, LocalEngineError
from hybridllm.telemetry.otel import OtelRecorder
from hybridllm.testing import ScriptedEngine
from tests.unit.otel_sdk import Sdk, make_sdk

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

FAILOVER = Policy(name="t", routing={"prefer": "cloud", "objective": "latency", "retries": 0})
DURATION = "gen_ai.client.operation.duration"
TOKENS = "gen_ai.client.token.usage"
TTFC = "gen_ai.client.operation.time_to_first_chunk"
TPOC = "gen_ai.client.operation.time_per_output_chunk"


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    made = make_sdk()
    yield made
    made.shutdown()


def telemetry(sdk: Sdk, capture: bool = False) -> Telemetry:
    """`Telemetry(otel=True)` whose recorder records to this test's providers."""
    tel = Telemetry(otel=True, capture_content=capture)
    assert isinstance(tel.otel, OtelRecorder) and tel.otel.capture_content is capture
    tel.otel = sdk.recorder(capture)
    return tel


async def test_a_local_request_is_a_parent_span_with_one_internal_chat_child(sdk: Sdk) -> None:
    local = ScriptedEngine("local", tokens=["a", "b", "c"], ttft_s=0.05, tpot_s=0.01, model="s")
    async with HybridClient(local=local, telemetry=telemetry(sdk)) as client:
        s = client.stream("hi")
        _ = [t async for t in s]
    parent, child = sdk.span("hybridllm.request"), sdk.span("chat s")
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert child.kind is SpanKind.INTERNAL and child.status.status_code is StatusCode.UNSET
    a = child.attributes or {}
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "llama_cpp"
    assert a["gen_ai.request.model"] == "s" and a["gen_ai.response.finish_reasons"] == ("stop",)
    assert a["hybridllm.engine"] == "local" and a["hybridllm.role"] == "primary"
    assert a["gen_ai.usage.output_tokens"] == s.trace.completion_tokens
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.05)
    attempt = s.trace.attempts[0]  # real times: wall = wall_start + (t - t_start)
    assert child.start_time is not None and parent.start_time is not None
    assert (child.start_time - parent.start_time) / 1e9 == pytest.approx(
        attempt.t_start - s.trace.t_start, abs=1e-6
    )
    assert child.end_time is not None and (child.end_time - child.start_time) / 1e9 == (
        pytest.approx((attempt.t_end or 0) - attempt.t_start, abs=1e-6)
    )
    p = parent.attributes or {}
    assert p["hybridllm.engine"] == "local" and p["hybridllm.ttft_ms"] == pytest.approx(50)
    assert "hybridllm.plan" in p and "hybridllm.policy" in p and ERROR not in p
    assert sdk.count(DURATION, **{"gen_ai.provider.name": "llama_cpp"}) == 1
    assert sdk.count(TTFC) == 1 and sdk.count(TPOC) == 2  # three chunks: two gaps
    assert sdk.points(TPOC)[0].sum == pytest.approx(0.02)
    assert sdk.count(TOKENS, **{"gen_ai.token.type": "output"}) == 1


ERROR = "error.type"


async def test_a_failover_is_two_attempts_the_failed_one_with_its_error(sdk: Sdk) -> None:
    cloud = ScriptedEngine("cloud", script=[0.1, "Hel", CloudConnectionError("reset")], model="big")
    local = ScriptedEngine("local", tokens=["lo"], ttft_s=0.05, model="s")
    async with HybridClient(
        local=local, cloud=cloud, router=None, policy=FAILOVER, telemetry=telemetry(sdk)
    ) as client:
        _ = [t async for t in client.stream("hi")]
    failed, served = sdk.span("chat big"), sdk.span("chat s")
    parent = sdk.span("hybridllm.request")
    assert failed.kind is SpanKind.CLIENT and served.kind is SpanKind.INTERNAL
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})[ERROR] == "CloudConnectionError"
    assert (failed.attributes or {})["gen_ai.provider.name"] == "openai"
    assert ERROR not in (served.attributes or {}) and ERROR not in (parent.attributes or {})
    assert failed.end_time is not None and served.start_time is not None
    assert failed.end_time <= served.start_time  # the local attempt started on the failure
    assert {failed.parent.span_id, served.parent.span_id} == {parent.context.span_id}  # type: ignore[union-attr]
    assert sdk.count(DURATION, **{ERROR: "CloudConnectionError"}) == 1
    assert sdk.count(DURATION) == 2 and sdk.count(TTFC) == 2


async def test_a_hedge_shows_the_race_and_the_cancelled_loser_is_no_error(sdk: Sdk) -> None:
    local = ScriptedEngine("local", script=[0.3, "slow"], model="s")
    cloud = ScriptedEngine("cloud", script=[0.02, "hedged"], model="big")
    pol = Policy(
        name="h", routing={"prefer": "local", "ttft_deadline_ms": 1000}, hedge={"after_ms": 50}
    )
    async with HybridClient(
        local=local, cloud=cloud, policy=pol, telemetry=telemetry(sdk)
    ) as client:
        res = await client.complete("q")
    assert res.trace.hedged
    loser, winner = sdk.span("chat s"), sdk.span("chat big")
    la, wa = loser.attributes or {}, winner.attributes or {}
    assert (la["hybridllm.role"], la["hybridllm.outcome"]) == ("primary", "cancelled")
    assert (wa["hybridllm.role"], wa["hybridllm.outcome"]) == ("hedge", "finished")
    assert ERROR not in la and loser.status.status_code is StatusCode.UNSET
    assert winner.start_time is not None and loser.start_time is not None
    assert (winner.start_time - loser.start_time) / 1e9 == pytest.approx(0.05, abs=1e-6)
    assert (sdk.span("hybridllm.request").attributes or {})["hybridllm.hedged"] is True
    assert sdk.count(DURATION) == 1  # the cancelled attempt has no duration sample


async def test_a_failed_request_is_an_error_on_the_parent(sdk: Sdk) -> None:
    cloud = ScriptedEngine("cloud", script=[CloudConnectionError("down")], model="big")
    local = ScriptedEngine("local", script=[LocalEngineError("oom", engine="local")], model="s")
    async with HybridClient(
        local=local, cloud=cloud, router=None, policy=FAILOVER, telemetry=telemetry(sdk)
    ) as client:
        with pytest.raises(AllEnginesFailedError):
            await client.complete("q")
    parent = sdk.span("hybridllm.request")
    assert parent.status.status_code is StatusCode.ERROR
    assert (parent.attributes or {})[ERROR] == "AllEnginesFailedError"
    assert all(s.status.status_code is StatusCode.ERROR for s in sdk.spans() if s is not parent)
    assert sdk.count(TTFC) == 0 and sdk.count(DURATION) == 2


@pytest.mark.parametrize("capture", [False, True])
async def test_prompt_and_answer_only_when_captured(sdk: Sdk, capture: bool) -> None:
    local = ScriptedEngine("local", tokens=["secret answer"], model="s")
    async with HybridClient(local=local, telemetry=telemetry(sdk, capture)) as client:
        _ = await client.complete("my private prompt")
    dumped = json.dumps([dict(s.attributes or {}) for s in sdk.spans()])
    assert ("my private prompt" in dumped) is capture and ("secret answer" in dumped) is capture
    if capture:
        a = sdk.span("hybridllm.request").attributes or {}
        inputs = json.loads(str(a["gen_ai.input.messages"]))
        output = json.loads(str(a["gen_ai.output.messages"]))
        assert inputs[-1] == {
            "role": "user",
            "parts": [{"type": "text", "content": "my private prompt"}],
        }
        assert output[0]["parts"][0]["content"] == "secret answer"


async def test_the_parent_span_is_current_while_the_request_runs(sdk: Sdk) -> None:
    """Other instrumentation inside the request's tasks nests under it."""
    from opentelemetry import trace

    seen: list[int] = []

    class Watching(ScriptedEngine):
        async def stream(self, request):  # type: ignore[no-untyped-def,override]
            seen.append(trace.get_current_span().get_span_context().span_id)
            async for chunk in super().stream(request):
                yield chunk

    async with HybridClient(
        local=Watching("local", tokens=["x"], model="s"), telemetry=telemetry(sdk)
    ) as client:
        await client.complete("q")
    assert seen == [sdk.span("hybridllm.request").context.span_id]
