"""Handoff benchmark: TTFT and total time of 256-token answers, handoff against cloud-only and
local-only, where the local engine decodes slower than the cloud.

    PYTHONPATH=$PWD python benchmarks/bench_handoff.py [--n 2] [--quick] [--after 4]
        [--server serve|llama-cpp] [--continuation continue_final_message|instruction]
        [--warm|--no-warm] [--json PATH]

How the cloud is made faster per token: the stand-in cloud is a real server on loopback serving
SmolLM2-135M (one thread): `hybridllm serve-model` by default (`--server llama-cpp`:
llama_cpp.server),
the local engine is Qwen2.5-Coder-0.5B through llama-cpp-python (one thread): SmolLM2 decodes
about twice as fast per token as Qwen 0.5B on the same core. Both engines share this machine's
2 cores (one thread each): a real device and a real cloud would not.

Each round runs three plans, greedy, max_tokens 256: the local engine only (`engine="local"`),
the cloud only (`engine="cloud"`), and `plan="handoff"` (the local engine's first `--after`
tokens, then the cloud continues). Every call has its own prompt (a count to 500 from a
different number, which comes first), so neither engine has it in its KV cache past the chat
template's start: each reads the question cold in every plan, as it would a new one. `--warm`
(default; `--no-warm`): the policy's `handoff_warm_cloud`, one token of the prompt asked of
the cloud at once so that only the delivered text is left to read at the seam. The cloud's
end-of-text tokens are banned (`FULL_LENGTH`, OpenAI's logit_bias) so that every answer has 256
tokens. `--continuation`: how
the cloud is asked to continue (`OpenAIEngine(continuation=)`): "continue_final_message" (vLLM's
parameter; the cloud continues the delivered text) or "instruction" (a new turn asking it to go
on; SmolLM2 tends to restart the answer). TTFT and total time (call to the last token) are
measured in the app; the handoff row also says where the time went: when the cloud was asked
(the local part), the seam (asked to the cloud's first token) and the decode time per token.
Targets (issue 15): TTFT within 20 ms of local-only, total time within 10% of cloud-only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import anyio

from benchmarks._report import report
from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, OpenAIOptions, Policy, Token
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import HybridServer, LlamaServer

API_KEY, ALIAS = "sk-bench", "cloud"
# the number that differs comes first: the rest of the prompt is read cold (not a cached prefix)
PROMPT = "From {start}, count up to 500, separated by commas. Do not stop early."
MAX_TOKENS = 256
# SmolLM2 (the stand-in cloud) stops counting early: its end-of-text ids (<|endoftext|> 0,
# <|im_start|> 1, <|im_end|> 2) are banned so that every answer runs to 256 tokens and the
# total times compare like with like (the local engine ignores OpenAIOptions)
FULL_LENGTH = OpenAIOptions(extra_body={"logit_bias": {"0": -100, "1": -100, "2": -100}})


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def one(client: HybridClient, start: int, **kw: object) -> dict[str, object]:
    prompt = PROMPT.format(start=start)
    t0 = time.perf_counter()
    first = last = None
    who: list[str] = []
    text: list[str] = []
    gap = 0.0
    async with client.stream(prompt, options=[FULL_LENGTH], **kw) as s:  # type: ignore[arg-type]
        async for e in s.events():
            if isinstance(e, Token):
                now = time.perf_counter()
                if who and who[-1] != e.engine and last is not None:
                    gap = now - last  # the pause at the seam, as the app felt it
                first = first or now
                last = now
                who.append(e.engine)
                text.append(e.text)
    tr = s.trace
    assert first is not None and last is not None, tr.error
    # where the time goes: the local part (call to the cloud being asked), the seam (asked to
    # the cloud's first token), and each engine's decode time per token
    rec = tr.handoff
    asked = None if rec is None else (rec.asked_t - t0) * 1e3
    switched = None if rec is None or rec.switched_t is None else (rec.switched_t - t0) * 1e3
    n_cloud = who.count("cloud")
    tail_from = switched if switched is not None else (first - t0) * 1e3
    tail_n = n_cloud if switched is not None else len(who)
    return {
        "asked_ms": asked,
        "switched_ms": switched,
        "seam_ms": None if asked is None or switched is None else switched - asked,
        # ms per token after the first token of the serving part (decode speed)
        "tail_tpot_ms": ((last - t0) * 1e3 - tail_from) / max(1, tail_n - 1),
        "ttft_ms": (first - t0) * 1e3,
        "total_ms": (last - t0) * 1e3,
        "tokens": len(who),
        "local_tokens": who.count("local"),
        "cloud_tokens": who.count("cloud"),
        "seam_gap_ms": gap * 1e3,
        "handoff": None if tr.handoff is None else tr.handoff.outcome,
        # the text around the seam (local part | cloud part), for a person to read
        "seam": None
        if tr.handoff is None
        else "".join(text)[: tr.handoff.local_chars]
        + " | "
        + "".join(text)[tr.handoff.local_chars :][:40],
        "error": tr.error,
    }


async def main(args: argparse.Namespace) -> dict[str, object]:
    n = args.n or (1 if args.quick else 2)
    local_path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    cloud_path = resolve_model("smollm2-135m-instruct", pull=True)
    pol = Policy(
        name="bench",
        routing={"prefer": "local", "retries": 0},
        sampling={"max_tokens": MAX_TOKENS, "temperature": 0},
        handoff={"after_tokens": args.after, "warm_cloud": args.warm},
    )
    runs: dict[str, list[dict[str, object]]] = {"local only": [], "cloud only": [], "handoff": []}
    server = HybridServer if args.server == "serve" else LlamaServer
    with server(cloud_path, alias=ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1) as srv:
        cloud = OpenAIEngine(
            base_url=srv.url + "/v1", api_key=API_KEY, model=ALIAS, continuation=args.continuation
        )
        local = LlamaCppEngine(local_path, n_ctx=2048, n_threads=1)
        starts = iter(range(2, 500))  # a new prompt for every call
        async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
            for engine in ("local", "cloud"):  # warm both (connections, the template's start)
                await client.complete(PROMPT.format(start=1), engine=engine, max_tokens=4)
            for i in range(n):
                for name, kw in (
                    ("local only", {"engine": "local"}),
                    ("cloud only", {"engine": "cloud"}),
                    ("handoff", {"plan": "handoff"}),
                ):
                    if args.only and args.only != name:
                        continue
                    r = await one(client, next(starts), **kw)
                    runs[name].append(r)
                    log(f"  round {i + 1} {name}: {r}")
    table = []
    for name, rs in runs.items():
        if not rs:
            continue
        table.append(
            {
                "plan": name,
                "n": len(rs),
                "ttft_ms": statistics.median(float(r["ttft_ms"]) for r in rs),  # type: ignore[arg-type]
                "total_ms": statistics.median(float(r["total_ms"]) for r in rs),  # type: ignore[arg-type]
                "tokens": statistics.median(int(r["tokens"]) for r in rs),  # type: ignore[call-overload]
                "asked_ms": _median(rs, "asked_ms"),
                "seam_ms": _median(rs, "seam_ms"),
                "tail_tpot_ms": _median(rs, "tail_tpot_ms"),
            }
        )
    return {
        "n": n, "after": args.after, "warm": args.warm, "server": args.server,
        "continuation": args.continuation,
        "table": table, "runs": runs,
    }  # fmt: skip


def _median(rs: list[dict[str, object]], key: str) -> float | None:
    xs = [float(r[key]) for r in rs if r.get(key) is not None]  # type: ignore[arg-type]
    return statistics.median(xs) if xs else None


def _ms(x: object) -> str:
    return "-" if x is None else f"{x:.0f}" if isinstance(x, float) else str(x)


def render(res: dict[str, object]) -> str:
    table = res["table"]
    assert isinstance(table, list)
    rows = {r["plan"]: r for r in table}
    lines = [
        f"cloud: {res['server']}, continuation: {res['continuation']}, after {res['after']} "
        f"tokens, warm cloud: {res['warm']}",
        f"{'plan':12} {'n':>2} {'TTFT ms':>8} {'total ms':>9} {'tokens':>6} {'asked':>6} "
        f"{'seam':>5} {'ms/tok':>6}  (medians; asked: call to the cloud asked; seam: asked to "
        "its first token; ms/tok: the serving part's decode)",
    ]
    for r in table:
        lines.append(
            f"{r['plan']:12} {r['n']:>2} {r['ttft_ms']:>8.0f} {r['total_ms']:>9.0f} "
            f"{r['tokens']:>6.0f} {_ms(r['asked_ms']):>6} {_ms(r['seam_ms']):>5} "
            f"{r['tail_tpot_ms']:>6.1f}"
        )
    if len(rows) < 3:
        return "\n".join(lines)
    h, lo, cl = rows["handoff"], rows["local only"], rows["cloud only"]
    lines.append(
        f"handoff TTFT - local-only TTFT: {h['ttft_ms'] - lo['ttft_ms']:+.0f} ms (target <= 20); "
        f"handoff total / cloud-only total: {h['total_ms'] / cl['total_ms']:.2f} (target <= 1.10)"
    )
    return "\n".join(lines)


def cli() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--n", type=int, default=None, help="rounds (default 2)")
    ap.add_argument("--quick", action="store_true", help="one round")
    ap.add_argument("--after", type=int, default=4, help="handoff_after_tokens")
    ap.add_argument(
        "--warm", action=argparse.BooleanOptionalAction, default=True,
        help="handoff_warm_cloud: one token of the prompt asked of the cloud at once",
    )  # fmt: skip
    ap.add_argument("--server", choices=("serve", "llama-cpp"), default="serve")
    ap.add_argument(
        "--continuation",
        choices=("continue_final_message", "instruction"),
        default="continue_final_message",
    )
    ap.add_argument("--only", default="", help='one plan: "local only", "cloud only", "handoff"')
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON here")
    args = ap.parse_args()
    res = anyio.run(main, args)
    report(res, render, args.json)


if __name__ == "__main__":
    cli()
