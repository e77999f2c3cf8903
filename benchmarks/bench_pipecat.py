"""Pipecat adapter figures (issue 30): Pipecat's own TTFB metric against the trace on the same
requests, and interruption (barge-in) to engine stop, for the local engine and the cloud.

    PYTHONPATH=$PWD python benchmarks/bench_pipecat.py [--rounds 5] [--model M] [--json PATH]

The local engine is `--model` (SmolLM2-135M by default, one thread) through llama-cpp-python;
the cloud is the same model served by `hybridllm serve-model` on loopback behind the FaultProxy
(which stamps when the client closed its connection). Both share this machine's cores.

Each request is one `LLMContextFrame` through a real Pipecat pipeline (`HybridLLMService`, then
a probe where TTS would sit), driven by Pipecat's `run_test`:

- TTFT: Pipecat's TTFB metric (the `TTFBMetricsData` the service pushed), the trace's TTFT, and
  what the pipeline saw: from the context frame reaching the service (Pipecat's
  `on_before_process_frame` hook) to the first `LLMTextFrame` reaching the probe, i.e. what a
  TTFB timed by Pipecat around the call would read, with the frame hops and the context's
  conversion to messages in it.
- Interruption: the probe sends `InterruptionFrame` both ways at the first text frame; from the
  service taking it (the hook again) to the local engine's llama thread leaving its decode loop
  (`LlamaCppEngine.stopped_at`), or to the client's side of the cloud connection closing (the
  FaultProxy), and to the service handing the interruption on (every engine let go); with the
  decode steps the local engine took after the service took it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread
from loguru import logger
from pipecat.frames.frames import (
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test

from benchmarks._report import cpu_model, report
from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, clock
from hybridllm.integrations.pipecat import HybridLLMService
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import FaultProxy, Faults, HybridServer

API_KEY, ALIAS = "sk-bench", "cloud"
SHORT = "Say one sentence about the number {i}."
LONG = "Count from {i} to 400, separated by commas."
Engine = Literal["local", "cloud"]
ENGINES: tuple[Engine, ...] = ("local", "cloud")


class Probe(FrameProcessor):
    """Where TTS would sit: stamps the first text frame of the answer (wall clock, as Pipecat's
    metrics read it); with `barge_in`, sends `InterruptionFrame` both ways at it."""

    def __init__(self, barge_in: bool) -> None:
        super().__init__()
        self.barge_in = barge_in
        self.answering = False
        self.first_text_at: float | None = None
        self.ttfb_s: float | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self.answering = True  # metrics before it: the zeroes every processor starts with
        elif isinstance(frame, LLMTextFrame) and self.first_text_at is None:
            self.first_text_at = time.time()
            if self.barge_in:
                await self.broadcast_frame(InterruptionFrame)
        elif isinstance(frame, MetricsFrame) and self.answering:
            values = [d.value for d in frame.data if isinstance(d, TTFBMetricsData)]
            self.ttfb_s = values[0] if values else self.ttfb_s
        await self.push_frame(frame, direction)


@dataclass
class Seen:
    """What Pipecat's hooks on the service saw: the context frame's arrival (wall clock), and
    the interruption's arrival and hand-on (`hybridllm.clock`), with the local engine's steps."""

    context_at: float | None = None
    cut_at: float | None = None
    cut_done_at: float | None = None
    steps_at_cut: int = 0
    steps_after: int | None = None


def hook(llm: HybridLLMService, local: LlamaCppEngine) -> Seen:
    seen = Seen()

    @llm.event_handler("on_before_process_frame")
    async def before(_llm: HybridLLMService, frame: Frame) -> None:
        if isinstance(frame, LLMContextFrame):
            seen.context_at = time.time()
        elif isinstance(frame, InterruptionFrame) and seen.cut_at is None:
            seen.cut_at, seen.steps_at_cut = clock.now(), local.steps_total

    @llm.event_handler("on_after_process_frame")
    async def after(_llm: HybridLLMService, frame: Frame) -> None:
        if isinstance(frame, InterruptionFrame) and seen.cut_done_at is None:
            seen.cut_done_at = clock.now()
            seen.steps_after = local.steps_total - seen.steps_at_cut

    return seen


@dataclass
class Rows:
    ttft: list[dict[str, Any]] = field(default_factory=list)
    cut: list[dict[str, Any]] = field(default_factory=list)


async def one(
    client: HybridClient, local: LlamaCppEngine, engine: Engine, prompt: str, barge_in: bool
) -> tuple[HybridLLMService, Seen, Probe]:
    llm = HybridLLMService(client=client, request={"engine": engine, "max_tokens": 400})
    seen, probe = hook(llm, local), Probe(barge_in)
    frame = LLMContextFrame(context=LLMContext(messages=[{"role": "user", "content": prompt}]))
    params = PipelineParams(enable_metrics=True)
    await run_test(Pipeline([llm, probe]), frames_to_send=[frame], pipeline_params=params)
    return llm, seen, probe


async def ttft_round(rows: Rows, client: HybridClient, local: LlamaCppEngine, i: int) -> None:
    for engine in ENGINES:
        llm, seen, probe = await one(client, local, engine, SHORT.format(i=i), False)
        trace = llm.last_trace
        assert trace is not None and trace.ttft_ms is not None and probe.ttfb_s is not None
        assert seen.context_at is not None and probe.first_text_at is not None
        rows.ttft.append(
            {
                "engine": engine,
                "pipecat_ttfb_ms": probe.ttfb_s * 1000,
                "trace_ttft_ms": trace.ttft_ms,
                "pipeline_ms": (probe.first_text_at - seen.context_at) * 1000,
            }
        )


async def cut_round(
    rows: Rows, client: HybridClient, local: LlamaCppEngine, proxy: FaultProxy, i: int
) -> None:
    for engine in ENGINES:
        # the client keeps its connection to the cloud open between requests: the stream's is
        # the one whose bytes moved
        before = {c.id: c.bytes_down for c in proxy.connections}
        llm, seen, _probe = await one(client, local, engine, LONG.format(i=i), True)
        assert seen.cut_at is not None and seen.cut_done_at is not None
        if engine == "local":
            stop = local.stopped_at
        else:
            rec = [c for c in proxy.connections if before.get(c.id) != c.bytes_down][-1]
            stop = await anyio.to_thread.run_sync(partial(proxy.wait_client_closed, rec.id, 3.0))
        rows.cut.append(
            {
                "engine": engine,
                "to_stop_ms": None if stop is None else (stop - seen.cut_at) * 1000,
                "to_handed_on_ms": (seen.cut_done_at - seen.cut_at) * 1000,
                "steps_after": seen.steps_after if engine == "local" else None,
            }
        )


def stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):7.2f} {max(values):7.2f}"


def render(res: dict[str, Any]) -> str:
    lines = [f"Pipecat adapter ({res['cpu']}; {res['rounds']} rounds; model {res['model']})"]
    lines.append("TTFT, ms (P50 max): Pipecat TTFB | trace | |TTFB - trace| | pipeline - trace")
    for engine in ("local", "cloud"):
        rs = [r for r in res["ttft"] if r["engine"] == engine]
        diff = [abs(r["pipecat_ttfb_ms"] - r["trace_ttft_ms"]) for r in rs]
        hop = [r["pipeline_ms"] - r["trace_ttft_ms"] for r in rs]
        ttfb = [r["pipecat_ttfb_ms"] for r in rs]
        trace = [r["trace_ttft_ms"] for r in rs]
        lines.append(f"  {engine:5}  {stats(ttfb)} | {stats(trace)} | {stats(diff)} | {stats(hop)}")
    lines.append("Interruption, ms (P50 max): to the engine's stop | to the service handing it on")
    for engine in ("local", "cloud"):
        rs = [r for r in res["cut"] if r["engine"] == engine]
        stop = [r["to_stop_ms"] for r in rs if r["to_stop_ms"] is not None]
        on = [r["to_handed_on_ms"] for r in rs]
        steps = [r["steps_after"] for r in rs if r["steps_after"] is not None]
        tail = f"; decode steps after: max {max(steps)}" if steps else ""
        missing = len(rs) - len(stop)
        left = f"; {missing} not closed" if missing else ""
        lines.append(f"  {engine:5}  {stats(stop)} | {stats(on)}{tail}{left}")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    path: Path = resolve_model(args.model, pull=True)
    rows = Rows()
    with (
        HybridServer(path, alias=ALIAS, api_key=API_KEY, n_ctx=1024) as server,
        FaultProxy(upstream=("127.0.0.1", server.port), faults=Faults()) as proxy,
    ):
        local = LlamaCppEngine(path, n_ctx=1024, n_threads=1, warm_up=False, use_tuning=False)
        cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
        async with HybridClient(local=local, cloud=cloud, router=None) as client:
            await client.complete("Hi.", engine="local", max_tokens=2)  # load the model
            for i in range(args.rounds):
                await ttft_round(rows, client, local, i)
                await cut_round(rows, client, local, proxy, i)
    res = {"cpu": cpu_model(), "rounds": args.rounds, "model": args.model}
    return res | {"ttft": rows.ttft, "cut": rows.cut}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--json", default=None)
    arguments = parser.parse_args()
    logger.remove()  # Pipecat logs every frame at DEBUG
    logger.add(sys.stderr, level="WARNING")
    report(anyio.run(main, arguments), render, arguments.json)
