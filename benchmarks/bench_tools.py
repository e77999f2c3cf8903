"""Tool calls on BFCL's non-live categories: local only, cloud only and the hybrid rules, in one
run (issue 26).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_tools.py [--n 10] [--offset K]
        [--arms local,cloud,hybrid,hybrid-confidence,preset:chat,preset:voice-assistant]
        [--pin]
        [--calibrate M [--calibration-offset K] [--calibration-rows PATH]
         | --bound B [--fit-bound F]] [--max-share 0.5] [--json out.json]

Items: `--n` of each category (`simple_python`, `multiple`, `parallel`, `irrelevance`) from
item `--offset` on (`benchmarks/bfcl.py` loads them from the bfcl-eval wheel and scores them
with an AST check of our own). Each is asked once per arm with `tools=` (BFCL's functions as
OpenAI tools), `tool_choice="auto"`, temperature 0, the privacy guard off (BFCL's invented
emails would keep items off the cloud-only arm), through `HybridClient.complete()`:
- local only: Qwen2.5-Coder-0.5B in process (`LlamaCppEngine`);
- cloud only: Qwen2.5-Coder-1.5B behind `hybridllm serve-model` on loopback (`OpenAIEngine`);
- hybrid: both, local first; a local answer that fails its check (an invalid call, a call
  written as text) escalates to the cloud before anything is delivered, and so does a valid
  local call below either `[tools]` bound (`min_call_confidence` and `min_tool_fit`);
- hybrid-confidence: the same with `min_call_confidence` alone;
- preset:NAME: a preset policy as it ships (`chat`: the router decides, 500 ms deadline;
  `voice-assistant`: local first, 400 ms, parallel cloud starts), the privacy guard off, with
  the hybrid's `[tools]` bounds; a call counts as started once its name is chosen
  (`CallOpened`), so its deadline is met or missed there.
The bounds are `--bound` / `--fit-bound`, or with `--calibrate M` chosen first on M other items
of each category (after the reported ones, or from item `--calibration-offset` on), run local
only and cloud only, as the bounds that maximise accuracy with at most `--max-share` of those
items sent to the cloud; the reported items are never the calibration's. `--calibration-rows
PATH` keeps the calibration items' local and cloud rows, so a later run on the same items reads
them instead of running them again (rows written before the tool fit and the call-markup rule
are read as those rules have them: `reread`).
Reported per arm: accuracy per category, the schema-valid share of delivered calls (checked here
again with jsonschema, independently of hybridllm's own check), the refusals (an
`InvalidOutputError` where no engine was left), the cloud share (the engine that served),
the time to the first token or whole call (p50, p95) and to the first call named (p50, p95:
the `call_opened` mark). The arms run one after the other, never at once. `--pin`: the stand-in
cloud on CPU 1 (one thread), this process and the local engine on CPU 0 (one thread), so the
two do not share a core (2-core machines).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bfcl  # noqa: E402
from benchmarks._report import cpu_model  # noqa: E402
from hybridllm.tools.fit import question_of, tool_fit  # noqa: E402

CLOUD_CPU, DEVICE_CPU = 1, 0  # `--pin`: the stand-in cloud's core; this process's
PINNED = False  # `--pin` given: one thread each
LOCAL = "qwen2.5-coder-0.5b-instruct"
CLOUD = "qwen2.5-coder-1.5b-instruct"
ALIAS, API_KEY = "stand-in", "sk-bench"


def items(n: int, skip: int = 0) -> list[dict[str, Any]]:
    """Items `skip` to `skip + n` of each category."""
    return [it for cat in bfcl.CATEGORIES for it in bfcl.load(cat)[skip : skip + n]]


def opened_ms(trace: Any) -> float | None:
    """When the answer's first call was named (ms from the request's start), if one was."""
    at = trace.marks.get("call_opened")
    return None if at is None else (at - trace.t_start) * 1e3


def schema_valid(tools: list[dict[str, Any]], name: str, arguments: str) -> bool:
    from jsonschema import validators

    tool = next((t for t in tools if t["function"]["name"] == name), None)
    if tool is None:
        return False
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return False
    schema = tool["function"]["parameters"]
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    return not any(True for _ in cls(schema).iter_errors(parsed))


async def ask(client: Any, item: dict[str, Any]) -> dict[str, Any]:
    from hybridllm.errors import HybridError

    tools = [bfcl.openai_tool(f) for f in item["functions"]]
    row: dict[str, Any] = {"id": item["id"], "category": item["category"]}
    t0 = time.perf_counter()
    try:
        done = await client.complete(
            item["messages"], tools=tools, tool_choice="auto", temperature=0.0, max_tokens=256
        )
    except HybridError as exc:  # a failed answer, or a schema an engine cannot take
        row.update(error=type(exc).__name__, right=False, calls=[], engine=None, ttft_ms=None)
        return row
    calls = [(c.name, c.parsed()) for c in done.tool_calls]
    question = question_of(item["messages"])
    row.update(
        right=bfcl.score(item["category"], calls, item["answer"]),
        calls=[[c.name, c.arguments] for c in done.tool_calls],
        valid=[schema_valid(tools, c.name, c.arguments) for c in done.tool_calls],
        confidence=min(
            (c.confidence for c in done.tool_calls if c.confidence is not None), default=None
        ),  # fmt: skip
        fit=tool_fit(question, done.tool_calls[0].name) if done.tool_calls else None,
        engine=done.trace.engine,
        ttft_ms=done.trace.ttft_ms,
        opened_ms=opened_ms(done.trace),
        total_ms=(time.perf_counter() - t0) * 1e3,
        text=done.text[:120],
        error=None,
    )
    return row


async def run_arm(
    arm: str, rows_in: list[dict[str, Any]], cloud_url: str, table: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Each item asked once through a client of `arm`'s engines; `table`: the hybrid's `[tools]`
    bounds."""
    from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
    from hybridllm.local.resolve import resolve_model

    local = cloud = None
    if arm != "cloud":
        threads = 1 if PINNED else 2
        local = LlamaCppEngine(resolve_model(LOCAL, pull=True), n_ctx=4096, n_threads=threads)
    if arm != "local":
        cloud = OpenAIEngine(base_url=cloud_url, api_key=API_KEY, model=ALIAS, timeout=120.0)
    prefer = "cloud" if arm == "cloud" else "local"
    # BFCL's invented emails and phone numbers are no one's: privacy would keep such items
    # off the cloud-only arm's only engine, so the privacy guard is off in every arm
    routing = {"prefer": prefer, "retries": 0}
    policy = Policy(
        name=f"tools-{arm}", routing=routing, privacy={"mode": "off"}, tools=table or {}
    )
    router: dict[str, Any] = {"router": None}
    if arm.startswith("preset:"):  # the preset as it ships, with its router
        preset = Policy.preset(arm.split(":", 1)[1])
        policy = preset.with_(name=f"tools-{preset.name}", privacy={"mode": "off"},
                              tools=table or {})  # fmt: skip
        router = {}
    out = []
    async with HybridClient(local=local, cloud=cloud, policy=policy, **router) as client:
        for i, item in enumerate(rows_in):
            out.append(await ask(client, item))
            r = out[-1]
            said = f"right={r['right']} engine={r['engine']} error={r['error']}"
            print(f"  [{arm}] {i + 1}/{len(rows_in)} {r['id']}: {said}", file=sys.stderr)
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_cat: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        by_cat[r["category"]].append(r["right"])
    valid = [v for r in rows for v in r.get("valid", [])]
    ttft = sorted(r["ttft_ms"] for r in rows if r["ttft_ms"] is not None)
    opened = sorted(r["opened_ms"] for r in rows if r.get("opened_ms") is not None)
    served = Counter(r["engine"] for r in rows)
    return {
        "accuracy": {c: sum(v) / len(v) for c, v in by_cat.items()},
        "overall": sum(r["right"] for r in rows) / len(rows),
        "calls": len(valid),
        "schema_valid": (sum(valid) / len(valid)) if valid else None,
        "errors": Counter(r["error"] for r in rows if r["error"]),
        "cloud_share": served.get("cloud", 0) / len(rows),
        "ttft_p50": statistics.median(ttft) if ttft else None,
        "ttft_p95": ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))] if ttft else None,
        "opened_p50": statistics.median(opened) if opened else None,
        "opened_p95": opened[min(len(opened) - 1, int(0.95 * len(opened)))] if opened else None,
    }


