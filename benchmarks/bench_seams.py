"""Seams, graded (issue 43): answers joined by each joining plan, per cloud continuation dialect.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_seams.py [--after 3 6] [--json PATH]
        [--dialects continue_final_message trailing_assistant instruction auto]
        [--plans cloud local handoff cloud-fails local-fails speculative cascade]
        [--sets sequences prose] [--limit N] [--server serve-model|llama-cpp]

The local engine is Qwen2.5-Coder 0.5B through llama-cpp-python. The stand-in cloud
(`--server`) is `hybridllm serve-model` (vLLM's dialects: `continue_final_message`) or
llama-cpp-python's own server (`llama-cpp`: only the instruction and raw completions) on
loopback, serving the same model (the cloud engine has its chat template, read from the GGUF,
for the `raw_completion` dialect), reached through a `FaultProxy`
(no fault but where a plan injects one), every request on its own connection. Each runs one
thread, and both share this machine's two cores. Greedy decoding, max_tokens 100, privacy off
(seams are measured, not privacy: every prompt may reach the cloud).

Two sets of prompts (`--limit N`: the first N of each):
- sequences: the right answer is a fixed sequence (counting, letters, days, months, a
  countdown, primes, multiples);
- prose: a fixed length asked ("Write three sentences about ...", "List four ... as a
  numbered list").

The plans (`--plans`); N is each `--after`; those marked * run in each dialect, the others once
(the local engine continues there, so the cloud's dialect plays no part):
- cloud, local: each engine alone (the references);
- handoff*: `plan="handoff"` after N local tokens, the cloud continuing;
- cloud-fails: failover cloud -> local mid-stream (`prefer = "cloud"`): the proxy resets the
  cloud's response after N content deltas (`_seam_faults.cloud_cut`), the SDK's failover has
  the local engine continue the delivered text;
- local-fails*: failover local -> cloud mid-stream (`prefer = "local"`): an injected fault
  (`_seam_faults.InjectedLocalFault`) fails the real local engine after N text deltas;
- speculative: `plan="speculative"`; after N delivered tokens the proxy resets every later
  cloud call, so a verification fails and the local engine continues the committed text (a
  round commits several tokens at once: the seam is where the round in flight then ends);
- cascade*: `plan="cascade"` with the shipped router and `router_threshold = 1` (the local
  answer is always released); it holds 2 tokens (fewer for N < 3), the released answer fails by
  the injected fault so that the seam comes after about N tokens, the cloud continuing.

The seam is where the code says the answer moved: each `Trace.switches` record's
`delivered_chars`, and a handoff's `Trace.handoff.local_chars` once it switched. Graded per
row:
- sequences: exact when the answer's items (words and numbers, in order) begin with the whole
  sequence: nothing doubled, skipped or restarted at the seam;
- prose, seam defects per 100 joins, by code at each seam (the text before it, the text after):
  doubled: the last 1-4 words before the seam are the first words after it (case-insensitive);
  restart: the first words after the seam (up to 3) are the answer's first words (then it is
  not counted as doubled too);
  spacing: two spaces across the seam, or a missing one: an engine alone (same model, greedy)
  that wrote the same text up to the seam puts a space where the continuation puts a letter
  or digit (without such a reference: a lower-case letter glued to an upper-case one);
  and once per joined answer: stop: it ends without terminal punctuation (. ! ? ..., after
  closing quotes or brackets; a closed code fence or a numbered item as last line counts as
  an end) while finish_reason is "stop"; numbering: its numbered lines are not 1..n in order.
  The references have no seam: their stop and numbering defects are per 100 answers;
- prose, the length asked given: sentences counted by terminal punctuation (numbered-line
  markers left out), items by numbered lines;
- joins (answers with a seam; a fault after the answer's end makes none), failures (the
  request ended in an error), the seams the check cut by kind (`Trace.seams`: clean / overlap /
  restart; the cascade's release of its held text is one too) and the hold the check added
  at the seam (P50 / P95 ms).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from benchmarks._report import cpu_model, report
from benchmarks._seam_faults import InjectedLocalFault, cloud_cut
from hybridllm import ChatTemplate, HybridClient, OpenAIEngine, Policy, Token
from hybridllm.errors import HybridError
from hybridllm.local.resolve import resolve_model
from hybridllm.runtime.trace import Trace
from hybridllm.testing import FaultProxy, Faults, HybridServer, LlamaServer

API_KEY, ALIAS, MAX_TOKENS = "sk-bench", "cloud", 100
CASCADE_HOLD = 2  # tokens the cascade holds before it releases the local answer
DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
MONTHS = (
    "january february march april may june july august september october november december"
).split()
SEQUENCES: list[tuple[str, list[str]]] = [
    ("Count from 1 to 20, separated by commas.", [str(i) for i in range(1, 21)]),
    ("Count down from 20 to 1, separated by commas.", [str(i) for i in range(20, 0, -1)]),
    (
        "List the letters of the alphabet from A to P, separated by spaces.",
        list("abcdefghijklmnop"),
    ),
    ("Name the days of the week from Monday to Sunday, separated by commas.", DAYS),
    ("Name the months of the year from January to December, separated by commas.", MONTHS),
    ("List the first 10 prime numbers, separated by commas.", "2 3 5 7 11 13 17 19 23 29".split()),
    (
        "Write the multiples of 7 from 7 to 70, separated by commas.",
        [str(7 * i) for i in range(1, 11)],
    ),
]
Unit = Literal["sentences", "items"]
PROSE: list[tuple[str, Unit, int]] = [
    ("Write three sentences about lighthouses.", "sentences", 3),
    ("List four fruits as a numbered list.", "items", 4),
    ("Give two reasons to learn to swim, in two sentences.", "sentences", 2),
    ("List three planets of the solar system as a numbered list.", "items", 3),
    ("Describe a rainy morning in three sentences.", "sentences", 3),
    ("List five colours of the rainbow as a numbered list.", "items", 5),
    ("Write two sentences about the moon.", "sentences", 2),
    ("Give three tips for better sleep as a numbered list, one short line each.", "items", 3),
]
PLANS = ("cloud", "local", "handoff", "cloud-fails", "local-fails", "speculative", "cascade")
PER_DIALECT = ("handoff", "local-fails", "cascade")  # the cloud continues: its dialect matters
DEFECTS = ("doubled", "restart", "spacing", "stop", "numbering")
SEAM_ONLY = ("doubled", "restart", "spacing")  # graded at a seam: none for an engine alone

WORD = re.compile(r"[A-Za-z0-9']+")
NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+\S", re.M)
MARKER = re.compile(r"^\s*\d+[.)]\s+", re.M)
SENTENCE_END = re.compile(r"[.!?…]+(?=[\s\"')\]*»]|$)")
CLOSERS = "\"')]*»”’"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- graders ----------------------------------------------------------------------------------


def exact(text: str, expected: list[str]) -> bool:
    """The answer's items (words, numbers) begin with the whole expected sequence."""
    items = [w.lower() for w in re.findall(r"[A-Za-z]+|\d+", text)]
    start = items.index(expected[0]) if expected[0] in items else 0  # "Sure: 1, 2, ..."
    return items[start : start + len(expected)] == expected


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def doubled(before: str, after: str) -> bool:
    """The last 1-4 words before the seam come again right after it."""
    b, a = words(before), words(after)
    return any(b[-k:] == a[:k] for k in range(1, min(4, len(b), len(a)) + 1))


