"""More than one cloud (issue 44): a quality-routed policy over two clouds and the device,
against LiteLLM's Router with fallbacks a -> b -> local, on the same delays and failures.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_engines.py [--n 60] [--seed 5]
        [--clouds replay|live] [--cloud-model NAME] [--deadline-ms MS]
        [--litellm-python /tmp/litellm-venv/bin/python] [--variants hybridllm,litellm]
        [--json PATH]

Clouds "a" and "b" answer with the stand-in model (`hybridllm serve-model`, Qwen2.5-Coder-0.5B
by default, one thread) on CPU 1, off the device (the benchmark, its device engine and
LiteLLM's side run on CPU 0):
- `--clouds replay` (the default): the stand-in answers every prompt once, alone on its core,
  and two replay endpoints (`_replay_cloud.py`) serve those streams at their recorded pace,
  so a and b are two clouds whose compute is elsewhere, as two providers' is. A request the
  recording lacks (a continuation) goes to the stand-in live; the run prints how many did.
- `--clouds live`: two stand-in servers, each behind its own `FaultProxy`, sharing CPU 1 (a
  request on one slows the other, which two providers would not do).
Cloud a is heavy-tailed and failing: request i's first byte is held a delay drawn once per run
from `heavy_tail` (lognormal, median 150 ms, p99 3 s, 3% stalls of 10 s, seeded), and 10% of
the requests (seeded) are answered with HTTP 500 instead (replay: by the endpoint, per request;
live: by the proxy, on new connections only). Cloud b is healthy (no fault). The device:
SmolLM2-135M, one thread (`LlamaCppEngine` in process for hybridllm; a llama.cpp server,
`LlamaServer`, for LiteLLM): the last resort, a smaller and worse model.

hybridllm: `HybridClient(engines={"local", "a", "b"})`, policy `prefer = "a"`, `fallback_order
= ["a", "b", "local"]` (a quality decision: the device's engine is a held rescue), privacy off
(LiteLLM scans nothing; keep-local would keep the prompts naming a person on the device),
first-token deadline `--deadline-ms` (2 s by default: the stand-in's own TTFT on these prompts
is 1.2-1.5 s on 2 cores, so a 600 ms deadline would leave every answer to the device), no
retries.
LiteLLM (`benchmarks/_litellm_engines_peer.py`, run with `--litellm-python`; it never imports
hybridllm): deployments a, b, local, `fallbacks` a -> [b, local], `num_retries = 0`, the
clouds' `stream_timeout` = the deadline, the local one long. Both get 6 warm-up requests first
(their own delays, not counted).

`--cloud-model smollm2-135m-instruct`: the clouds on the device's own model, fast enough for a
600 ms deadline (the quality column then tells answered from not, not a model gap).

Prompts: `--n` short-answer prompts (multiple choice, yes/no, number, short phrase) from the
TEST split of data/router/labels.jsonl (`bench_cascade_mix.workload`), graded by the labeller's
`score()` (no answer: wrong); max_tokens per kind (8/8/12/24); temperature 0.

Reported per variant: who answered (a / b / local / none), the answers from a cloud, P50 and
P99 TTFT at the client over every request (an unanswered request never had a first token: its
TTFT is infinite, "never"; counting its time to the error would reward giving up) and over the
answered ones, the share graded right. Targets: at least as many cloud answers as LiteLLM, P99
at most 0.7x. `--report PATH` re-summarises the rows a `--json PATH` run wrote.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
API_KEY, ALIAS = "sk-bench", "cloud"
CLOUD, DEVICE = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
CLOUD_CPU, DEVICE_CPU = 1, 0  # the two clouds' core; this process's and its children's
DEADLINE_MS, FAIL_SHARE, WARMUPS = 2000.0, 0.10, 6  # --deadline-ms


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    from hybridllm.routing.hedging import quantile

    return quantile(sorted(xs), q / 100) if xs else math.nan


def workload(n: int, seed: int) -> dict[str, Any]:
    """The prompts (with their grader's items), and request i's fault on cloud a."""
    from benchmarks.bench_cascade_mix import KINDS, _labeller, workload as rows_of
    from hybridllm.testing.proxy import heavy_tail

    lab = _labeller()
    rows = rows_of(n + WARMUPS, seed, split="test")
    items = [
        lab.Item(r["source"], r["id"], r["prompt"], r["kind"], r["answer"], KINDS[r["kind"]])
        for r in rows
    ]
    rng = random.Random(seed)
    dist = heavy_tail(median_ms=150, p99_ms=3000, spike_probability=0.03, spike_ms=10_000)
    faults = [("500", 0.0) if rng.random() < FAIL_SHARE else ("delay", dist(rng)) for _ in items]
    return {"lab": lab, "items": items, "faults": faults}


def set_fault(cloud: Any, fault: tuple[str, float]) -> None:
    """Request i's fault on cloud a: a replay cloud's own (per request), or its proxy's."""
    from hybridllm.testing import Faults

    kind, delay = fault
    if isinstance(cloud, ReplayCloud):
        cloud.post("/replay/fault", {"status": 500} if kind == "500" else {"delay_ms": delay})
        return
    cloud.faults = Faults(http_status=500) if kind == "500" else Faults(first_byte_stall_ms=delay)


class ReplayCloud:
    """A `_replay_cloud.py` endpoint on `port`: its URL, its faults and counts."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def post(self, path: str, body: dict[str, Any]) -> Any:
        import urllib.request

        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def counts(self) -> dict[str, int]:
        import urllib.request

        with urllib.request.urlopen(self.url + "/replay/stats", timeout=5) as resp:
            counts: dict[str, int] = json.loads(resp.read())
            return counts


@contextlib.contextmanager
def two_clouds(w: dict[str, Any], cloud_model: str, mode: str) -> Iterator[tuple[Any, Any]]:
    """Clouds a and b behind their fault proxies: two live stand-ins (`--clouds live`) or two
    replays of one recording (`--clouds replay`, the default)."""
    with live_clouds(cloud_model) if mode == "live" else replay_clouds(w, cloud_model) as ab:
        yield ab


@contextlib.contextmanager
def replay_clouds(w: dict[str, Any], cloud_model: str) -> Iterator[tuple[Any, Any]]:
    """One stand-in server (one thread, CLOUD_CPU) answers every prompt once, alone; two replay
    endpoints (`_replay_cloud.py`, CLOUD_CPU) then serve those streams at their recorded pace:
    two clouds whose compute is elsewhere, as two providers' is, where two live stand-ins on one
    core slow each other (a request a replay never saw goes live). Cloud a's faults are the
    replay's own, per request (a proxy's HTTP faults hit only new connections, so a client that
    keeps its connection open would miss them)."""
    import anyio

    from benchmarks._replay_cloud import record

    bodies = [
        {
            "model": ALIAS,
            "messages": [{"role": "user", "content": it.prompt}],
            "max_tokens": it.max_tokens,
            "temperature": 0.0,
        }
        for it in w["items"]
    ]
    with (
        pinned_server(cloud_model) as upstream,
        tempfile.NamedTemporaryFile("w", suffix=".json") as rec,
    ):
        log(f"recording {len(bodies)} answers of the stand-in ({cloud_model}), alone on its core")
        rec.write(json.dumps(anyio.run(record, upstream.url, API_KEY, bodies)))
        rec.flush()
        with _replay(upstream.url, rec.name) as ra, _replay(upstream.url, rec.name) as rb:
            yield ReplayCloud(ra), ReplayCloud(rb)


@contextlib.contextmanager
def _replay(upstream: str, recording: str) -> Iterator[int]:
    """A `_replay_cloud.py` process on CLOUD_CPU; yields its port."""
    cmd = [
        "taskset",
        "-c",
        str(CLOUD_CPU),
        sys.executable,
        str(ROOT / "benchmarks" / "_replay_cloud.py"),
    ]
    cmd += ["--upstream", upstream, "--recording", recording]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"the replay cloud did not start: {line!r}")
        port = int(line.split()[1])
        _wait_ready(port)
        yield port
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        proc.kill()


def _wait_ready(port: int) -> None:
    import urllib.request

    for _ in range(200):
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/replay/stats", timeout=1).read()
            return
        time.sleep(0.05)
    raise RuntimeError("the replay cloud does not answer")


def replay_counts(cloud: Any) -> dict[str, int] | None:
    """How many requests a replay cloud replayed, sent live and failed (None for a live one)."""
    return cloud.counts() if isinstance(cloud, ReplayCloud) else None


def pinned_server(cloud_model: str) -> Any:
    """A stand-in server (one thread) on CLOUD_CPU: off the device, as real clouds are."""
    from hybridllm.local.resolve import resolve_model
    from hybridllm.testing import HybridServer

    class Pinned(HybridServer):
        def command(self, port: int) -> list[str]:
            return ["taskset", "-c", str(CLOUD_CPU), *super().command(port)]

    model = resolve_model(cloud_model, pull=True)
    return Pinned(model, alias=ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1)


@contextlib.contextmanager
def live_clouds(cloud_model: str = CLOUD) -> Iterator[tuple[Any, Any]]:
    """Two stand-in servers (one thread each), each behind a recording proxy: cloud a, cloud b
    (two processes: a request on one does not slow the other, as with two providers)."""
    from hybridllm.testing import FaultProxy

    with (
        pinned_server(cloud_model) as sa,
        pinned_server(cloud_model) as sb,
        FaultProxy(upstream=("127.0.0.1", sa.port), record=True) as a,
        FaultProxy(upstream=("127.0.0.1", sb.port), record=True) as b,
    ):
        yield a, b


# ---- hybridllm -----------------------------------------------------------------------------------


async def run_hybrid(
    w: dict[str, Any], a: Any, b: Any, deadline_ms: float, quality_weight_ms: float | None = None
) -> list[dict[str, Any]]:
    from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
    from hybridllm.errors import HybridError
    from hybridllm.local.resolve import resolve_model

    policy = Policy(
        name="two-clouds",
        routing={
            "prefer": "a",
            "fallback_order": ["a", "b", "local"],
            "ttft_deadline_ms": deadline_ms,
            "retries": 0,
        },
        sampling={"temperature": 0.0},
        # the price of a local answer in place of the cloud's (None: the policy's default)
        hedge={} if quality_weight_ms is None else {"quality_weight_ms": quality_weight_ms},
        # LiteLLM scans nothing: with the default keep-local, the 5 of 40 prompts naming a person
        # ("Barney is a cat", "Moby Dick") stay on the device, which is privacy, not routing
        privacy={"mode": "off"},
    )
    engines = {
        "local": LlamaCppEngine(resolve_model(DEVICE, pull=True), n_threads=1, n_ctx=2048),
        "a": OpenAIEngine(base_url=a.url + "/v1", api_key=API_KEY, model=ALIAS),
        "b": OpenAIEngine(base_url=b.url + "/v1", api_key=API_KEY, model=ALIAS),
    }
    rows: list[dict[str, Any]] = []
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        for i, (it, fault) in enumerate(zip(w["items"], w["faults"], strict=True)):
            set_fault(a, fault)
            t0 = time.perf_counter()
            first, parts, error = None, [], None
            s = client.stream(it.prompt, max_tokens=it.max_tokens)
            try:
                async with s:
                    async for tok in s:
                        if tok and first is None:
                            first = time.perf_counter()
                        parts.append(tok)
            except HybridError as exc:
                error = f"{type(exc).__name__}: {exc}"
            rows.append(_row(i, t0, first, "".join(parts), s.trace.engine, error, fault))
            rows[-1]["attempts"] = _attempts(s.trace)
            log(f"  [hybridllm] {i + 1}/{len(w['items'])} {_said(rows[-1])}")
    return rows[WARMUPS:]


def _attempts(trace: Any) -> list[str]:
    """Each engine stream the request started: engine, role, start / first / end (ms from the
    call) and how it ended, for reading a slow request back."""

    def ms(t: float | None) -> str:
        return "-" if t is None else f"{(t - trace.t_start) * 1e3:.0f}"

    return [
        f"{a.engine}/{a.role} {ms(a.t_start)}/{ms(a.t_first)}/{ms(a.t_end)} {a.outcome}"
        for a in trace.attempts
    ]


def _row(
    i: int,
    t0: float,
    first: float | None,
    text: str,
    served: str | None,
    error: str | None,
    fault: tuple[str, float],
) -> dict[str, Any]:
    return {
        "i": i,
        "ttft_ms": None if first is None else (first - t0) * 1e3,
        "total_ms": (time.perf_counter() - t0) * 1e3,
        "text": text,
        "served": served if text else None,
        "error": error,
        "fault": fault[0],
        "delay_ms": fault[1],
    }


def _said(r: dict[str, Any]) -> str:
    fault = "500" if r["fault"] == "500" else f"delay {r['delay_ms']:.0f} ms"
    ttft = "-" if r["ttft_ms"] is None else f"{r['ttft_ms']:.0f} ms"
    said = f"{r['served']} ttft {ttft} (a: {fault}){', ' + r['error'] if r['error'] else ''}"
    return said + (f" [{'; '.join(r['attempts'])}]" if r.get("attempts") else "")


# ---- LiteLLM -------------------------------------------------------------------------------------


def run_litellm(args: argparse.Namespace, w: dict[str, Any], a: Any, b: Any) -> list[dict]:
    from hybridllm.local.resolve import resolve_model
    from hybridllm.testing import LlamaServer

    device = resolve_model(DEVICE, pull=True)
    with LlamaServer(device, alias=ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1) as local:
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        env.pop("PYTHONPATH", None)
        peer_log = tempfile.TemporaryFile(mode="w+")
        cmd = [args.litellm_python, str(ROOT / "benchmarks" / "_litellm_engines_peer.py")]
        cmd += ["--a", a.url + "/v1", "--b", b.url + "/v1", "--local", local.base_url]
        cmd += ["--key", API_KEY, "--model", ALIAS, "--timeout-s", str(args.deadline_ms / 1000)]
        peer = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=peer_log, text=True,
            env=env, cwd="/",
        )  # fmt: skip
        assert peer.stdin is not None and peer.stdout is not None
        rows: list[dict[str, Any]] = []
        try:
            while (line := peer.stdout.readline()).strip() != "ready":
                if not line:
                    peer_log.seek(0)
                    raise RuntimeError(f"the LiteLLM peer did not start:\n{peer_log.read()}")
            for i, (it, fault) in enumerate(zip(w["items"], w["faults"], strict=True)):
                set_fault(a, fault)
                t0 = time.perf_counter()
                peer.stdin.write(json.dumps({"prompt": it.prompt, "max_tokens": it.max_tokens}))
                peer.stdin.write("\n")
                peer.stdin.flush()
                while not (line := peer.stdout.readline()).startswith("{"):
                    if not line:
                        raise RuntimeError("the LiteLLM peer exited")
                got = json.loads(line)
                first = None if got["ttft_ms"] is None else t0 + got["ttft_ms"] / 1e3
                row = _row(i, t0, first, got["text"], got["served"], got["error"], fault)
                rows.append(row)
                log(f"  [litellm] {i + 1}/{len(w['items'])} {_said(row)}")
        finally:
            peer.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                peer.wait(timeout=10)
            peer.kill()
            peer_log.close()
    return rows[WARMUPS:]


# ---- the table -----------------------------------------------------------------------------------


def summaries(runs: dict[str, list[dict[str, Any]]], w: dict[str, Any]) -> dict[str, Any]:
    """Each variant's summary, with the P99 TTFT over the requests every variant answered
    (like for like: the same prompts and faults)."""
    both = set.intersection(
        *({r["i"] for r in rows if r["ttft_ms"] is not None} for rows in runs.values())
    )
    out = {name: summarise(rows, w) for name, rows in runs.items()}
    for name, rows in runs.items():
        shared = [r["ttft_ms"] for r in rows if r["i"] in both]
        out[name]["p99_shared_ms"], out[name]["shared"] = pct(shared, 99), len(shared)
    return out


def summarise(rows: list[dict[str, Any]], w: dict[str, Any]) -> dict[str, Any]:
    items = w["items"][WARMUPS:]
    served = Counter(r["served"] or "none" for r in rows)
    right = sum(bool(r["text"]) and w["lab"].score(items[k], r["text"]) for k, r in enumerate(rows))
    # a request that got no answer never had a first token: its TTFT is infinite (counting its
    # time to the error instead would reward giving up); the answered ones' figures beside
    ttfts = [r["ttft_ms"] if r["ttft_ms"] is not None else math.inf for r in rows]
    answered = [t for t in ttfts if math.isfinite(t)]
    return {
        "n": len(rows),
        "served": dict(served),
        "cloud_answers": served["a"] + served["b"],
        "p50_ttft_ms": pct(ttfts, 50),
        "p99_ttft_ms": pct(ttfts, 99),
        "p99_answered_ms": pct(answered, 99),
        "right": right / len(rows),
        "errors": sum(r["error"] is not None for r in rows),
    }


def render(res: dict[str, Any]) -> str:
    head = (
        "| variant | a | b | local | none | cloud answers | P50 TTFT | P99 TTFT "
        "| P99 TTFT, answered | P99, answered by all | right |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in res["summary"].items():
        sv = s["served"]
        lines.append(
            f"| {name} | {sv.get('a', 0)} | {sv.get('b', 0)} | {sv.get('local', 0)} | "
            f"{sv.get('none', 0)} | {s['cloud_answers']}/{s['n']} | {_ms(s['p50_ttft_ms'])} | "
            f"{_ms(s['p99_ttft_ms'])} | {_ms(s['p99_answered_ms'])} | "
            f"{_ms(s['p99_shared_ms'])} ({s['shared']}) | {s['right']:.0%} |"
        )
    summ = res["summary"]
    if {"hybridllm", "litellm"} <= set(summ):
        keys = (
            ("p99_ttft_ms", "P99 TTFT"),
            ("p99_answered_ms", "answered"),
            ("p99_shared_ms", "answered by all"),
        )
        for key, what in keys:
            ours, theirs = summ["hybridllm"][key], summ["litellm"][key]
            ratio = ours / theirs if math.isfinite(theirs) else 0.0
            lines.append(f"{what} hybridllm / LiteLLM: {ratio:.2f}x (target <= 0.7x)")
        lines.append("(an unanswered request has no first token: its TTFT is infinite)")
    return "\n".join(lines)


def _ms(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:.0f} ms"


def main(args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    sys.path.insert(0, str(ROOT))
    from benchmarks._report import cpu_model

    os.sched_setaffinity(0, {DEVICE_CPU})  # the device (and LiteLLM's side) on the other core
    w = workload(args.n, args.seed)
    faults = Counter(f[0] for f in w["faults"][WARMUPS:])
    log(f"{args.n} prompts; cloud a: {faults['500']} HTTP 500s, the rest heavy-tailed delays")
    res: dict[str, Any] = {"n": args.n, "seed": args.seed, "cpu": cpu_model(), "runs": {}}
    res["deadline_ms"], res["cloud_model"] = args.deadline_ms, args.cloud_model
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    res["clouds"], res["quality_weight_ms"] = args.clouds, args.quality_weight_ms
    with two_clouds(w, args.cloud_model, args.clouds) as (a, b):
        if "hybridllm" in wanted:
            run = (w, a, b, args.deadline_ms, args.quality_weight_ms)
            res["runs"]["hybridllm"] = anyio.run(run_hybrid, *run)
            res["replay_hybridllm"] = [replay_counts(a), replay_counts(b)]
        if "litellm" in wanted:
            res["runs"]["litellm"] = run_litellm(args, w, a, b)
        res["replay_all"] = [replay_counts(a), replay_counts(b)]
    res["summary"] = summaries(res["runs"], w)
    return res


def cli() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--deadline-ms", type=float, default=DEADLINE_MS)
    ap.add_argument("--cloud-model", default=CLOUD, help=f"the clouds' model (default {CLOUD})")
    ap.add_argument(
        "--clouds", choices=("replay", "live"), default="replay",
        help="replay: one stand-in's recorded streams, replayed at their pace (the default); "
        "live: two stand-ins sharing one core",
    )  # fmt: skip
    ap.add_argument(
        "--quality-weight-ms", type=float, default=None,
        help="the policy's [hedge] quality_weight_ms (default: the policy's own, 10000)",
    )  # fmt: skip
    ap.add_argument("--litellm-python", default="/tmp/litellm-venv/bin/python")
    ap.add_argument("--variants", default="hybridllm,litellm")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--report", help="re-summarise the rows a --json run wrote (runs nothing)")
    args = ap.parse_args()
    if args.report:
        res = json.loads(Path(args.report).read_text())
        w = workload(res["n"], res["seed"])
        res["summary"] = summaries(res["runs"], w)
        args.deadline_ms, args.cloud_model = res["deadline_ms"], res["cloud_model"]
    else:
        res = main(args)
    head = f"CPU: {res['cpu']}; n = {res['n']}, seed {res['seed']}"
    clouds = f"{res.get('clouds', 'live')} {args.cloud_model}"
    print(f"{head}, deadline {args.deadline_ms:.0f} ms, clouds: {clouds}")
    if res.get("replay_all"):
        print(f"replay clouds a, b (replayed / live): {res['replay_all']}")
    print(render(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    cli()