def escalated(row: dict[str, Any], bound: float, fit_bound: float | None) -> bool:
    """Whether the hybrid's rules send this local answer to the cloud: a failed answer (an
    invalid call, a call written as text), or a call below either bound (a text answer
    stands)."""
    if row["error"]:
        return True
    if row["confidence"] is None:
        return False
    return bool(row["confidence"] < bound or (fit_bound is not None and row["fit"] < fit_bound))


def calibrate(
    local: list[dict[str, Any]], cloud: list[dict[str, Any]], max_share: float, with_fit: bool
) -> dict[str, Any]:
    """The `[tools]` bounds that maximise the hybrid's accuracy on these items with at most
    `max_share` of them sent to the cloud: `min_call_confidence`, and `min_tool_fit` too where
    `with_fit`. A local answer the bounds escalate is answered by the cloud (`cloud`'s row for
    the same item), every other local answer stands. Returns the bounds, their accuracy and
    share, and the whole curve."""
    pairs = list(zip(local, cloud, strict=True))
    steps = sorted({r["confidence"] for r in local if r.get("confidence") is not None})
    fits = sorted({r["fit"] for r in local if r.get("fit") is not None}) if with_fit else []
    curve = []
    for bound in [0.0, *[b + 1e-9 for b in steps]]:
        for fit_bound in [None, *[f + 1e-9 for f in fits]]:
            sent = [escalated(lo, bound, fit_bound) for lo, _ in pairs]
            right = sum(
                c["right"] if s else lo["right"] for s, (lo, c) in zip(sent, pairs, strict=True)
            )
            share = sum(sent) / len(pairs)
            accuracy = right / len(pairs)
            curve.append(
                {"bound": bound, "fit_bound": fit_bound, "accuracy": accuracy, "share": share}
            )
    fitting = [c for c in curve if c["share"] <= max_share]
    best = max(fitting, key=lambda c: (c["accuracy"], -c["share"]))
    return best | {"curve": curve}


