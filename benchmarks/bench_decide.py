"""How long the routing decision takes, from the request to the `Decision`.

    python benchmarks/bench_decide.py [--n 20000] [--json PATH]

Times `Gatherer.decide()` as `HybridClient.stream()` calls it: the prompt-token estimate, the
router's score and threshold, a privacy scan, the budget check, a latency prediction per engine
(a trained `LatencyModel`), the circuit breaker and `decide()` itself. The router here is
`StandInRouter`, a cheap stand-in (a logistic function of a few length and keyword features),
NOT the trained classifier: rerun with the real router (`--router real`, once
`hybridllm.routing.router.Router.load()` exists) for the issue's figure. The privacy scan is a
stand-in too (two regular expressions). Prompts vary from a few words to about 2,000 tokens.

Reported: p50, p99 and max microseconds of wall time, of the thread's CPU time (what the code
costs, without the time slices a loaded machine takes away), and `decide()` alone (same run).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import re
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from hybridllm import Policy
from hybridllm.engines import GenerationRequest
from hybridllm.policy import resolve_policy
from hybridllm.routing import BudgetVerdict, decide
from hybridllm.runtime.gather import Gatherer
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.runtime.latency import LatencyModel
from hybridllm.testing import ScriptedEngine


class StandInRouter:
    """A stand-in for the trained router: cheap features, a fixed logistic function."""

    KEYWORDS = ("prove", "derive", "integral", "theorem", "optimise", "optimize", "complexity")

    def score(self, messages: Sequence[Mapping[str, str]]) -> float:
        text = messages[-1]["content"].lower()
        hits = sum(k in text for k in self.KEYWORDS)
        x = 0.002 * len(text) + 1.5 * hits - 1.0
        return 1.0 / (1.0 + math.exp(-x))

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        return 0.5 if cloud_share is None else 1.0 - cloud_share


class StandInScan:
    PATTERNS = {
        "email": re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+"),
        "api_key": re.compile(r"\bsk-[A-Za-z0-9]{16,}"),
    }

    def __call__(
        self, messages: Sequence[Mapping[str, str]], *, deep: bool = True
    ) -> Collection[str]:
        text = "\n".join(str(m.get("content", "")) for m in messages)
        return {kind for kind, rx in self.PATTERNS.items() if rx.search(text)}


class StandInBudget:
    def check(self, policy: Policy, prompt_tokens: int, max_tokens: int) -> BudgetVerdict:
        cost = (prompt_tokens * 0.15 + max_tokens * 0.6) / 1e6
        return BudgetVerdict(cost <= 0.01, f"request cap 0.01 USD, worst case {cost:.4f} USD")


def prompts(rng: random.Random, n: int) -> list[GenerationRequest]:
    words = "the of prove integral code write a function email me at x@y.org sk-abcdefghijklmnopq"
    vocab = words.split()
    out = []
    for _ in range(n):
        k = int(rng.choice([3, 10, 50, 200, 800, 1500]) * rng.uniform(0.5, 1.5))
        text = " ".join(rng.choice(vocab) for _ in range(k))
        out.append(GenerationRequest([{"role": "user", "content": text}], max_tokens=256))
    return out


def trained_model(rng: random.Random) -> LatencyModel:
    model = LatencyModel()
    for _ in range(48):
        n = rng.randint(10, 800)
        model.engine("local").observe(n, 0.03 + n / 120 + rng.gauss(0, 0.01), tpot_s=0.05)
        model.engine("cloud").observe(n, rng.lognormvariate(-1.9, 0.8), rtt_s=0.1, tpot_s=0.02)
    return model


def router_of(kind: str) -> Any:
    if kind == "stand-in":
        return StandInRouter()
    module = importlib.import_module("hybridllm.routing.router")
    return module.Router.load()


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


def run(n: int, router_kind: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    routing = Gatherer(trained_model(rng), router_of(router_kind), StandInBudget(), StandInScan())
    engines = {"local": ScriptedEngine("local"), "cloud": ScriptedEngine("cloud")}
    breakers = {"local": CircuitBreaker(), "cloud": CircuitBreaker()}
    names = ["chat", "code-completion", "translation", "voice-assistant", "batch", "private"]
    policies = [resolve_policy(name).with_(privacy={"mode": "keep-local"}) for name in names]
    reqs = prompts(rng, 500)
    for r in reqs[:200]:  # warm caches (regex compile, first calls)
        routing.decide(r, policies[0], engines, breakers)
    full: list[float] = []
    full_cpu: list[float] = []
    pure: list[float] = []
    pure_cpu: list[float] = []
    for i in range(n):
        req, pol = reqs[i % len(reqs)], policies[i % len(policies)]
        c0, t0 = time.thread_time(), time.perf_counter()
        decision, facts, state = routing.decide(req, pol, engines, breakers)
        t1, c1 = time.perf_counter(), time.thread_time()
        decide(facts, pol, state)
        t2, c2 = time.perf_counter(), time.thread_time()
        full.append((t1 - t0) * 1e6)
        full_cpu.append((c1 - c0) * 1e6)
        pure.append((t2 - t1) * 1e6)
        pure_cpu.append((c2 - c1) * 1e6)

    def stats(xs: list[float]) -> dict[str, float]:
        return {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "max": max(xs)}

    return {
        "n": n,
        "router": router_kind,
        "routing_decide_us": stats(full),
        "routing_decide_cpu_us": stats(full_cpu),
        "decide_only_us": stats(pure),
        "decide_only_cpu_us": stats(pure_cpu),
        "load_average": os.getloadavg(),
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--router", choices=["stand-in", "real"], default="stand-in")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    res = run(args.n, args.router, args.seed)
    keys = ("routing_decide_us", "routing_decide_cpu_us", "decide_only_us", "decide_only_cpu_us")
    for key in keys:
        f = res[key]
        print(f"{key:<22} p50 {f['p50']:7.1f}  p99 {f['p99']:7.1f}  max {f['max']:8.1f}  µs")
    load = ", ".join(f"{x:.1f}" for x in res["load_average"])
    print(f"router: {res['router']}; n={res['n']}; load average {load} (on this machine's cores)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    cli()