def restarted(before: str, after: str) -> bool:
    """The continuation begins the answer again: its first words (up to 3) are the answer's."""
    b, a = words(before), words(after)
    m = min(3, len(b))
    return m > 0 and a[:m] == b[:m]


def bad_spacing(before: str, after: str, refs: list[str]) -> bool:
    """Two spaces across the seam, or a missing one (see the module docstring)."""
    if before.endswith(" ") and after.startswith(" "):
        return True
    if not (before[-1:].isalnum() or before[-1:] in ".,;:!?") or not after[:1].isalnum():
        return False
    for ref in refs:
        if len(ref) > len(before) and ref.startswith(before):
            return ref[len(before)] == " "
    return before[-1:].islower() and after[:1].isupper()


def stopped_mid_sentence(text: str, finish: str | None) -> bool:
    """finish "stop", and the answer ends without terminal punctuation (a closed code fence or
    a numbered item as its last line is an end)."""
    tail = text.rstrip()
    if finish != "stop" or not tail or tail.endswith("```"):
        return False
    if NUMBERED.match(tail.splitlines()[-1]):
        return False
    return not tail.rstrip(CLOSERS).endswith((".", "!", "?", "…"))


def numbering_changed(text: str) -> bool:
    """Numbered lines that are not 1..n in order."""
    nums = [int(n) for n in NUMBERED.findall(text)]
    return bool(nums) and nums != list(range(1, len(nums) + 1))


