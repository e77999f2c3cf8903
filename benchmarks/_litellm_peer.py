"""LiteLLM's Router as the peer of `bench_quality_race.py`, driven by it one request at a time.

Run by the benchmark with LiteLLM's own interpreter (default /tmp/litellm-venv/bin/python); it
imports LiteLLM and nothing of hybridllm:

    python benchmarks/_litellm_peer.py --cloud URL/v1 --local URL/v1 --key KEY

Two deployments: "cloud" (`openai/cloud` at --cloud, the FaultProxy in front of the stand-in
cloud) and "local" (`openai/local` at --local, a llama.cpp server on the 0.5B model);
`fallbacks` cloud -> local, `num_retries = 0`, the cloud deployment's `stream_timeout` = the
request's deadline (one Router per deadline; the local deployment keeps a long timeout),
cooldowns as LiteLLM sets them by default. It writes "ready" once LiteLLM is imported, then
reads one JSON request a line on stdin ({"prompt", "max_tokens", "group": "cloud"|"local",
"timeout_s"}) and answers one JSON line on stdout: the TTFT at the client (the call to the
first non-empty content delta), the text, which deployment served (the stream's hidden
`model_id`; its `api_base` and the chunks' `model` are kept as cross-checks) and any error.
The benchmark sets the proxy's first-byte delay for request i before it writes request i, so
LiteLLM sees the same delays as hybridllm.
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


def quiet() -> None:
    """A failed request is a row of the benchmark's table, not an error log (stderr goes to a
    log file the benchmark keeps the tail of)."""
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def make_router(cloud: str, local: str, key: str, timeout_s: float) -> Router:
    # the deadline bounds the cloud's stream reads (its first byte, then each chunk); the local
    # fallback gets LiteLLM's own long timeout: a 1-thread llama.cpp server on these prompts
    # takes longer than the deadline to its first token, and a fallback that times out at the
    # deadline as well would answer nothing
    deployments = [("cloud", cloud, timeout_s), ("local", local, LOCAL_TIMEOUT_S)]
    model_list = [
        {
            "model_name": name,
            "litellm_params": {
                "model": f"openai/{name}",
                "api_base": base,
                "api_key": key,
                "stream_timeout": stream_timeout,
            },
            "model_info": {"id": name},
        }
        for name, base, stream_timeout in deployments
    ]
    return Router(
        model_list=model_list,
        fallbacks=[{"cloud": ["local"]}],
        num_retries=0,
        stream_timeout=timeout_s,
        timeout=LOCAL_TIMEOUT_S,
    )


async def one(router: Router, req: dict[str, Any], cloud: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    out: dict[str, Any] = {"served": None, "error": None}
    try:
        resp = await router.acompletion(
            model=req["group"],
            messages=[{"role": "user", "content": req["prompt"]}],
            stream=True,
            max_tokens=req["max_tokens"],
            temperature=0.0,
        )
        hidden = dict(getattr(resp, "_hidden_params", None) or {})
        models: set[str] = set()
        async for chunk in resp:
            if getattr(chunk, "model", None):
                models.add(str(chunk.model))
            choices = getattr(chunk, "choices", None) or []
            delta = getattr(choices[0].delta, "content", None) if choices else None
            if delta:
                if first is None:
                    first = time.perf_counter()
                parts.append(delta)
        hidden.update(getattr(resp, "_hidden_params", None) or {})
        model_id = hidden.get("model_id")
        api_base = str(hidden.get("api_base") or "")
        out["model_id"], out["api_base"], out["chunk_models"] = model_id, api_base, sorted(models)
        if model_id in ("cloud", "local"):
            out["served"] = model_id
        elif api_base:
            out["served"] = (
                "cloud" if api_base.rstrip("/").startswith(cloud.rstrip("/")) else "local"
            )
    except Exception as exc:  # the peer's failure is a row of the table, not a crash
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    out["ttft_ms"] = None if first is None else (first - t0) * 1e3
    out["total_ms"] = (time.perf_counter() - t0) * 1e3
    out["text"] = "".join(parts)
    return out


async def main(args: argparse.Namespace) -> None:
    routers: dict[float, Router] = {}
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            return
        req = json.loads(line)
        t = float(req["timeout_s"])
        if t not in routers:
            routers[t] = make_router(args.cloud, args.local, args.key, t)
            quiet()
        res = await one(routers[t], req, args.cloud)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--cloud", required=True, help="the cloud's OpenAI base URL (.../v1)")
    ap.add_argument("--local", required=True, help="the local server's OpenAI base URL")
    ap.add_argument("--key", default="sk-bench")
    asyncio.run(main(ap.parse_args()))
