"""`hybridllm bench`: latency figures of this machine's local model and a cloud endpoint.

    hybridllm bench --quick --json bench.json --plots bench/   # about a minute
    hybridllm bench                                           # a few minutes on 2 cores
    hybridllm bench --cloud-url https://api.openai.com/v1 --cloud-model gpt-4o-mini

Four parts, each measured through a `HybridClient` (so it measures what the SDK reports): TTFT
against input length per engine (with the local prefill floor, prompt tokens / measured prefill
rate), TPOT and throughput against concurrency on the cloud, total time against TTFT + TPOT x
tokens, and the TTFT distribution of each routing strategy (cloud only, local only, the
policy's plan) on a mixed workload. Without an endpoint, a stand-in cloud (`hybridllm serve-model`)
runs on 127.0.0.1 for the length of the run.

Modules: `options` (the options, the sizes of a run), `workload` (the prompts), `measure` (the
parts), `results` (typed results, JSON, tables), `machine` (what it ran on), `plots` (PNGs),
`runner` (the command).
"""

from __future__ import annotations

import argparse


def run_bench(args: argparse.Namespace) -> int:
    """The `hybridllm bench` command."""
    from hybridllm.cli.bench.runner import run_bench as run

    return run(args)
