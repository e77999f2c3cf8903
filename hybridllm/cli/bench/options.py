"""`hybridllm bench`'s options and the sizes of a run (light: the parser imports this module)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from hybridllm.cli.args import positive_int

DEFAULT_LOCAL_MODEL = "qwen2.5-coder-0.5b-instruct"
STANDIN_CLOUD_MODEL = "qwen2.5-coder-1.5b-instruct"  # as `hybridllm demo`'s stand-in
QUICK_STANDIN_CLOUD_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """How much a run measures. `lengths`: prompt sizes in tokens (the local model's count);
    `repeats`: requests per engine and length; `*_tokens`: output tokens asked for in each
    part; `concurrency`: cloud requests at once; `mixed_requests`: requests per strategy."""

    lengths: tuple[int, ...]
    repeats: int
    length_tokens: int
    concurrency: tuple[int, ...]
    concurrency_tokens: int
    mixed_requests: int
    n_ctx: int = 4096

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


QUICK = BenchConfig((50, 500, 1000), 1, 8, (1, 2, 4, 8), 16, 6)
DEFAULT = BenchConfig((50, 500, 2000), 1, 16, (1, 2, 4, 8), 24, 12)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer, shorter requests and a smaller stand-in cloud (about a minute)",
    )
    p.add_argument(
        "--local-model",
        metavar="NAME",
        help=f"local model name or GGUF path (default: {DEFAULT_LOCAL_MODEL})",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="CPU threads for each model (default: all)",
    )
    p.add_argument(
        "--cloud-url",
        metavar="URL",
        help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL; none: a stand-in "
        "cloud on 127.0.0.1)",
    )
    p.add_argument("--api-key", metavar="KEY", help="API key (default: $OPENAI_API_KEY)")
    p.add_argument(
        "--cloud-model",
        metavar="NAME",
        help="the cloud's model (for the stand-in: a local model name; default "
        f"{STANDIN_CLOUD_MODEL}, {QUICK_STANDIN_CLOUD_MODEL} with --quick)",
    )
    p.add_argument(
        "--policy",
        default="chat",
        metavar="NAME",
        help="the policy whose plan is the third strategy (default: chat)",
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    p.add_argument("--plots", metavar="DIR", help="write the PNG plots in this directory")
