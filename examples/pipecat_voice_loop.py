"""A Pipecat voice loop on hybridllm, with text standing in for speech (no audio devices).

Pipecat owns the conversation: its context aggregators, its function-calling flow and its
interruptions; `HybridLLMService` answers each turn through a `HybridClient`. Two turns:

1. "What's the weather in Paris?": the model calls `get_weather`, a local Python function
   registered with Pipecat; Pipecat adds its result to the context and asks for the next turn,
   which answers from it.
2. A long answer that the user talks over (barge-in): after `--interrupt-after` words of it,
   the stand-in for TTS sends Pipecat's `InterruptionFrame`, and the service stops every engine
   before Pipecat's interruption handling returns.

    python examples/pipecat_voice_loop.py
    python examples/pipecat_voice_loop.py --cloud-url http://127.0.0.1:8000/v1 --cloud-model m

It prints each turn, the route and TTFB as Pipecat's metrics carry them, and the barge-in's
figures: the decode steps the local engine took after the service saw the interruption, and
the time to the engine's stop. `--json` prints them as one JSON object (the test reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMSetToolChoiceFrame,
    LLMTextFrame,
    MetricsFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.settings import LLMSettings
from pipecat.workers.runner import WorkerRunner

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, clock
from hybridllm.integrations.pipecat import HybridLLMService, HybridRouteMetricsData

WEATHER_QUESTION = "What's the weather in Paris?"
STORY = "Tell me a long story about a robot who learns to paint."
SYSTEM = (
    "You are a voice assistant. When a tool returns a result, tell the user the answer in one "
    "short English sentence; never write JSON."
)
WEATHER = FunctionSchema(
    name="get_weather",
    description="The weather now in a city",
    properties={"city": {"type": "string", "description": "the city's name"}},
    required=["city"],
)


@dataclass
class Report:
    """What the run showed: each spoken answer's text and its route and TTFB as Pipecat's
    metrics carried them, the calls the local function served, and the barge-in."""

    answers: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    routes: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    busy_at_interruption: bool | None = None
    steps_after_interruption: int | None = None
    interruption_to_stop_ms: float | None = None
    busy_after: bool | None = None


async def get_weather(params: FunctionCallParams, report: Report) -> None:
    """The local function: a fixed forecast (the point is the flow, not the weather). The
    turn after its result answers in words: a small local model offered the tool again tends
    to call it again, so the context's tool choice is "none" until the next user turn."""
    report.calls.append({"name": params.function_name, "arguments": dict(params.arguments)})
    city = str(params.arguments.get("city", "?"))
    params.context.set_tool_choice("none")
    await params.result_callback({"city": city, "celsius": 18, "sky": "light rain"})


class Mouth(FrameProcessor):
    """The stand-in for TTS: collects each answer's words, and talks over the one asked to be
    interrupted after `interrupt_after` words (Pipecat's `InterruptionFrame`, both ways, as a
    user starting to speak sends it)."""

    def __init__(self, report: Report, interrupt_after: int) -> None:
        super().__init__()
        self.report = report
        self.interrupt_after = interrupt_after
        self.barge_in = False  # set for the turn to talk over
        self.answered = asyncio.Event()
        self._words: list[str] = []
        self._route: dict[str, Any] = {}
        self._silenced = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self._words, self._route, self._silenced = [], {}, False
        elif isinstance(frame, LLMTextFrame) and not self._silenced:
            self._words.append(frame.text)
            if self.barge_in and len("".join(self._words).split()) >= self.interrupt_after:
                self._silenced, self.report.interrupted = True, True
                await self.broadcast_frame(InterruptionFrame)
        elif isinstance(frame, LLMFullResponseEndFrame) and (self._words or self._silenced):
            self.report.answers.append("".join(self._words))
            self.report.routes.append(self._route)
            self.answered.set()
        elif isinstance(frame, MetricsFrame):
            self._note(frame)
        await self.push_frame(frame, direction)

    def _note(self, frame: MetricsFrame) -> None:
        for data in frame.data:
            if isinstance(data, TTFBMetricsData):
                self._route["pipecat_ttfb_ms"] = data.value * 1000
            elif isinstance(data, HybridRouteMetricsData):
                route = {"engine": data.engine, "plan": data.plan, "reason": data.route_reason}
                self._route |= route | {"trace_ttft_ms": data.ttft_ms}


def watch_interruptions(llm: HybridLLMService, local: LlamaCppEngine, report: Report) -> None:
    """Snapshot the local engine as the service takes the interruption (Pipecat's own
    `on_before_process_frame` hook), to count the decode steps it takes after."""
    seen: dict[str, float] = {}

    @llm.event_handler("on_before_process_frame")
    async def before(_service: HybridLLMService, frame: Frame) -> None:
        if isinstance(frame, InterruptionFrame):
            seen["steps"], seen["at"] = local.steps_total, clock.now()
            report.busy_at_interruption = local.busy

    @llm.event_handler("on_after_process_frame")
    async def after(_service: HybridLLMService, frame: Frame) -> None:
        if isinstance(frame, InterruptionFrame) and "at" in seen:
            report.steps_after_interruption = local.steps_total - int(seen["steps"])
            report.busy_after = local.busy
            stop = local.stopped_at if local.stopped_at is not None else clock.now()
            report.interruption_to_stop_ms = max(0.0, stop - seen["at"]) * 1000