def seam_defects(
    text: str, cuts: list[int], finish: str | None, refs: list[str], reference: bool = False
) -> list[str]:
    """The defects of an answer: per seam (`cuts`: the characters before each), and once for
    the whole answer where it has a seam, or is a `reference` (an engine alone)."""
    found: list[str] = []
    for p in cuts:
        before, after = text[:p], text[p:]
        again = restarted(before, after)  # a restart is no doubling too, however short
        found += ["restart"] if again else ["doubled"] if doubled(before, after) else []
        found += ["spacing"] if bad_spacing(before, after, refs) else []
    if cuts or reference:
        found += ["stop"] if stopped_mid_sentence(text, finish) else []
        found += ["numbering"] if numbering_changed(text) else []
    return found


def length_given(text: str, unit: Unit, n: int) -> bool:
    """Sentences by terminal punctuation (numbered-line markers left out); items by numbered
    lines."""
    if unit == "items":
        return len(NUMBERED.findall(text)) == n
    return len(SENTENCE_END.findall(MARKER.sub("", text))) == n


def seam_cuts(trace: Trace) -> list[int]:
    """The characters delivered before each seam: the switches, and a handoff that switched."""
    cuts = {sw.delivered_chars for sw in trace.switches}
    if trace.handoff is not None and trace.handoff.switched_t is not None:
        cuts.add(trace.handoff.local_chars)
    return sorted(c for c in cuts if c > 0)


# ---- plans ------------------------------------------------------------------------------------

Fault = Literal["none", "cloud_cut", "local", "verifier"]


@dataclass(frozen=True)
class Plan:
    key: str  # its `--plans` name
    name: str  # the row
    kw: dict[str, Any]  # the stream() arguments
    fault: Fault = "none"
    after: int = 0  # tokens before the fault
    router: bool = False  # a client with the shipped router (the cascade)
    hold: int = 0  # the tokens the cascade holds (delivered before its fault counts)


def plans_for(args: argparse.Namespace, dialect: str, pol: Policy) -> list[Plan]:
    """The plans to run in `dialect`: those the dialect changes, and the others in the first."""
    first = dialect == args.dialects[0]
    out = [Plan(k, f"{k} alone", {"engine": k}) for k in ("cloud", "local") if first]
    for n in args.after:
        cloud_first = pol.with_(routing={"prefer": "cloud"})
        hold = max(1, min(CASCADE_HOLD, n - 1))
        cascade = pol.with_(
            plans=("single", "hedge", "cascade"),
            routing={"router_threshold": 1.0},
            cascade={"hold_tokens": hold},
        )
        out += [
            Plan("handoff", f"handoff after {n}, {dialect}",
                 {"plan": "handoff", "policy": pol.with_(handoff={"after_tokens": n})}),
            Plan("cloud-fails", f"cloud fails after {n} -> local", {"policy": cloud_first},
                 "cloud_cut", n),
            Plan("local-fails", f"local fails after {n} -> cloud, {dialect}", {}, "local", n),
            Plan("speculative", f"speculative, verifier fails after {n}",
                 {"plan": "speculative"}, "verifier", n),
            Plan("cascade", f"cascade, local fails after {n}, {dialect}",
                 {"plan": "cascade", "policy": cascade}, "local", n, router=True, hold=hold),
        ]  # fmt: skip
    keep = [p for p in out if p.key in args.plans]
    return [p for p in keep if first or p.key in PER_DIALECT]


