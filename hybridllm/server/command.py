"""`hybridllm serve-model MODEL` (and `python -m hybridllm.server MODEL`): its arguments and runner.

Every argument is checked before the model loads or uvicorn starts (`check`): a bad one is one
`hybridllm.errors.ConfigError` naming it (the command prints one line and exits with 2): the
model a manifest name that is pulled or an existing GGUF file, `--port` 0 to 65535 and free on
`--host`, `--host` an address this machine resolves, `--n-ctx`, `--n-threads` and
`--max-logprobs` >= 1, `--log-level` one of uvicorn's, `--alias` and `--api-key` non-blank.
"""

from __future__ import annotations

import argparse
import os
import socket

from hybridllm import errors
from hybridllm.engines import validate

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


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
        "--max-logprobs",
        type=int,
        default=20,
        help="the most top log-probabilities a request may ask for per position (default: 20, "
        "as vLLM; more lets speculative sampling decide positions with wide distributions)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")


def check(args: argparse.Namespace) -> None:
    """Check every argument before any work (see the module); the first bad one raises."""
    from hybridllm.local.resolve import resolve_model

    validate.integer("--port", args.port, minimum=0, maximum=65535)
    for option, value in (("--n-ctx", args.n_ctx), ("--n-threads", args.n_threads)):
        if value is not None:
            validate.integer(option, value, minimum=1)
    validate.integer("--max-logprobs", args.max_logprobs, minimum=1)
    validate.one_of("--log-level", args.log_level, LOG_LEVELS)
    if args.alias is not None:
        validate.text("--alias", args.alias)
    if args.api_key is not None and not args.api_key.strip():
        raise errors.InvalidArgumentError("--api-key", "", "a non-blank key")  # never echoed
    resolve_model(args.model)  # ManifestError, ModelNotFoundError: unknown, not pulled, no file
    check_listen(args.host, args.port)


def check_listen(host: str, port: int) -> None:
    """`host` resolves and `port` is free there (bound and let go at once, as uvicorn binds)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError):
        raise errors.InvalidArgumentError(
            "--host", host, "an address or a host name this machine resolves"
        ) from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise errors.ConfigError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server holds "
                "it, or the address is not this machine's; choose another --port or --host)"
            ) from None


def run(args: argparse.Namespace) -> int:
    from hybridllm.engines.llama.served import ServedModel
    from hybridllm.server.app import serve

    check(args)
    model = ServedModel(
        args.model,
        alias=args.alias,
        n_ctx=args.n_ctx,
        n_threads=args.n_threads,
        max_logprobs=args.max_logprobs,
    )
    api_key = args.api_key or os.environ.get("HYBRIDLLM_SERVE_KEY") or None
    serve(model, host=args.host, port=args.port, api_key=api_key, log_level=args.log_level)
    return 0