def reread(rows: list[dict[str, Any]], cal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows written before the tool fit and the call-markup rule, read as today's rules have
    them: each first call's fit, and a text answer opening with call markup a failure."""
    from hybridllm.tools import written_call

    questions = {it["id"]: question_of(it["messages"]) for it in cal}
    for r in rows:
        if "fit" not in r:
            r["fit"] = tool_fit(questions[r["id"]], r["calls"][0][0]) if r["calls"] else None
        if not r["error"] and not r["calls"] and written_call(r["text"]):
            r.update(error="InvalidOutputError", right=False, engine=None)
    return rows


def render(res: dict[str, Any]) -> str:
    lines = [f"CPU: {res['cpu']}; {res['n']} items per category from item {res['offset']}"]
    for arm, table in res["tables"].items():
        cal = res.get("calibration", {}).get(arm)
        said = f"{arm}: [tools] {table}"
        if cal:
            said += (f", chosen on other items: predicted accuracy {cal['accuracy']:.2f} at a "
                     f"cloud share of {cal['share']:.0%}")  # fmt: skip
        lines.append(said)
    lines.append("")
    cats = list(bfcl.CATEGORIES)
    head = "arm              " + "".join(f"{c:>15}" for c in cats)
    lines.append(head + "    overall  valid calls  cloud   TTFT p50 / p95  named p50 / p95  errors")
    for arm, s in res["arms"].items():
        acc = "".join(f"{s['accuracy'].get(c, 0):>15.2f}" for c in cats)
        valid = "-" if s["schema_valid"] is None else f"{s['schema_valid']:.0%} of {s['calls']}"
        ttft = f"{s['ttft_p50'] or 0:,.0f} / {s['ttft_p95'] or 0:,.0f} ms"
        named = f"{s.get('opened_p50') or 0:,.0f} / {s.get('opened_p95') or 0:,.0f} ms"
        lines.append(
            f"{arm:<17}{acc}{s['overall']:>11.2f}  {valid:>11}  {s['cloud_share']:>5.0%}  "
            f"{ttft:>15}  {named:>15}  {dict(s['errors'])}"
        )
    return "\n".join(lines)


async def calibration_rows(
    args: argparse.Namespace, url: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calibration items' local and cloud rows: run now, or read from `--calibration-rows`
    where an earlier run of the same items wrote them (the file is written after a run)."""
    start = args.offset + args.n if args.calibration_offset is None else args.calibration_offset
    cal = items(args.calibrate, skip=start)
    saved = Path(args.calibration_rows) if args.calibration_rows else None
    if saved is not None and saved.exists():
        rows = json.loads(saved.read_text())
        if [r["id"] for r in rows["local"]] == [it["id"] for it in cal]:
            print(f"  calibration rows read from {saved}", file=sys.stderr)
            return reread(rows["local"], cal), reread(rows["cloud"], cal)
    local = await run_arm("local", cal, url)
    cloud = await run_arm("cloud", cal, url)
    if saved is not None:
        saved.write_text(json.dumps({"local": local, "cloud": cloud}, indent=1, default=str))
    return local, cloud


def bounds(cal: dict[str, Any]) -> dict[str, Any]:
    """A calibration's bounds as a `[tools]` table."""
    return {"min_call_confidence": round(cal["bound"], 6), "min_tool_fit": cal["fit_bound"]}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from hybridllm.local.resolve import resolve_model
    from hybridllm.testing import HybridServer

    res: dict[str, Any] = {"cpu": cpu_model(), "n": args.n, "offset": args.offset}
    res |= {"arms": {}, "rows": {}, "tables": {}}

    class Pinned(HybridServer):  # the stand-in cloud on a core of its own (`--pin`)
        def command(self, port: int) -> list[str]:
            return ["taskset", "-c", str(CLOUD_CPU), *super().command(port)]

    global PINNED
    PINNED = args.pin
    if args.pin:
        os.sched_setaffinity(0, {DEVICE_CPU})
    model = resolve_model(CLOUD, pull=True)
    kind = Pinned if args.pin else HybridServer
    threads = 1 if args.pin else 2
    with kind(model, alias=ALIAS, api_key=API_KEY, n_ctx=4096, n_threads=threads) as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        tables = {
            "hybrid": {"min_call_confidence": args.bound, "min_tool_fit": args.fit_bound},
            "hybrid-confidence": {"min_call_confidence": args.bound},
        }
        for arm in args.arms.split(","):
            if arm.startswith("preset:"):  # the hybrid's bounds, under the preset
                tables[arm] = tables["hybrid"]
        if args.calibrate:  # the held-out items follow the calibration ones
            local, cloud = await calibration_rows(args, url)
            cal = {arm: calibrate(local, cloud, args.max_share, arm == "hybrid") for arm in tables}
            res["calibration"] = cal
            tables = {arm: bounds(c) for arm, c in cal.items()}
            tables |= {a: tables["hybrid"] for a in args.arms.split(",") if a.startswith("preset:")}
        arms = list(filter(None, args.arms.split(",")))  # "": the calibration only
        res["tables"] = {arm: t for arm, t in tables.items() if arm in arms}
        for arm in arms:
            t0 = time.perf_counter()
            rows = await run_arm(arm, items(args.n, skip=args.offset), url, tables.get(arm))
            res["rows"][arm] = rows
            res["arms"][arm] = summarise(rows) | {"wall_s": time.perf_counter() - t0}
    return res


def cli() -> None:
    import anyio

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10, help="items per category")
    ap.add_argument("--offset", type=int, default=0, help="the reported items start here")
    ap.add_argument("--arms", default="local,cloud,hybrid,hybrid-confidence")
    ap.add_argument("--bound", type=float, help="the hybrids' [tools] min_call_confidence")
    ap.add_argument("--fit-bound", type=float, help="the hybrid's [tools] min_tool_fit")
    ap.add_argument(
        "--calibrate", type=int, default=0, metavar="M",
        help="first choose the bounds on the M items per category after the reported ones",
    )  # fmt: skip
    ap.add_argument(
        "--calibration-offset", type=int, metavar="K",
        help="the calibration items start at item K (default: after the reported ones)",
    )  # fmt: skip
    ap.add_argument(
        "--calibration-rows", metavar="PATH",
        help="write the calibration items' rows here, or read them if an earlier run did",
    )  # fmt: skip
    ap.add_argument("--max-share", type=float, default=0.5, help="cloud share the bounds may use")
    ap.add_argument("--pin", action="store_true", help="the cloud on CPU 1, the device on CPU 0")
    ap.add_argument("--json", help="write the rows and the summary here")
    args = ap.parse_args()
    res = anyio.run(main, args)
    print(render(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    cli()