@dataclass
class Rig:
    """The engines, the proxy in front of the cloud, and the faults armed per request."""

    srv: LlamaServer  # HybridServer is one
    proxy: FaultProxy
    local: InjectedLocalFault
    pol: Policy
    router: Any = None
    refs: dict[str, list[str]] = field(default_factory=dict)  # prompt -> the engines alone
    template: ChatTemplate | None = None  # the served model's (the raw_completion dialect)

    @asynccontextmanager
    async def client(self, dialect: str, router: bool) -> AsyncIterator[HybridClient]:
        cloud = OpenAIEngine(
            base_url=self.proxy.url + "/v1",
            api_key=API_KEY,
            model=ALIAS,
            continuation=dialect,  # type: ignore[arg-type]
            default_headers={"Connection": "close"},  # one connection per request
            chat_template=self.template,
        )
        use = self.router if router else None
        async with HybridClient(local=self.local, cloud=cloud, policy=self.pol, router=use) as c:
            yield c

    async def arm(self, plan: Plan, prompt: str) -> None:
        if plan.fault == "local":
            self.local.fail_after = max(1, plan.after - plan.hold)
        elif plan.fault == "cloud_cut":
            body = {
                "model": ALIAS,
                "messages": [{"role": "user", "content": prompt}],
                "stream": True,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "top_p": self.pol.sampling.top_p,
                "stream_options": {"include_usage": True},
            }
            cut = await anyio.to_thread.run_sync(
                cloud_cut, self.srv.port, body, API_KEY, plan.after
            )
            self.proxy.faults = Faults() if cut is None else Faults(reset_after_bytes=cut)

    def on_token(self, plan: Plan, n: int) -> None:
        if plan.fault == "verifier" and n == plan.after:
            self.proxy.faults = Faults(reset_after_bytes=0)  # every later cloud call is reset

    def disarm(self) -> None:
        self.proxy.faults = Faults()
        self.local.fail_after = None


# ---- running ----------------------------------------------------------------------------------


@dataclass
class Result:
    prompt: str
    text: str
    trace: Trace
    cuts: list[int]
    exact: bool | None = None  # sequences
    defects: list[str] = field(default_factory=list)  # prose
    length_ok: bool | None = None  # prose


async def one(rig: Rig, client: HybridClient, plan: Plan, prompt: str) -> tuple[str, Trace]:
    """The answer's text and trace; an error ends it (the trace says which)."""
    texts: list[str] = []
    await rig.arm(plan, prompt)
    try:
        async with client.stream(prompt, **plan.kw) as s:
            try:
                async for e in s.events():
                    if isinstance(e, Token):
                        texts.append(e.text)
                        rig.on_token(plan, len(texts))
            except HybridError as exc:  # the trace keeps it: a failure
                log(f"  {plan.name}: {type(exc).__name__}: {exc}")
    finally:
        rig.disarm()
    return "".join(texts), s.trace


async def graded(
    rig: Rig, client: HybridClient, plan: Plan, sets: list[str], limit: int | None
) -> list[Result]:
    out = []
    for prompt, expected in SEQUENCES[:limit] if "sequences" in sets else []:
        text, trace = await one(rig, client, plan, prompt)
        out.append(Result(prompt, text, trace, seam_cuts(trace), exact=exact(text, expected)))
        log(f"  {plan.name}: {out[-1].exact} {out[-1].cuts} {text[:70]!r}")
    for prompt, unit, n in PROSE[:limit] if "prose" in sets else []:
        text, trace = await one(rig, client, plan, prompt)
        r = Result(prompt, text, trace, seam_cuts(trace), length_ok=length_given(text, unit, n))
        ref = plan.key in ("cloud", "local")
        refs = [] if ref else rig.refs.get(prompt, [])
        r.defects = seam_defects(text, r.cuts, trace.finish_reason, refs, ref)
        out.append(r)
        log(f"  {plan.name}: {r.defects} {r.cuts} {text[:70]!r}")
    if plan.key in ("cloud", "local"):
        for r in out:
            rig.refs.setdefault(r.prompt, []).append(r.text)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    pol = Policy(name="seams").with_(
        routing={"prefer": "local", "retries": 0, "stall_ms": 20000},
        privacy={"mode": "off"},  # seams, not privacy: every prompt may reach the cloud
        sampling={"max_tokens": MAX_TOKENS, "temperature": 0},
    )
    rows: list[dict[str, Any]] = []
    server = HybridServer if args.server == "serve-model" else LlamaServer
    with (
        server(path, alias=ALIAS, api_key=API_KEY, n_ctx=2048, n_threads=1) as srv,
        FaultProxy(upstream=("127.0.0.1", srv.port)) as proxy,
    ):
        rig = Rig(srv, proxy, InjectedLocalFault(path, n_ctx=2048, n_threads=1), pol)
        rig.template = ChatTemplate.of_gguf(path)
        if "cascade" in args.plans:
            from hybridllm.routing import Router

            rig.router = Router.load()
        for dialect in args.dialects:
            plans = plans_for(args, dialect, pol)
            for router in (False, True):
                todo = [p for p in plans if p.router == router]
                if not todo:
                    continue
                async with rig.client(dialect, router) as client:
                    for plan in todo:
                        results = await graded(rig, client, plan, args.sets, args.limit)
                        rows.append(row(plan, results))
    return {"cpu": cpu_model(), "server": args.server, "rows": rows}


