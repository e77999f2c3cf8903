"""Route for quality, race for latency (issue 25): does the first token undo the decision?

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_quality_race.py [--n 100] [--quick]
        [--old-root /work/wt/old] [--litellm-python /tmp/litellm-venv/bin/python]
        [--variants cloud,new,old,litellm] [--seed 3] [--json PATH] [--reuse PATH]

`--quick`: 8 prompts, 5 cloud warm-ups. One run compares, on the same prompts and the same
seeded cloud delays:

- "new": this tree's hybridllm (the rules of issue 25: `Decision.objective`, a quality
  decision's local backup held as a rescue until `Decision.release_s`, deadline misses judged
  over 5 outcomes, ...);
- "old": today's rules, the tree at `--old-root` (commit 2d555e5): this same script, run as a
  subprocess with `PYTHONPATH=<old-root>` (and its working directory there, so the cloud server
  it starts is the old code too) and `--variant-only old --spec IN --json OUT`; the parent
  merges its rows. Every hybridllm variant (and the cloud-only pass) runs that way, in its own
  process with its own servers;
- "litellm": LiteLLM's Router (`benchmarks/_litellm_peer.py`, run with `--litellm-python`; it
  never imports hybridllm): deployments "cloud" (`openai/cloud`, the FaultProxy URL) and "local"
  (a llama.cpp server, `hybridllm.testing.LlamaServer`, on the 0.5B model), `fallbacks` cloud ->
  local, `num_retries = 0`, the cloud deployment's `stream_timeout` = the deadline (the local
  deployment keeps a long one, or the fallback itself times out). `stream_timeout` bounds each
  read: a cloud whose response headers come before the deadline and its first token after it
  fails mid-stream, past the Router's fallback (an error row, no answer).

Engines: local Qwen2.5-Coder-0.5B (`LlamaCppEngine` in process for hybridllm; the llama.cpp
server for LiteLLM), one thread; the cloud is Qwen2.5-Coder-1.5B behind `hybridllm serve-model`
(`HybridServer`) on loopback, one thread, behind a `FaultProxy` that delays each response's
first byte: request i gets delay i in every variant (set on the proxy before the request is
sent), drawn once per run from `heavy_tail` (lognormal, median 150 ms, p99 3 s, 3% stalls of
10 s, seeded). Both engines share the machine's cores (2 here), one thread each; `--pin` gives
the stand-in cloud a core of its own (CPU 1) and runs everything else on the other (CPU 0), as
a cloud off the device would be (the cloud-only pass too).

Prompts: `--n` short-answer prompts (multiple choice, yes/no, number, short phrase) from the
TEST split of data/router/labels.jsonl (`bench_cascade_mix.workload`), graded by the labeller's
`score()`; max_tokens per kind as bench_cascade_mix (8/8/12/24); temperature 0.

Policies (a row group each): "chat", the shipped preset (router, `target_cloud_share` 0.3,
deadline 500 ms, auto hedge, handoff; temperature 0 per request); "cloud600", `prefer =
"cloud"`, deadline 600 ms, `hedge.after_ms = "auto"`, plans single and hedge. Each runs on a
fresh client after warm-ups (not counted: 5 (quick) or 8 requests forced to the cloud on the
same heavy tail, so the automatic hedge has the 5 samples it needs, and 2 local ones); the cloud
circuit is then closed afresh. LiteLLM runs "cloud600" (every request cloud first, 600 ms
`stream_timeout`, local fallback) and "chat" as far as it can: the prompts hybridllm's router
sent to the cloud (the router line of the new variant's decisions, the same stage-1 score in
both trees) go cloud first with a 500 ms `stream_timeout`, the rest straight to the local
server.

A cloud-only pass (`engine="cloud"`, the new tree, no local engine busy) measures, per request,
the cloud's own TTFT with that request's delay: "the cloud met its deadline" means that TTFT is
under the policy's deadline.

Reported per variant x policy (a markdown table; every figure and request with `--json`):
- the share of answers each engine served (`trace.engine`; LiteLLM: the deployment);
- quality-routed requests (the decision sent them to the cloud for its answer: a decision
  reason "router score ... -> cloud" or "... prefers cloud", read the same way in both trees;
  LiteLLM: the requests sent cloud first), and among them those answered locally although the
  cloud met its deadline (issue 25's target: 0);
- answer quality (share graded right);
- TTFT P50/P95/P99 (nearest rank) at the client, overall and over the quality-routed requests;
- cloud requests started (the /chat/completions requests the FaultProxy saw during the
  request) and cancelled (started, not serving: the started count less one where the cloud
  served), counted the same way in every variant;
- the wall time of the measured requests (and per prompt), and the CPU.
No timed assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
API_KEY, CLOUD_ALIAS = "sk-bench", "cloud"
LOCAL, CLOUD = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
STALL_MS = 10_000.0
LATE_SLACK_MS = 50.0  # the target for the quality-routed P99: deadline + 50 ms
LOCAL_WARMUPS = 2
POLICIES = {"chat": 500.0, "cloud600": 600.0}  # name: first-token deadline (ms)
VARIANTS = ("cloud", "new", "old", "litellm")
QUALITY = re.compile(r"^router score \S+ >= threshold \S+ -> cloud$|prefers cloud$")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quality_routed(reasons: list[str]) -> bool:
    """The decision sent the request to the cloud for its answer (either tree's reasons)."""
    return any(QUALITY.search(r) for r in reasons)


def row_quality_routed(row: dict[str, Any]) -> bool:
    """A result row's own flag (LiteLLM: sent to the cloud first), else its reasons'."""
    return bool(row.get("quality_routed", quality_routed(row["reasons"])))


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (`routing.hedging.quantile`); nan for none."""
    from hybridllm.routing.hedging import quantile

    return quantile(sorted(xs), q / 100) if xs else math.nan


# ---- one hybridllm variant, in its own process (this tree's or the old tree's hybridllm) -------


def _cloud_requests(proxy: Any) -> int:
    return sum(b"/chat/completions" in head for head, _ in proxy.requests())


async def _one(
    client: Any, proxy: Any, req: dict[str, Any], delay: float, **kw: Any
) -> dict[str, Any]:
    """One request through `client.stream`; the TTFT at the first non-empty token."""
    from hybridllm.errors import HybridError
    from hybridllm.testing import Faults

    proxy.faults = Faults(first_byte_stall_ms=delay)
    before = _cloud_requests(proxy)
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    error = None
    s = client.stream(req["prompt"], max_tokens=req["max_tokens"], temperature=0.0, **kw)
    try:
        async with s:
            async for tok in s:
                if tok and first is None:
                    first = time.perf_counter()
                parts.append(tok)
    except HybridError as exc:
        error = f"{type(exc).__name__}: {exc}"
    total = (time.perf_counter() - t0) * 1e3
    tr = s.trace
    import anyio

    await anyio.sleep(0.02)  # the proxy's thread has read every byte the client sent
    return {
        "ttft_ms": None if first is None else (first - t0) * 1e3,
        "total_ms": total,
        "text": "".join(parts),
        "served": tr.engine,
        "started": list(tr.started),
        # the reasons in words (an old tree's trace.decision is that tuple itself)
        "reasons": list(tr.reasons if hasattr(tr, "reasons") else tr.decision),
        "hedged": bool(tr.hedged),
        "handoff": getattr(tr, "handoff", None) is not None,
        "cloud_cancelled_trace": getattr(tr, "cloud_cancelled", None),  # the new tree only
        "cloud_requests": _cloud_requests(proxy) - before,
        "delay_ms": delay,
        "error": error,
    }


CLOUD_CPU, DEVICE_CPU = 1, 0  # --pin: the stand-in cloud's core, and everything else's


def pin_here(spec: dict[str, Any]) -> None:
    """With --pin, this process and every thread and child it starts from now on run on
    DEVICE_CPU (call it before any thread starts)."""
    if spec.get("pin"):
        os.sched_setaffinity(0, {DEVICE_CPU})


@contextlib.contextmanager
def cloud_behind_proxy(pin: bool = False) -> Iterator[Any]:
    """The stand-in cloud (`hybridllm serve-model`, one thread; with `pin`, on CLOUD_CPU alone)
    behind a recording FaultProxy: the proxy, whose faults each request sets."""
    from hybridllm.local.resolve import resolve_model
    from hybridllm.testing import FaultProxy, HybridServer

    class Pinned(HybridServer):
        def command(self, port: int) -> list[str]:
            return ["taskset", "-c", str(CLOUD_CPU), *super().command(port)]

    model = resolve_model(CLOUD, pull=True)
    server_cls = Pinned if pin else HybridServer
    with (
        server_cls(model, alias=CLOUD_ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1) as server,
        FaultProxy(upstream=("127.0.0.1", server.port), record=True) as proxy,
    ):
        yield proxy


async def run_variant(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    import hybridllm
    from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
    from hybridllm.local.resolve import resolve_model
    from hybridllm.routing import Router
    from hybridllm.runtime.health import CircuitBreaker
    from hybridllm.testing import Faults

    log(f"[{name}] hybridllm from {Path(hybridllm.__file__).parent}")
    items, delays = spec["items"], spec["delays"]
    warm, warm_delays = spec["warm"], spec["warm_delays"]
    out: dict[str, Any] = {
        "variant": name,
        "hybridllm": str(Path(hybridllm.__file__).parent),
        "series": {},
    }
    t_all = time.perf_counter()
    local_path = resolve_model(LOCAL, pull=True)
    with cloud_behind_proxy(bool(spec.get("pin"))) as proxy:
        cloud_url = proxy.url + "/v1"
        if name == "cloud":  # the cloud's own TTFT per request, with that request's delay
            pol = Policy(name="cloudonly", routing={"prefer": "cloud", "retries": 0})
            cloud = OpenAIEngine(base_url=cloud_url, api_key=API_KEY, model=CLOUD_ALIAS)
            async with HybridClient(cloud=cloud, policy=pol, router=None) as client:
                for req in warm[:2]:
                    await _one(client, proxy, req, 0.0, engine="cloud")
                t0 = time.perf_counter()
                rows = []
                for i, (req, d) in enumerate(zip(items, delays, strict=True)):
                    rows.append(await _one(client, proxy, req, d, engine="cloud"))
                    log(f"  [cloud] {i + 1}/{len(items)} ttft {rows[-1]['ttft_ms'] or 0:.0f} ms")
                out["series"]["cloud only"] = {"rows": rows, "wall_s": time.perf_counter() - t0}
        else:
            router = Router.load()
            policies = {
                "chat": Policy.preset("chat").with_(routing={"ttft_deadline_ms": POLICIES["chat"]}),
                "cloud600": Policy(
                    name="cloud600",
                    routing={"prefer": "cloud", "ttft_deadline_ms": POLICIES["cloud600"]},
                    hedge={"after_ms": "auto"},
                    plans=["single", "hedge"],
                ),
            }
            for pname in spec["policies"]:
                pol = policies[pname]
                local = LlamaCppEngine(local_path, n_ctx=2048, n_threads=1)
                cloud = OpenAIEngine(base_url=cloud_url, api_key=API_KEY, model=CLOUD_ALIAS)
                async with HybridClient(
                    local=local, cloud=cloud, router=router, policy=pol
                ) as client:
                    for req, d in zip(warm, warm_delays, strict=True):  # history for the hedge
                        await _one(client, proxy, req, d, policy=pol, engine="cloud")
                    for req in warm[:LOCAL_WARMUPS]:
                        await _one(client, proxy, req, 0.0, policy=pol, engine="local")
                    client.breakers["cloud"] = CircuitBreaker()  # measured from a closed circuit
                    t0 = time.perf_counter()
                    rows = []
                    for i, (req, d) in enumerate(zip(items, delays, strict=True)):
                        r = await _one(client, proxy, req, d, policy=pol)
                        rows.append(r)
                        log(
                            f"  [{name} {pname}] {i + 1}/{len(items)} {r['served']} "
                            f"ttft {r['ttft_ms'] or 0:.0f} ms, delay {d:.0f} ms, "
                            f"cloud reqs {r['cloud_requests']}"
                        )
                    wall = time.perf_counter() - t0
                    out["series"][pname] = {"rows": rows, "wall_s": wall}
                    log(f"  [{name} {pname}] {len(items)} requests in {wall:.1f} s")
        proxy.faults = Faults()
    out["total_s"] = time.perf_counter() - t_all
    return out


def variant_child(args: argparse.Namespace) -> None:
    import anyio

    spec = json.loads(Path(args.spec).read_text())
    POLICIES.update(spec.get("deadlines", {}))  # as the parent scaled them
    pin_here(spec)
    res = anyio.run(run_variant, args.variant_only, spec)
    Path(args.json).write_text(json.dumps(res, indent=1))


# ---- LiteLLM's Router, driven from here (the proxy lives in this process) ----------------------


def run_litellm(
    args: argparse.Namespace, spec: dict[str, Any], to_cloud: set[int]
) -> dict[str, Any]:
    from hybridllm.local.resolve import resolve_model
    from hybridllm.testing import Faults, LlamaServer

    items, delays = spec["items"], spec["delays"]
    out: dict[str, Any] = {"variant": "litellm", "series": {}}
    t_all = time.perf_counter()
    with (
        cloud_behind_proxy(bool(spec.get("pin"))) as proxy,
        LlamaServer(
            resolve_model(LOCAL, pull=True),
            alias="local",
            api_key=API_KEY,
            n_ctx=2048,
            n_threads=1,
            extra_args=["--n_threads_batch", "1"],
        ) as local,
    ):
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        env.pop("PYTHONPATH", None)
        peer_log = tempfile.TemporaryFile(mode="w+")
        peer = subprocess.Popen(
            [
                args.litellm_python,
                str(ROOT / "benchmarks" / "_litellm_peer.py"),
                "--cloud",
                proxy.url + "/v1",
                "--local",
                local.base_url,
                "--key",
                API_KEY,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=peer_log,
            text=True,
            env=env,
            cwd="/",
        )
        assert peer.stdin is not None and peer.stdout is not None

        def tail() -> str:
            peer_log.flush()
            peer_log.seek(0)
            return peer_log.read()[-3000:]

        def ask(req: dict[str, Any], delay: float, group: str, timeout_s: float) -> dict[str, Any]:
            proxy.faults = Faults(first_byte_stall_ms=delay)
            before = _cloud_requests(proxy)
            msg = {**req, "group": group, "timeout_s": timeout_s}
            peer.stdin.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
            peer.stdin.flush()  # type: ignore[union-attr]
            while True:  # skip anything LiteLLM printed to stdout
                line = peer.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    raise RuntimeError(f"the LiteLLM peer exited:\n{tail()}")
                if line.startswith("{"):
                    r: dict[str, Any] = json.loads(line)
                    break
            time.sleep(0.02)
            r.update(
                cloud_requests=_cloud_requests(proxy) - before,
                delay_ms=delay,
                reasons=[f"litellm: {group} first"],
                started=[],
            )
            return r

        try:
            while (line := peer.stdout.readline()).strip() != "ready":
                if not line:
                    raise RuntimeError(f"the LiteLLM peer did not start:\n{tail()}")
            for pname in spec["policies"]:
                deadline_s = POLICIES[pname] / 1000
                for req, d in zip(spec["warm"], spec["warm_delays"], strict=True):
                    ask(req, d, "cloud", deadline_s)
                t0 = time.perf_counter()
                rows = []
                for i, (req, d) in enumerate(zip(items, delays, strict=True)):
                    group = "cloud" if pname == "cloud600" or i in to_cloud else "local"
                    r = ask(req, d, group, deadline_s)
                    r["quality_routed"] = group == "cloud"
                    rows.append(r)
                    log(
                        f"  [litellm {pname}] {i + 1}/{len(items)} {r['served']} ttft "
                        f"{r['ttft_ms'] or 0:.0f} ms, delay {d:.0f} ms, cloud reqs "
                        f"{r['cloud_requests']}{', ' + r['error'] if r['error'] else ''}"
                    )
                wall = time.perf_counter() - t0
                out["series"][pname] = {"rows": rows, "wall_s": wall}
                log(f"  [litellm {pname}] {len(items)} requests in {wall:.1f} s")
        finally:
            peer.stdin.close()
            try:
                peer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                peer.kill()
            out["log_tail"] = tail()
            peer_log.close()
        proxy.faults = Faults()
    out["total_s"] = time.perf_counter() - t_all
    return out


# ---- the parent: workload, variants, merge, table ------------------------------------------------


def spawn(
    args: argparse.Namespace, name: str, root: Path, spec_path: Path, tmp: Path
) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--variant-only",
        name,
        "--spec",
        str(spec_path),
        "--json",
        str(out),
    ]
    log(f"variant {name}: PYTHONPATH={root}")
    subprocess.run(cmd, env=env, cwd=root, check=True)
    res: dict[str, Any] = json.loads(out.read_text())
    return res


def summarise(
    rows: list[dict[str, Any]], cloud_ttft: list[float | None], deadline: float, right: list[bool]
) -> dict[str, Any]:
    n = len(rows)
    served = [r["served"] for r in rows]
    qr = [i for i, r in enumerate(rows) if row_quality_routed(r)]
    in_time = [t is not None and t <= deadline for t in cloud_ttft]
    lost = [i for i in qr if served[i] == "local" and in_time[i]]
    ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
    qttft = [rows[i]["ttft_ms"] for i in qr if rows[i]["ttft_ms"] is not None]
    started = sum(r["cloud_requests"] for r in rows)
    cancelled = sum(
        max(0, r["cloud_requests"] - (s == "cloud")) for r, s in zip(rows, served, strict=True)
    )
    late = [r["ttft_ms"] is None or r["ttft_ms"] > deadline + LATE_SLACK_MS for r in rows]
    return {
        "n": n,
        "late": sum(late),
        "qr_late": sum(late[i] for i in qr),
        "cloud": sum(s == "cloud" for s in served) / n,
        "local": sum(s == "local" for s in served) / n,
        "errors": sum(r["error"] is not None for r in rows),
        "quality": sum(right) / n,
        "quality_routed": len(qr),
        "qr_local_cloud_in_time": len(lost),
        "qr_cloud_in_time": sum(in_time[i] for i in qr),
        "qr_served_cloud": sum(served[i] == "cloud" for i in qr),
        "p50": pct(ttft, 50),
        "p95": pct(ttft, 95),
        "p99": pct(ttft, 99),
        "qr_p50": pct(qttft, 50),
        "qr_p95": pct(qttft, 95),
        "qr_p99": pct(qttft, 99),
        "cloud_started": started,
        "cloud_cancelled": cancelled,
        "cloud_cancelled_trace": sum(bool(r.get("cloud_cancelled_trace")) for r in rows)
        if any(r.get("cloud_cancelled_trace") is not None for r in rows)
        else None,
        "hedged": sum(bool(r.get("hedged")) for r in rows),
        "handoff": sum(bool(r.get("handoff")) for r in rows),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from benchmarks._report import cpu_model
    from benchmarks.bench_cascade_mix import KINDS, _labeller, workload
    from hybridllm.testing.proxy import heavy_tail

    n = args.n or (8 if args.quick else 100)
    w = args.warmups or (5 if args.quick else 8)
    lab = _labeller()
    rows_all = workload(n + w, args.seed, split="test")  # the first n: workload(n) itself
    assert len(rows_all) == n + w, "not enough test-split prompts"
    items = [
        lab.Item(r["source"], r["id"], r["prompt"], r["kind"], r["answer"], KINDS[r["kind"]])
        for r in rows_all
    ]
    rng = random.Random(args.seed)
    dist = heavy_tail(median_ms=150, p99_ms=3000, spike_probability=0.03, spike_ms=STALL_MS)
    warm_delays = [dist(rng) for _ in range(w)]
    delays = [dist(rng) for _ in range(n)]
    spec = {
        "items": [{"prompt": it.prompt, "max_tokens": it.max_tokens} for it in items[:n]],
        "warm": [{"prompt": it.prompt, "max_tokens": it.max_tokens} for it in items[n:]],
        "delays": delays,
        "warm_delays": warm_delays,
        "policies": list(POLICIES),
        "deadlines": POLICIES,
        "pin": args.pin,
    }
    pin_here(spec)  # LiteLLM's side runs in this process and its children
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    prior: dict[str, Any] = {}
    if args.reuse:  # the variants not run now, from an earlier run of the same workload
        before = json.loads(Path(args.reuse).read_text())
        was = (before["n"], before["seed"], before["warmups"], before.get("pin", False))
        if was != (n, args.seed, w, args.pin):
            raise SystemExit(f"--reuse {args.reuse}: another workload (n, seed, warm-ups, pin)")
        prior = {v: r for v, r in before["runs"].items() if v not in wanted}
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="qrace-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        roots = {"cloud": ROOT, "new": ROOT, "old": Path(args.old_root)}
        for v in ("cloud", "new", "old"):
            if v in wanted:
                results[v] = spawn(args, v, roots[v], spec_path, Path(tmp))
            elif v in prior:
                results[v] = prior[v]
        if "litellm" in prior:
            results["litellm"] = prior["litellm"]
        elif "litellm" in wanted:
            src = results.get("new") or results.get("old")
            to_cloud = set()
            if src is not None:
                to_cloud = {
                    i
                    for i, r in enumerate(src["series"]["chat"]["rows"])
                    if any(
                        x.startswith("router score") and x.endswith("-> cloud")
                        for x in r["reasons"]
                    )
                }
            else:
                log("litellm: no hybridllm variant ran, its chat rows send nothing cloud first")
            results["litellm"] = run_litellm(args, spec, to_cloud)
    cloud_rows = results["cloud"]["series"]["cloud only"]["rows"] if "cloud" in results else None
    cloud_ttft = [r["ttft_ms"] for r in cloud_rows] if cloud_rows else [None] * n
    table = []
    for v, res in results.items():
        for pname, ser in res["series"].items():
            rows = ser["rows"]
            right = [bool(lab.score(it, r["text"])) for it, r in zip(items[:n], rows, strict=True)]
            for r, ok in zip(rows, right, strict=True):
                r["right"] = ok
            if pname == "cloud only":
                ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
                ref = {
                    "variant": "cloud only",
                    "policy": "engine=cloud",
                    "n": n,
                    "quality": sum(right) / n,
                    "p50": pct(ttft, 50),
                    "p95": pct(ttft, 95),
                    "p99": pct(ttft, 99),
                    "wall_s": ser["wall_s"],
                    **{
                        f"in_time_{int(d)}": sum(t is not None and t <= d for t in cloud_ttft)
                        for d in sorted(set(POLICIES.values()))
                    },
                }
                table.append(ref)
                continue
            s = summarise(rows, cloud_ttft, POLICIES[pname], right)
            table.append(
                {
                    "variant": v,
                    "policy": pname,
                    **s,
                    "wall_s": ser["wall_s"],
                    "s_per_prompt": ser["wall_s"] / n,
                }
            )
    common_p99(table, results)
    return {
        "n": n,
        "warmups": w,
        "seed": args.seed,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "pin": args.pin,
        "delays": {
            "p50": pct(delays, 50),
            "p95": pct(delays, 95),
            "p99": pct(delays, 99),
            "stalls": sum(d == STALL_MS for d in delays),
        },
        "deadlines_ms": POLICIES,
        "table": table,
        "variant_total_s": {v: r.get("total_s") for v, r in results.items()},
        "labels": {
            "local": sum(r["local"]["correct"] for r in rows_all[:n]) / n,
            "cloud": sum(r["cloud"]["correct"] for r in rows_all[:n]) / n,
        },
        "runs": results,
    }


def common_p99(table: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> None:
    """Each row's P99 (all, and quality-routed) over the requests every variant answered for
    that policy: LiteLLM's errors drop out of its own percentiles, so like for like."""
    for row in table:
        if row["variant"] == "cloud only":
            continue
        pname = row["policy"]
        runs = [r["series"][pname]["rows"] for r in results.values() if pname in r["series"]]
        common = [i for i in range(row["n"]) if all(rs[i]["ttft_ms"] is not None for rs in runs)]
        rows = results[row["variant"]]["series"][pname]["rows"]
        qr = [i for i in common if row_quality_routed(rows[i])]
        row["n_common"] = len(common)
        row["p99_common"] = pct([rows[i]["ttft_ms"] for i in common], 99)
        row["qr_p99_common"] = pct([rows[i]["ttft_ms"] for i in qr], 99)


def _cores(res: dict[str, Any]) -> str:
    if res.get("pin"):
        return f"the stand-in cloud pinned to CPU {CLOUD_CPU}, the rest to CPU {DEVICE_CPU}"
    return "both engines share the cores"


def render(res: dict[str, Any]) -> str:
    def ms(x: Any) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f}"

    d = res["delays"]
    out = [
        f"{res['n']} test-split prompts, seed {res['seed']}, {res['warmups']} warm-ups per "
        f"variant x policy; CPU {res['cpu']} ({res['cores']} cores): {_cores(res)}, one "
        f"llama.cpp thread each; cloud first-byte delays p50 {d['p50']:.0f} / p95 "
        f"{d['p95']:.0f} / p99 {d['p99']:.0f} ms, {d['stalls']} stalls of 10 s.",
        "",
    ]
    for r in res["table"]:
        if r["variant"] == "cloud only":
            out.append(
                f"Cloud only (engine=cloud, new tree, local engine idle): quality "
                f"{r['quality']:.2f}, TTFT p50/p95/p99 {ms(r['p50'])}/{ms(r['p95'])}/"
                f"{ms(r['p99'])} ms; in time for "
                + ", ".join(
                    f"{int(d)} ms: {r.get(f'in_time_{int(d)}', '-')}/{r['n']}"
                    for d in sorted(set(POLICIES.values()))
                )
                + "."
            )
    out.append(
        f"Labels for these prompts (grammar-constrained letters there): local alone "
        f"{res['labels']['local']:.2f}, cloud alone {res['labels']['cloud']:.2f}."
    )
    out.append("")
    head = [
        "variant",
        "policy",
        "cloud",
        "local",
        "quality",
        "QR",
        "QR local, cloud in time",
        "TTFT p50",
        "p95",
        "p99",
        "QR p50",
        "QR p95",
        "QR p99",
        "late (QR)",
        "p99 / QR p99, all answered",
        "cloud started",
        "cancelled",
        "errors",
        "wall s",
        "s/prompt",
    ]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    for r in res["table"]:
        if r["variant"] == "cloud only":
            continue
        qr = r["quality_routed"]
        cells = [
            r["variant"],
            r["policy"],
            f"{r['cloud']:.0%}",
            f"{r['local']:.0%}",
            f"{r['quality']:.2f}",
            f"{qr}/{r['n']}",
            f"{r['qr_local_cloud_in_time']}/{r['qr_cloud_in_time']}",
            ms(r["p50"]),
            ms(r["p95"]),
            ms(r["p99"]),
            ms(r["qr_p50"]),
            ms(r["qr_p95"]),
            ms(r["qr_p99"]),
            f"{r.get('late', '-')} ({r.get('qr_late', '-')})",
            f"{ms(r.get('p99_common'))} / {ms(r.get('qr_p99_common'))} ({r.get('n_common', '-')})",
            str(r["cloud_started"]),
            str(r["cloud_cancelled"]),
            str(r["errors"]),
            f"{r['wall_s']:.0f}",
            f"{r['s_per_prompt']:.1f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "TTFT in ms at the client (call to the first non-empty token), nearest rank, over the "
        "requests that got a token ('errors': those that did not). QR: "
        "quality-routed requests (router score -> cloud, or prefers cloud; LiteLLM: sent cloud "
        "first). 'QR local, cloud in time': of the QR requests whose cloud, alone, met the "
        f"deadline (chat {POLICIES['chat']:.0f} ms, cloud600 {POLICIES['cloud600']:.0f} ms), "
        "those answered locally (target 0). Late: no token, or the first one more than "
        f"{LATE_SLACK_MS:.0f} ms past the deadline (QR: of the quality-routed). 'All answered': "
        "the P99s over the requests every variant answered (their count in brackets), like "
        "for like where a variant's errors drop out of its own percentiles. Cloud "
        "started/cancelled: /chat/completions requests the proxy saw; cancelled = started "
        f"less one where the cloud served. {_cores(res).capitalize()}, one thread each."
    )
    traced = [
        f"{r['variant']} {r['policy']} {r['cloud_cancelled_trace']}"
        for r in res["table"]
        if r.get("cloud_cancelled_trace") is not None
    ]
    if traced:
        out.append(
            "Cancelled by the new tree's own count (trace.cloud_cancelled): "
            + ", ".join(traced)
            + "."
        )
    tot = ", ".join(f"{v} {t:.0f} s" for v, t in res["variant_total_s"].items() if t)
    out.append(f"Whole variant processes (servers, warm-ups and all): {tot}.")
    return "\n".join(out)


