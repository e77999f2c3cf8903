"""The first `PartialJSON` of a JSON answer, and a local tool call, against the same prompt's
plain-text TTFT (issue 45 item 2): how soon an app can show a JSON answer's object as it streams,
and what a call costs beyond its own tokens.

    python benchmarks/bench_partial_json.py [--model NAME] [--rounds N] [--max-tokens N]
                                            [--json PATH]

Through `HybridClient` with the local engine alone (greedy), interleaved in one run, each
request with its own first words (so no arm reuses another's prompt from the KV cache):
- plain: the prompt as text; its TTFT (the first `Token`);
- json_schema: the same prompt with a `json_schema` response format (the local grammar); the
  time to its first `PartialJSON`, to its last, and to the whole checked answer (the `Token`).
- tool call: the same prompt with one tool (`add_employees`, the same schema) that must be
  called; the time to its name (`trace.marks["call_opened"]`) and to the whole checked call
  (`ToolCall`), and the call's cost beyond its own decode: (time to the call - its completion
  tokens x the plain answer's TPOT of the same round) / the plain TTFT (target: at most 1.3).
  The tools block is the same every round, so from the second round on its KV state can be
  found saved (`cached` column). The call's JSON up to its arguments is read with the prompt
  (the request names the function: `ToolPlan.opening`);
- tool call, the model writing its opening: the same tool under `tool_choice="required"` (the
  same prompt and call grammar, the function not named by the request), so the opening is
  decoded a token at a time as before, for the comparison.
Medians and p90 over the rounds, and the first snapshot's lag behind plain TTFT (target: at most
50 ms). The answer's parsed object is checked against the schema by the client (the run fails
on an invalid one). No timed assertions.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import cpu_model, report  # noqa: E402
from benchmarks.bench_grammar import SCHEMA as STAFF  # noqa: E402
from hybridllm import HybridClient, LlamaCppEngine, PartialJSON, Policy, Token, ToolCall  # noqa: E402

# bench_grammar's staff schema without the skills lists (an answer that ends within --max-tokens)
SCHEMA = copy.deepcopy(STAFF)
SCHEMA["properties"]["employees"]["items"]["properties"].pop("skills")
SCHEMA["properties"]["employees"]["items"]["required"].remove("skills")
FORMAT = {"type": "json_schema", "json_schema": {"name": "staff", "schema": SCHEMA}}
TOOL = {"type": "function", "function": {"name": "add_employees", "parameters": SCHEMA}}
MUST_CALL = {"type": "function", "function": {"name": "add_employees"}}
WORDS = ["two", "three", "two", "three"]  # short enough to finish within --max-tokens


def prompt(i: int) -> str:
    n = WORDS[i % len(WORDS)]
    return f"Round {i}: describe {n} employees of a small bakery as JSON: name, age and role."


async def one(client: HybridClient, text: str, arm: str, max_tokens: int) -> dict[str, Any]:
    """One request of `arm` ("plain", "json", "call" or "call_model"): when its events came
    (ms)."""
    args: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0}
    if arm == "json":
        args["response_format"] = FORMAT
    elif arm in ("call", "call_model"):
        args["tools"] = [TOOL]
        args["tool_choice"] = MUST_CALL if arm == "call" else "required"
    partials: list[float] = []
    first_token = called = None
    async with client.stream(text, **args) as s:
        async for event in s.events():
            at = (event.t - s.trace.t_start) * 1e3
            if isinstance(event, PartialJSON):
                partials.append(at)
            elif isinstance(event, Token) and first_token is None:
                first_token = at
            elif isinstance(event, ToolCall) and called is None:
                called = at
    t = s.trace
    named = t.marks.get("call_opened")
    return {
        "partials": partials,
        "token_ms": first_token,
        "named_ms": None if named is None else (named - t.t_start) * 1e3,
        "call_ms": called,
        "finish": t.finish_reason,
        "completion_tokens": t.completion_tokens,
        "tpot_ms": t.produced_tpot_ms,
        "prompt_tokens": t.prompt_tokens,
        "cached": t.cached_prompt_tokens,
    }


async def run(model: str, rounds: int, max_tokens: int) -> dict[str, Any]:
    policy = Policy(name="bench", routing={"prefer": "local", "allow_cloud": False})
    rows: list[dict[str, Any]] = []
    async with HybridClient(local=LlamaCppEngine(model), policy=policy, router=None) as client:
        await one(client, prompt(999), "plain", 8)  # warm-up: the model loaded, not counted
        await one(client, prompt(998), "json", max_tokens)
        for i in range(rounds):
            # each arm its own first words, so none reuses another's prompt in the cache
            plain = await one(client, f"Ask {i}A. {prompt(i)}", "plain", max_tokens)
            shaped = await one(client, f"Ask {i}B. {prompt(i)}", "json", max_tokens)
            call = await one(client, f"Ask {i}C. {prompt(i)}", "call", max_tokens)
            by_model = await one(client, f"Ask {i}D. {prompt(i)}", "call_model", max_tokens)
            row = {"plain": plain, "json": shaped, "call": call, "call_model": by_model}
            rows.append(row)
    return {"cpu": cpu_model(), "model": model, "rounds": rows, "max_tokens": max_tokens}


def _q(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def render(res: dict[str, Any]) -> str:
    rows = res["rounds"]
    plain = [r["plain"]["token_ms"] for r in rows]
    first = [r["json"]["partials"][0] for r in rows if r["json"]["partials"]]
    last = [r["json"]["partials"][-1] for r in rows if r["json"]["partials"]]
    whole = [r["json"]["token_ms"] for r in rows]
    lag = [r["json"]["partials"][0] - r["plain"]["token_ms"] for r in rows if r["json"]["partials"]]
    counts = [len(r["json"]["partials"]) for r in rows]
    lines = [
        f"CPU: {res['cpu']}; model {res['model']}; {len(rows)} rounds, max_tokens "
        f"{res['max_tokens']}, greedy, local engine alone, interleaved",
        "| measure | p50 ms | p90 ms |",
        "|---|---|---|",
    ]
    for name, values in (
        ("plain text: first Token (TTFT)", plain),
        ("JSON: first PartialJSON", first),
        ("JSON: first PartialJSON - plain TTFT (same round)", lag),
        ("JSON: last PartialJSON", last),
        ("JSON: the whole answer (its one Token)", whole),
    ):
        p50, p90 = _q(values)
        lines.append(f"| {name} | {p50:.1f} | {p90:.1f} |")
    lines.append(f"snapshots per answer: median {statistics.median(counts):.0f}")
    lines += call_lines(rows, "call", "opened with the prompt")
    return "\n".join(lines + call_lines(rows, "call_model", "the model writing its opening"))


def call_lines(rows: list[dict[str, Any]], arm: str, title: str) -> list[str]:
    """A tool-call arm: times, and the call's cost beyond its own decode."""
    calls = [r for r in rows if r.get(arm, {}).get("call_ms") is not None]
    if not calls:
        return []

    def beyond(r: dict[str, Any]) -> float:
        own = (r[arm]["completion_tokens"] or 0) * (r["plain"]["tpot_ms"] or 0.0)
        return float((r[arm]["call_ms"] - own) / r["plain"]["token_ms"])

    lines = ["", f"| tool call, {title} | p50 | p90 |", "|---|---|---|"]
    for name, values in (
        ("its name (call_opened), ms", [r[arm]["named_ms"] for r in calls]),
        ("the whole checked call (ToolCall), ms", [r[arm]["call_ms"] for r in calls]),
        ("its completion tokens", [r[arm]["completion_tokens"] or 0 for r in calls]),
        ("plain TPOT (same round), ms", [r["plain"]["tpot_ms"] or 0.0 for r in calls]),
        ("(call - its tokens x plain TPOT) / plain TTFT", [beyond(r) for r in calls]),
        ("its prompt tokens", [r[arm]["prompt_tokens"] or 0 for r in calls]),
        ("of them found cached", [r[arm]["cached"] or 0 for r in calls]),
    ):
        p50, p90 = _q([float(v) for v in values])
        lines.append(f"| {name} | {p50:.2f} | {p90:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = anyio.run(run, args.model, args.rounds, args.max_tokens)
    report(res, render, args.json)


if __name__ == "__main__":
    main()
