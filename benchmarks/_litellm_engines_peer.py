"""LiteLLM's Router with three deployments, the peer of `bench_engines.py`, driven one request
at a time (run with LiteLLM's own interpreter; it imports LiteLLM and nothing of hybridllm):

    python benchmarks/_litellm_engines_peer.py --a URL/v1 --b URL/v1 --local URL/v1 --key KEY
        --timeout-s 0.6

Deployments "a" and "b" (the two clouds, each behind its FaultProxy) and "local" (a llama.cpp
server); `fallbacks` a -> [b, local], `num_retries = 0`, the clouds' `stream_timeout` = the
deadline (the local deployment keeps a long one, or the fallback itself times out). It writes
"ready", then reads one JSON request a line ({"prompt", "max_tokens"}) and answers one JSON
line: the TTFT at the client, the text, the deployment that served (the stream's hidden
`model_id`) and any error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the network

import litellm  # noqa: E402
from litellm import Router  # noqa: E402

litellm.telemetry = False
litellm.suppress_debug_info = True
LOCAL_TIMEOUT_S = 120.0


def make_router(args: argparse.Namespace) -> Router:
    deployments = [
        ("a", args.a, args.timeout_s),
        ("b", args.b, args.timeout_s),
        ("local", args.local, LOCAL_TIMEOUT_S),
    ]
    model_list = [
        {
            "model_name": name,
            "litellm_params": {
                "model": f"openai/{args.model}",  # the one alias the stand-in serves
                "api_base": base,
                "api_key": args.key,
                "stream_timeout": timeout,
            },
            "model_info": {"id": name},
        }
        for name, base, timeout in deployments
    ]
    return Router(
        model_list=model_list,
        fallbacks=[{"a": ["b", "local"]}],
        num_retries=0,
        stream_timeout=args.timeout_s,
        timeout=LOCAL_TIMEOUT_S,
    )


async def one(router: Router, req: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    out: dict[str, Any] = {"served": None, "error": None}
    try:
        resp = await router.acompletion(
            model="a",
            messages=[{"role": "user", "content": req["prompt"]}],
            stream=True,
            max_tokens=req["max_tokens"],
            temperature=0.0,
        )
        async for chunk in resp:
            choices = getattr(chunk, "choices", None) or []
            delta = getattr(choices[0].delta, "content", None) if choices else None
            if delta:
                if first is None:
                    first = time.perf_counter()
                parts.append(delta)
        hidden = dict(getattr(resp, "_hidden_params", None) or {})
        out["served"] = hidden.get("model_id")
    except Exception as exc:  # a failed request is a row of the table
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    out["ttft_ms"] = None if first is None else (first - t0) * 1e3
    out["text"] = "".join(parts)
    return out


async def main(args: argparse.Namespace) -> None:
    router = make_router(args)
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            return
        print(json.dumps(await one(router, json.loads(line))), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    for flag in ("--a", "--b", "--local"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--key", default="sk-bench")
    ap.add_argument("--model", default="cloud", help="the model name each deployment sends")
    ap.add_argument("--timeout-s", type=float, default=0.6)
    asyncio.run(main(ap.parse_args()))