def cli() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--n", type=int, default=None, help="prompts (default 100; --quick 8)")
    ap.add_argument("--quick", action="store_true", help="8 prompts, 5 cloud warm-ups")
    ap.add_argument(
        "--warmups",
        type=int,
        default=None,
        help="cloud warm-ups per variant x policy (default 8; --quick 5; the "
        "automatic hedge needs 5)",
    )
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument(
        "--deadline-scale",
        type=float,
        default=1.0,
        help="multiply both first-token deadlines (500 and 600 ms) by this: where the cloud's own "
        "TTFT on this machine is past them, scale the time axis so the cloud can be in time",
    )
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"of {', '.join(VARIANTS)} (cloud: the cloud-only pass that says "
        "whether each request's cloud met the deadline)",
    )
    ap.add_argument(
        "--old-root", default="/work/wt/old", help="the tree with today's rules (commit 2d555e5)"
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help=f"the stand-in cloud on CPU {CLOUD_CPU} alone, everything else (the local engine, "
        f"the client, the proxy, LiteLLM and its llama.cpp server) on CPU {DEVICE_CPU}: each side "
        "has a core of its own, as a cloud off the device would",
    )
    ap.add_argument("--litellm-python", default="/tmp/litellm-venv/bin/python")
    ap.add_argument("--json", metavar="PATH", help="write every figure and request here")
    ap.add_argument(
        "--reuse",
        metavar="PATH",
        help="take the variants not in --variants from this earlier --json of the "
        "same workload (to rerun one variant)",
    )
    ap.add_argument("--variant-only", choices=("cloud", "new", "old"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant_only:
        if not (args.spec and args.json):
            ap.error("--variant-only needs --spec and --json")
        variant_child(args)
        return
    for name in POLICIES:
        POLICIES[name] *= args.deadline_scale
    res = main(args)
    print(render(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    cli()