async def say(worker: PipelineWorker, mouth: Mouth, text: str, *, barge_in: bool) -> None:
    """One user turn as text, as speech-to-text would hand it on; wait for its answer."""
    mouth.answered.clear()
    mouth.barge_in = barge_in
    message = {"role": "user", "content": text}
    await worker.queue_frame(LLMSetToolChoiceFrame(tool_choice="auto"))
    await worker.queue_frame(LLMMessagesAppendFrame(messages=[message], run_llm=True))
    await mouth.answered.wait()


async def converse(client: HybridClient, local: LlamaCppEngine, args: argparse.Namespace) -> Report:
    report = Report()
    context = LLMContext(tools=ToolsSchema([WEATHER]))
    aggregators = LLMContextAggregatorPair(context)
    # greedy: the small model's answer from the tool result is then the one it is surest of
    settings = LLMSettings(system_instruction=SYSTEM, max_tokens=args.max_tokens, temperature=0.0)
    llm = HybridLLMService(client=client, policy=args.policy, settings=settings)

    async def weather(params: FunctionCallParams) -> None:
        await get_weather(params, report)

    llm.register_function("get_weather", weather)
    watch_interruptions(llm, local, report)
    mouth = Mouth(report, args.interrupt_after)
    pipeline = Pipeline([aggregators.user(), llm, mouth, aggregators.assistant()])
    params = PipelineParams(enable_metrics=True, enable_usage_metrics=True)
    worker = PipelineWorker(pipeline, params=params, cancel_on_idle_timeout=False)
    runner = WorkerRunner(handle_sigint=False)

    async def script() -> None:
        await say(worker, mouth, WEATHER_QUESTION, barge_in=False)
        await say(worker, mouth, STORY, barge_in=True)
        await worker.queue_frame(EndFrame())

    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), script())
    return report


def engines(args: argparse.Namespace) -> tuple[LlamaCppEngine, OpenAIEngine | None]:
    local = LlamaCppEngine(args.model, n_ctx=2048, pull=True, warm_up=False, use_tuning=False)
    if args.cloud_url is None:
        return local, None
    key = os.environ.get("HYBRIDLLM_CLOUD_KEY", "sk-none")
    return local, OpenAIEngine(base_url=args.cloud_url, api_key=key, model=args.cloud_model)


async def main(args: argparse.Namespace) -> Report:
    local, cloud = engines(args)
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        return await converse(client, local, args)


def show(report: Report) -> None:
    for call in report.calls:
        print(f"[tool] {call['name']}({json.dumps(call['arguments'])}) -> the local function")
    for i, (answer, route) in enumerate(zip(report.answers, report.routes, strict=True)):
        print(f"user: {WEATHER_QUESTION if i == 0 else STORY}")
        cut = "  [barge-in]" if i and report.interrupted else ""
        print(f"assistant: {answer.strip()}{cut}")
        print(
            f"  [route] {route.get('engine')} ({route.get('plan')}): {route.get('reason')}\n"
            f"  [ttft] Pipecat's TTFB metric (set from the trace) "
            f"{route.get('pipecat_ttfb_ms', 0):.1f} ms, the trace's TTFT "
            f"{route.get('trace_ttft_ms') or 0:.1f} ms"
        )
    print(
        f"[barge-in] engine busy at it: {report.busy_at_interruption}; decode steps after: "
        f"{report.steps_after_interruption}; to the engine's stop: "
        f"{report.interruption_to_stop_ms or 0:.1f} ms; busy after: {report.busy_after}"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--model",
        default="qwen2.5-coder-1.5b-instruct",
        help="the local GGUF (the 0.5B calls the tool, then echoes its JSON instead of answering)",
    )
    p.add_argument("--cloud-url", help="an OpenAI-compatible base URL (key: $HYBRIDLLM_CLOUD_KEY)")
    p.add_argument("--cloud-model", default="gpt-4o-mini")
    p.add_argument("--policy", default=None, help="a policy name (default: the client's)")
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--interrupt-after", type=int, default=8, help="words before the barge-in")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    logger.remove()  # Pipecat logs every frame at DEBUG: warnings only
    logger.add(sys.stderr, level="WARNING")
    result = asyncio.run(main(arguments))
    print(json.dumps(asdict(result)) if arguments.json else "", end="\n" if arguments.json else "")
    if not arguments.json:
        show(result)
