"""The benchmark's parts, each a run of requests through a `HybridClient`: every figure is what
the SDK reports (each request's trace; the percentiles of `client.stats()`, its aggregator
swapped for a fresh one at the start of each part so a part's report holds that part only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from hybridllm.cli.bench.options import BenchConfig
from hybridllm.cli.bench.results import ConcurrencyPoint, Part, Sample, StrategyRun
from hybridllm.cli.bench.workload import Counter, mixed, sized_prompt
from hybridllm.client import HybridClient
from hybridllm.events import EngineName
from hybridllm.telemetry.stats import Stats

Progress = Callable[[str, int, int], None]  # (what, done, total), as `cli.progress.StepBar`
CONCURRENCY_PROMPT_TOKENS = 50
# strategy name -> the engine it forces (None: the policy's plan decides)
STRATEGIES: tuple[tuple[str, EngineName | None], ...] = (
    ("cloud only", "cloud"),
    ("local only", "local"),
)


class Measure:
    """Runs the parts on an open client; `count` sizes prompts in the local model's tokens."""

    def __init__(
        self, client: HybridClient, config: BenchConfig, count: Counter, progress: Progress
    ) -> None:
        self.client, self.config, self.count, self.progress = client, config, count, progress
        self._number = 0

    def prompt(self, tokens: int) -> str:
        """A fresh prompt of about `tokens` tokens (a new request number: no cached prefix)."""
        self._number += 1
        return sized_prompt(tokens, self._number, self.count)

    def _fresh_stats(self) -> None:
        self.client.telemetry.stats = Stats(window_s=7 * 86400.0, buckets=1)

    async def one(
        self, part: Part, label: str, prompt: str, concurrency: int = 1, **args: Any
    ) -> Sample:
        """Stream one request to its end, as an app would, and keep its trace's figures."""
        async with self.client.stream(prompt, **args) as stream:
            async for _ in stream.events():
                pass
        return Sample.of(part, label, stream.trace, concurrency)

    async def input_lengths(self) -> list[Sample]:
        """TTFT against input length, per engine, one request after another."""
        engines = [e for e in ("local", "cloud") if e in self.client.engines]
        plan = [(e, n) for n in self.config.lengths for e in engines]
        plan = [p for p in plan for _ in range(self.config.repeats)]
        out: list[Sample] = []
        for i, (engine, tokens) in enumerate(plan):
            self.progress("TTFT vs input length", i, len(plan))
            prompt = self.prompt(tokens)
            out.append(
                await self.one(
                    "input", engine, prompt, engine=engine, max_tokens=self.config.length_tokens
                )
            )
        self.progress("TTFT vs input length", len(plan), len(plan))
        return out

    async def concurrency(self) -> tuple[list[Sample], list[ConcurrencyPoint]]:
        """`c` cloud requests at once for each level `c`: TPOT and total throughput."""
        levels = self.config.concurrency
        samples: list[Sample] = []
        points: list[ConcurrencyPoint] = []
        total = sum(levels)
        for i, level in enumerate(levels):
            self.progress("cloud concurrency", sum(levels[:i]), total)
            self._fresh_stats()
            batch, wall_s = await self._batch(level)
            report = self.client.stats()
            samples += batch
            tokens = sum(s.output_tokens for s in batch)
            overall = report.overall
            points.append(
                ConcurrencyPoint(level, wall_s, tokens, overall.tpot_ms.p50, overall.ttft_ms.p50)
            )
        self.progress("cloud concurrency", total, total)
        return samples, points

    async def _batch(self, level: int) -> tuple[list[Sample], float]:
        prompts = [self.prompt(CONCURRENCY_PROMPT_TOKENS) for _ in range(level)]
        out: list[Sample] = []

        async def run(prompt: str) -> None:
            out.append(
                await self.one(
                    "concurrency",
                    "cloud",
                    prompt,
                    level,
                    engine="cloud",
                    max_tokens=self.config.concurrency_tokens,
                )
            )

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for prompt in prompts:
                tg.start_soon(run, prompt)
        return out, time.perf_counter() - t0

    async def strategies(self, policy: str) -> tuple[list[Sample], list[StrategyRun]]:
        """The mixed workload under each strategy, one request after another."""
        strategies = [s for s in STRATEGIES if s[1] in self.client.engines]
        strategies.append((f"policy {policy}", None))
        n = self.config.mixed_requests
        samples: list[Sample] = []
        runs: list[StrategyRun] = []
        for k, (name, engine) in enumerate(strategies):
            self._fresh_stats()
            for i, request in enumerate(mixed(n, self.config.concurrency_tokens / 32)):
                self.progress("mixed workload", k * n + i, n * len(strategies))
                args: dict[str, Any] = {"engine": engine} if engine else {"policy": policy}
                prompt = self.prompt(request.input_tokens)
                samples.append(
                    await self.one("mixed", name, prompt, max_tokens=request.max_tokens, **args)
                )
            runs.append(StrategyRun(name, self.client.stats().overall))
        self.progress("mixed workload", n * len(strategies), n * len(strategies))
        return samples, runs
