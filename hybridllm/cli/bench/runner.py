"""`hybridllm bench` from end to end: the engines (a stand-in cloud where no endpoint is
given), the parts measured with progress bars, then the tables, the JSON and the plots."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from rich.console import Console

from hybridllm.cli.bench import results as tables
from hybridllm.cli.bench.machine import MachineInfo, ModelInfo, describe, quantization
from hybridllm.cli.bench.measure import Measure
from hybridllm.cli.bench.options import (
    DEFAULT,
    DEFAULT_LOCAL_MODEL,
    QUICK,
    QUICK_STANDIN_CLOUD_MODEL,
    STANDIN_CLOUD_MODEL,
    BenchConfig,
)
from hybridllm.cli.bench.results import BenchResults
from hybridllm.cli.bench.workload import Counter
from hybridllm.cli.progress import StepBar
from hybridllm.client import HybridClient
from hybridllm.engines import LlamaCppEngine, OpenAIEngine
from hybridllm.errors import InvalidArgumentError
from hybridllm.local import resolve, waitpolicy
from hybridllm.policy import PolicyCache
from hybridllm.telemetry import Telemetry
from hybridllm.testing.hybrid_server import HybridServer
from hybridllm.testing.server import free_port

WARM_UP = "This is a warm-up request. Reply with the single word OK and nothing else, please."


@dataclass(frozen=True, slots=True)
class Setup:
    """What one run measures with: its sizes, the local model, the cloud endpoint."""

    config: BenchConfig
    threads: int
    local_model: str
    cloud_url: str | None  # None: a stand-in cloud
    api_key: str | None
    cloud_model: str | None
    policy: str


def setup_of(args: argparse.Namespace) -> Setup:
    """The run's setup from the options; a bad combination is a typed error before any work."""
    url = args.cloud_url or os.environ.get("OPENAI_BASE_URL") or None
    key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    if args.api_key and url is None:
        raise InvalidArgumentError(
            "--api-key",
            "<hidden>",
            "given with --cloud-url or $OPENAI_BASE_URL (without them a stand-in cloud runs)",
        )
    PolicyCache().get(args.policy)  # an unknown policy fails now, not after loading models
    if args.plots:
        from hybridllm.cli.plotting import pyplot

        pyplot("hybridllm bench --plots")  # matplotlib missing: say so before measuring
    standin = QUICK_STANDIN_CLOUD_MODEL if args.quick else STANDIN_CLOUD_MODEL
    return Setup(
        QUICK if args.quick else DEFAULT,
        args.threads or os.cpu_count() or 1,
        args.local_model or DEFAULT_LOCAL_MODEL,
        url,
        key if url else None,
        args.cloud_model or (None if url else standin),
        args.policy,
    )


def run_bench(args: argparse.Namespace) -> int:
    """The `hybridllm bench` command (see `hybridllm.cli.bench`)."""
    setup = setup_of(args)
    err = Console(stderr=True)
    t0 = time.perf_counter()
    if setup.cloud_url is None:
        # the stand-in cloud and the local engine share these cores: threads that spin while
        # they wait would slow each other down many times over (as `hybridllm demo`)
        os.environ.setdefault(waitpolicy.ENV, "PASSIVE")
    with _cloud(setup, err) as (cloud, cloud_info):
        local = LlamaCppEngine(
            setup.local_model, n_threads=setup.threads, n_ctx=setup.config.n_ctx, pull=True
        )
        local_info = ModelInfo(
            setup.local_model,
            quantization(setup.local_model),
            f"llama.cpp in-process, {setup.threads} threads",
        )
        machine = describe(local_info, cloud_info)
        results = anyio.run(_measure, setup, machine, local, cloud, err, t0)
    _report(results, args)
    return 0


@contextlib.contextmanager
def _cloud(setup: Setup, err: Console) -> Iterator[tuple[OpenAIEngine, ModelInfo]]:
    """The cloud engine: the given endpoint, or a stand-in served on 127.0.0.1 for the run."""
    if setup.cloud_url is not None:
        engine = OpenAIEngine(
            base_url=setup.cloud_url, api_key=setup.api_key, model=setup.cloud_model
        )
        yield engine, ModelInfo(engine.model, None, setup.cloud_url)
        return
    name = setup.cloud_model or STANDIN_CLOUD_MODEL
    path = resolve.resolve_model(name, pull=True)
    port = free_port()
    server = HybridServer(
        path, alias=name, n_ctx=setup.config.n_ctx, port=port, n_threads=setup.threads
    )
    with err.status(f"starting the stand-in cloud ({name} on 127.0.0.1:{port})"):
        server.start()
    try:
        engine = OpenAIEngine(base_url=server.base_url, api_key="none", model=server.model)
        where = f"stand-in cloud: hybridllm serve-model on 127.0.0.1, {setup.threads} threads"
        yield engine, ModelInfo(name, quantization(name), where)
    finally:
        server.stop()


async def _measure(
    setup: Setup,
    machine: MachineInfo,
    local: LlamaCppEngine,
    cloud: OpenAIEngine,
    err: Console,
    t0: float,
) -> BenchResults:
    client = HybridClient(local=local, cloud=cloud, telemetry=Telemetry(window_s=7 * 86400.0))
    async with client:
        prefill_tps = local.prefill_tps
        decode_ms = None if local.tpot_s is None else local.tpot_s * 1000.0
        with err.status("warming up both engines"):
            await client.complete(WARM_UP, engine="local", max_tokens=4, temperature=0.0)
            await client.complete(WARM_UP, engine="cloud", max_tokens=4, temperature=0.0)
        bar = StepBar("bench")
        try:
            measure = Measure(client, setup.config, _counter(local), bar)
            inputs = await measure.input_lengths()
            conc, points = await measure.concurrency()
            mixed, runs = await measure.strategies(setup.policy)
        finally:
            bar.close()
    return BenchResults(
        machine,
        setup.config,
        prefill_tps,
        decode_ms,
        [*inputs, *conc, *mixed],
        points,
        runs,
        time.perf_counter() - t0,
    )


def _counter(local: LlamaCppEngine) -> Counter:
    def count(text: str) -> int:
        return local.count_tokens([{"role": "user", "content": text}]) or len(text) // 4

    return count


def _report(results: BenchResults, args: argparse.Namespace) -> None:
    out = Console(file=sys.stdout, width=120)
    out.print(f"[bold]hybridllm bench[/bold]  {results.machine.caption()}", highlight=False)
    for table in (
        tables.input_table(results),
        tables.concurrency_table(results),
        tables.strategy_table(results),
    ):
        out.print(table)
    out.print(tables.check_line(results), highlight=False)
    out.print(f"took {results.elapsed_s:.0f} s", highlight=False)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results.to_dict(), indent=2) + "\n", encoding="utf-8")
        out.print(f"wrote {path}", highlight=False)
    if args.plots:
        from hybridllm.cli.bench.plots import write_plots

        for written in write_plots(results, Path(args.plots)):
            out.print(f"wrote {written}", highlight=False)
