"""`HybridLLMService` in real Pipecat pipelines (pipecat-ai 1.14), text in and text out, over
the real local engine and the stand-in cloud behind the FaultProxy (issue 30).

Pipelines are driven with Pipecat's own test helper (`pipecat.tests.utils.run_test`: frames in,
the frames that came out of each end back), or, where a turn must wait for the one before it
(the function-calling flow), by a worker as an app runs one. The interruption is Pipecat's
`InterruptionFrame`, sent both ways by a processor downstream of the service (where TTS sits)
as a user starting to talk sends it; Pipecat's own `on_before_process_frame` hook snapshots the
engines as the service takes it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMTextFrame,
    MetricsFrame,
)
from pipecat.metrics.metrics import (
    LLMUsageMetricsData,
    ProcessingMetricsData,
    TTFBMetricsData,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.tests.utils import run_test
from pipecat.workers.runner import WorkerRunner

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.integrations.pipecat import HybridLLMService, HybridRouteMetricsData
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import FaultProxy, Faults
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
METRICS = PipelineParams(enable_metrics=True, enable_usage_metrics=True)
LONG = "Count from 1 to 300, separated by commas."
# ~880 SmolLM2 tokens: a prefill long enough to interrupt while both engines are at work
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 85
TOOL_MODEL = "qwen2.5-coder-0.5b-instruct"  # the smallest model whose template renders tools
WEATHER = FunctionSchema(
    name="get_weather",
    description="The weather now in a city",
    properties={"city": {"type": "string"}},
    required=["city"],
)


def local_engine(model_path: Path) -> LlamaCppEngine:
    return LlamaCppEngine(model_path, n_ctx=1024, n_threads=1, warm_up=False, use_tuning=False)


def asked(text: str) -> LLMContextFrame:
    return LLMContextFrame(context=LLMContext(messages=[{"role": "user", "content": text}]))


def metrics(frames: Sequence[Frame]) -> list[object]:
    """The metrics of the answer (Pipecat sends each processor's zeroes at the start)."""
    start = next(i for i, f in enumerate(frames) if isinstance(f, LLMFullResponseStartFrame))
    return [d for f in frames[start:] if isinstance(f, MetricsFrame) for d in f.data]


# ---- one answer: the frames and the metrics -------------------------------------------------


async def test_a_context_frame_is_answered_in_frames_with_metrics_from_the_trace(
    model_path: Path,
) -> None:
    async with HybridClient(local=local_engine(model_path), router=None) as client:
        llm = HybridLLMService(client=client, request={"max_tokens": 12})
        down, _up = await run_test(
            llm, frames_to_send=[asked("Say hello.")], pipeline_params=METRICS
        )
    trace = llm.last_trace
    assert trace is not None and trace.engine == "local" and trace.ttft_ms is not None
    kinds = [type(f) for f in down if not isinstance(f, MetricsFrame)]
    kinds = kinds[kinds.index(LLMFullResponseStartFrame) :]  # after the service's metadata
    assert kinds[-1] is LLMFullResponseEndFrame
    texts = [f for f in down if isinstance(f, LLMTextFrame)]
    assert len(texts) == trace.n_tokens > 0 and set(kinds[1:-1]) == {LLMTextFrame}
    data = metrics(down)
    (ttfb,) = [d for d in data if isinstance(d, TTFBMetricsData)]
    assert ttfb.value == pytest.approx(trace.ttft_ms / 1000, abs=1e-6)  # the trace's, not a timer
    (processing,) = [d for d in data if isinstance(d, ProcessingMetricsData)]
    assert trace.total_ms is not None
    assert processing.value == pytest.approx(trace.total_ms / 1000, abs=1e-6)
    (usage,) = [d for d in data if isinstance(d, LLMUsageMetricsData)]
    assert (usage.value.prompt_tokens, usage.value.completion_tokens) == (
        trace.prompt_tokens,
        trace.completion_tokens,
    )
    (route,) = [d for d in data if isinstance(d, HybridRouteMetricsData)]
    assert (route.engine, route.plan, route.route_reason) == (
        "local",
        trace.plan,
        trace.route_reason,
    )
    assert route.trace["request_id"] == trace.request_id


# ---- barge-in ---------------------------------------------------------------------------------


class TalkOver(FrameProcessor):
    """Sends Pipecat's `InterruptionFrame` both ways at the first text frame that reaches it,
    where TTS would sit: the user starts talking as the answer starts being spoken."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame) and not self.sent:
            self.sent = True
            await self.broadcast_frame(InterruptionFrame)
        await self.push_frame(frame, direction)


@dataclass
class AtInterruption:
    """The engines as the service took the interruption, and as it handed it on."""

    steps: int = -1
    busy: bool = False
    cloud_open: bool = False
    steps_after: int = -1
    busy_after: bool = True
    seen: list[str] = field(default_factory=list)


def watch(llm: HybridLLMService, local: LlamaCppEngine, proxy: FaultProxy | None) -> AtInterruption:
    at = AtInterruption()

    @llm.event_handler("on_before_process_frame")
    async def before(_llm: HybridLLMService, frame: Frame) -> None:
        if isinstance(frame, InterruptionFrame) and not at.seen:
            at.steps, at.busy = local.steps_total, local.busy
            at.cloud_open = proxy is not None and any(
                c.closed_at is None for c in proxy.connections
            )

    @llm.event_handler("on_after_process_frame")
    async def after(_llm: HybridLLMService, frame: Frame) -> None:
        if isinstance(frame, InterruptionFrame) and not at.seen:
            at.seen.append("interruption")
            at.steps_after, at.busy_after = local.steps_total - at.steps, local.busy

    return at


async def test_barge_in_stops_the_local_engine_within_one_decode_step(model_path: Path) -> None:
    local = local_engine(model_path)
    async with HybridClient(local=local, router=None) as client:
        llm = HybridLLMService(client=client, request={"max_tokens": 300})
        at = watch(llm, local, None)
        talk = TalkOver()
        down, _up = await run_test(Pipeline([llm, talk]), frames_to_send=[asked(LONG)])
    assert talk.sent and at.seen == ["interruption"]
    assert at.busy, "the local engine was generating when the interruption came"
    assert at.steps_after <= 1 and not at.busy_after  # let go before Pipecat's handling returned
    (cut,) = llm.interruptions
    trace = cut.trace
    assert trace is not None and trace.engine == "local" and trace.completion_tokens != 300
    assert [a.outcome for a in trace.attempts] == ["cancelled"]
    assert any(isinstance(f, LLMFullResponseEndFrame) for f in down)


async def test_barge_in_mid_answer_closes_the_cloud_connection(
    model_path: Path, proxy: FaultProxy
) -> None:
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    policy = Policy(name="cloud", routing={"prefer": "cloud"})
    async with HybridClient(cloud=cloud, policy=policy, router=None) as client:
        llm = HybridLLMService(client=client, request={"max_tokens": 300})
        talk = TalkOver()
        await run_test(Pipeline([llm, talk]), frames_to_send=[asked(LONG)])
        (rec,) = proxy.connections
        closed = await anyio.to_thread.run_sync(lambda: proxy.wait_client_closed(rec.id, 3.0))
    (cut,) = llm.interruptions
    assert talk.sent and cut.trace is not None and cut.trace.engine == "cloud"
    assert closed is not None, "the cloud connection was left open"
    assert cut.trace.completion_tokens != 300 and rec.bytes_down < 4000  # cut, not played out


async def test_barge_in_before_the_first_token_stops_both_engines(
    model_path: Path, proxy: FaultProxy
) -> None:
    """The cloud stalls before its first byte; past the deadline the local engine starts on a
    long prompt beside it. The user talks before either has answered: both stop before the
    service hands the interruption on, and the FaultProxy sees the cloud's connection close."""
    proxy.faults = Faults(first_byte_stall_ms=10_000)
    policy = Policy(name="race", routing={"prefer": "cloud", "ttft_deadline_ms": 200})
    local = local_engine(model_path)
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    async with HybridClient(local=local, cloud=cloud, policy=policy, router=None) as client:
        llm = HybridLLMService(client=client, request={"max_tokens": 300})
        at = watch(llm, local, proxy)
        worker = PipelineWorker(Pipeline([llm]), cancel_on_idle_timeout=False)

        def both_running() -> bool:
            return local.busy and any(c.closed_at is None for c in proxy.connections)

        async def script() -> None:
            await worker.queue_frame(asked(LONG_PROMPT + LONG))
            await wait_until(both_running, 20.0)
            await worker.queue_frame(InterruptionFrame())
            await wait_until(lambda: bool(at.seen), 20.0)
            await worker.queue_frame(EndFrame())

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await asyncio.gather(runner.run(), script())
        (rec,) = proxy.connections
        closed = await anyio.to_thread.run_sync(lambda: proxy.wait_client_closed(rec.id, 3.0))
    assert at.busy and at.cloud_open, "both engines were running at the interruption"
    assert at.steps_after <= 1 and not at.busy_after
    assert closed is not None, "the cloud connection was left open"
    (cut,) = llm.interruptions
    assert cut.trace is not None and cut.trace.started == ("cloud", "local")
    assert cut.trace.n_tokens == 0


async def wait_until(cond: Callable[[], bool], limit_s: float) -> None:
    """Poll plain engine state (no event to wait on) every 5 ms, `limit_s` at most."""
    with anyio.fail_after(limit_s):
        while not cond():  # noqa: ASYNC110
            await anyio.sleep(0.005)


# ---- Pipecat's function-calling flow --------------------------------------------------------


async def test_a_tool_call_runs_through_pipecats_function_calling_flow() -> None:
    """The call goes to the registered function; its result goes into the context through
    Pipecat's aggregator, which asks for the next turn: a second inference over the result."""
    local = LlamaCppEngine(resolve_model(TOOL_MODEL), n_ctx=2048, warm_up=False, use_tuning=False)
    context = LLMContext(tools=ToolsSchema([WEATHER]))
    pair = LLMContextAggregatorPair(context)
    calls: list[dict[str, object]] = []
    answered = asyncio.Event()
    async with HybridClient(local=local, router=None) as client:
        llm = HybridLLMService(client=client, request={"max_tokens": 40, "temperature": 0.0})

        async def get_weather(params: FunctionCallParams) -> None:
            calls.append(dict(params.arguments))
            params.context.set_tool_choice("none")  # the next turn answers from the result
            await params.result_callback({"celsius": 18})

        llm.register_function("get_weather", get_weather)
        ends = Ends(answered)
        worker = PipelineWorker(
            Pipeline([pair.user(), llm, ends, pair.assistant()]), cancel_on_idle_timeout=False
        )
        ask = {"role": "user", "content": "What's the weather in Paris?"}

        async def script() -> None:
            await worker.queue_frame(LLMMessagesAppendFrame(messages=[ask], run_llm=True))
            await answered.wait()
            await worker.queue_frame(EndFrame())

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await asyncio.gather(runner.run(), script())
    assert calls and calls[0]["city"] == "Paris"
    assert ends.results == 1 and ends.inferences == 2
    roles = [m["role"] for m in context.get_messages()]  # type: ignore[index]
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool_result = context.get_messages()[2]
    assert json.loads(tool_result["content"]) == {"celsius": 18}  # type: ignore[index]


class Ends(FrameProcessor):
    """Counts the service's inferences and the function results Pipecat passed on; sets
    `answered` at the end of the first inference that spoke."""

    def __init__(self, answered: asyncio.Event) -> None:
        super().__init__()
        self.answered = answered
        self.inferences = self.results = 0
        self._spoke = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self.inferences, self._spoke = self.inferences + 1, False
        elif isinstance(frame, LLMTextFrame):
            self._spoke = True
        elif isinstance(frame, FunctionCallResultFrame):
            self.results += 1
        elif isinstance(frame, LLMFullResponseEndFrame) and self._spoke:
            self.answered.set()
        await self.push_frame(frame, direction)


# ---- the example --------------------------------------------------------------------------------


def test_the_voice_loop_example_calls_the_tool_then_is_cut_by_barge_in() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pipecat_voice_loop.py"), "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["name"] for c in report["calls"]] == ["get_weather"]
    assert report["calls"][0]["arguments"]["city"] == "Paris"
    assert len(report["answers"]) == 2 and report["answers"][0].strip()
    assert report["interrupted"] and report["busy_at_interruption"]
    assert report["steps_after_interruption"] <= 1 and report["busy_after"] is False
    assert all(r["engine"] == "local" for r in report["routes"])


async def test_an_out_of_band_inference_is_answered_with_its_trace(model_path: Path) -> None:
    """Pipecat's `run_inference` (summaries and the like): one answer, outside the pipeline."""
    async with HybridClient(local=local_engine(model_path), router=None) as client:
        llm = HybridLLMService(client=client)
        text = await llm.run_inference(asked("Say hello.").context, max_tokens=6)
    trace = llm.last_trace
    assert text and trace is not None and trace.engine == "local"
    assert trace.completion_tokens is not None and 0 < trace.completion_tokens <= 6
