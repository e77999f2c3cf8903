"""`hybridllm serve MODEL` (and `python -m hybridllm.server MODEL`): its arguments and runner."""

from __future__ import annotations

import argparse
import os


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a manifest name (see `hybridllm models list`) or a GGUF path")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--alias", help="the model name clients send (default: MODEL)")
    p.add_argument(
        "--api-key", help="demand `Authorization: Bearer KEY` (default: $HYBRIDLLM_SERVE_KEY)"
    )
    p.add_argument("--n-ctx", type=int, help="context size (default: the manifest's)")
    p.add_argument("--n-threads", type=int, help="llama.cpp threads (default: tuned or all cores)")
    p.add_argument(
        "--max-logprobs", type=int, default=20,
        help="the most top log-probabilities a request may ask for per position (default: 20, "
        "as vLLM; more lets speculative sampling decide positions with wide distributions)",
    )  # fmt: skip
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")


def run(args: argparse.Namespace) -> int:
    from hybridllm.engines.served import ServedModel
    from hybridllm.server.app import serve

    model = ServedModel(
        args.model, alias=args.alias, n_ctx=args.n_ctx, n_threads=args.n_threads,
        max_logprobs=args.max_logprobs,
    )  # fmt: skip
    api_key = args.api_key or os.environ.get("HYBRIDLLM_SERVE_KEY") or None
    serve(model, host=args.host, port=args.port, api_key=api_key, log_level=args.log_level)
    return 0