# ---- the report -------------------------------------------------------------------------------


def row(plan: Plan, results: list[Result]) -> dict[str, Any]:
    seams = [r for x in results for r in x.trace.seams]
    held = sorted(r.held_ms for r in seams) or [0.0]
    seq = [x for x in results if x.exact is not None]
    prose = [x for x in results if x.length_ok is not None]
    joins = sum(len(x.cuts) for x in prose)
    alone = plan.key in ("cloud", "local")
    per = len(prose) if alone else joins
    return {
        "plan": plan.name,
        "n": len(results),
        "joined": sum(bool(x.cuts) for x in results),
        "exact": [sum(bool(x.exact) for x in seq), len(seq)],
        "prose_joins": joins,
        "defects_per_100": {
            d: round(100 * sum(x.defects.count(d) for x in prose) / per, 1)
            if per and not (alone and d in SEAM_ONLY)
            else None
            for d in DEFECTS
        },
        "length_given": [sum(bool(x.length_ok) for x in prose), len(prose)],
        "failed": sum(x.trace.error is not None for x in results),
        "seams": {k: sum(r.kind == k for r in seams) for k in ("clean", "overlap", "restart")},
        "held_p50_ms": round(statistics.median(held), 1),
        "held_p95_ms": round(held[min(len(held) - 1, int(0.95 * len(held)))], 1),
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"CPU: {res['cpu']}; stand-in cloud: {res.get('server', 'serve-model')}",
        "",
        "defects per 100 prose joins (engines alone: per 100 answers): doubled restart "
        "spacing stop numbering",
        f"{'plan':<52} joined  exact  defects/100 dbl/rst/spc/stop/num  length  failed  "
        "seams c/o/r  hold P50/P95 ms",
    ]
    for r in res["rows"]:
        d, s = r["defects_per_100"], r["seams"]
        per = "/".join("-" if d[k] is None else f"{d[k]:g}" for k in DEFECTS)
        lines.append(
            f"{r['plan']:<52} {r['joined']:>2}/{r['n']:<3} {_frac(r['exact']):>6}  "
            f"{per:<32} {_frac(r['length_given']):>6}  {r['failed']:>6}  "
            f"{s['clean']}/{s['overlap']}/{s['restart']:<9} "
            f"{r['held_p50_ms']} / {r['held_p95_ms']}"
        )
    return "\n".join(lines)


def _frac(pair: list[int]) -> str:
    return "-" if not pair[1] else f"{pair[0]}/{pair[1]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--after", type=int, nargs="+", default=[3, 6])
    ap.add_argument(
        "--dialects",
        nargs="+",
        default=["continue_final_message", "trailing_assistant", "instruction", "auto"],
    )
    ap.add_argument("--plans", nargs="+", choices=PLANS, default=list(PLANS))
    ap.add_argument(
        "--sets", nargs="+", choices=("sequences", "prose"), default=["sequences", "prose"]
    )
    ap.add_argument("--limit", type=int, help="the first N prompts of each set (smoke runs)")
    ap.add_argument("--server", choices=("serve-model", "llama-cpp"), default="serve-model")
    ap.add_argument("--json")
    args = ap.parse_args()
    report(anyio.run(run, args), render, args.json)


if __name__ == "__main__":
    main()
