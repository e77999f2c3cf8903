"""Soak: N mixed requests through `HybridClient` with faults drawn at random per request.

Both engines are real: the local `LlamaCppEngine` on SmolLM2 and the cloud `OpenAIEngine` at
the loopback stand-in (`hybridllm serve-model`, SmolLM2 too) through a `FaultProxy`. A few workers
run at once, each with its own client and proxy (the proxy's faults are per proxy, so one
worker's fault never lands on another's request); they share one budget `SQLiteLedger` and one
`DecisionLog`.

Every request draws, from one seeded RNG, a policy, a prompt (some hold a secret under
`privacy="keep-local"`), a way for the app to read it (typed events, bare tokens) and whether
the app leaves early (`break` after a few tokens, or a cancel scope after a random time), and a
fault: none, a first-byte stall, a slow drip, a reset (at a random byte), HTTP 500, HTTP 429
with Retry-After, malformed SSE, keep-alives only (finite or without end).

Checked for every request:
- it ends (a complete answer, a typed `HybridError`, or the app left) within the policy's
  first-token deadline plus `BOUND_S`; an app that leaves sees its request stopped within
  `STOP_BOUND_S`;
- no text is lost or duplicated: the Token events are the app's text, the trace counted as many
  tokens as the app got, and at each mid-stream failover the trace's delivered count is what the
  app had, and the continuation does not start over with the delivered prefix;
- the budget's settled spend plus open reservations never pass the cap;
- no secret (the API key, the text of a keep-local prompt) is in the logs, the traces, the events,
  the decision log; a keep-local prompt's secret never reaches the network.
After the run nothing is left over: asyncio tasks, threads, sockets and file descriptors return
to what they were before the clients were opened (see `_Resources` for the tolerance).

Knobs: HYBRIDLLM_SOAK_N (requests, default 200), HYBRIDLLM_SOAK_SEED (default 13),
HYBRIDLLM_SOAK_WORKERS (concurrent requests, default 3). The table is printed at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from hybridllm import (
    Fallback,
    HybridClient,
    HybridError,
    LlamaCppEngine,
    OpenAIEngine,
    Policy,
    Token,
)
from hybridllm.events import Done, Event
from hybridllm.guard.budget import Cap, SQLiteLedger
from hybridllm.guard.prices import ModelPrice, Prices
from hybridllm.policy import resolve_policy
from hybridllm.routing.log import DecisionLog
from hybridllm.runtime.trace import Trace
from hybridllm.testing import FaultProxy, Faults, HybridServer
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SOAK_N = int(os.environ.get("HYBRIDLLM_SOAK_N", "200"))
SOAK_SEED = int(os.environ.get("HYBRIDLLM_SOAK_SEED", "13"))
WORKERS = int(os.environ.get("HYBRIDLLM_SOAK_WORKERS", "3"))

CLOUD_TIMEOUT_S = 3.0  # the OpenAIEngine's timeout (connect and between bytes)
# Past the policy's first-token deadline, a request may still: wait out an injected first-byte
# stall on a cloud-only policy (at most MAX_STALL_S) or the engine's timeout (keep-alives),
# then decode max_tokens (<= 12) on SmolLM2 sharing 2 cores with the server and the other
# workers (~1.5 s measured at worst), plus one failover (stall_ms <= 0.8 s and a new prefill).
MAX_STALL_S = 2.5
BOUND_S = CLOUD_TIMEOUT_S + 3.5
STOP_BOUND_S = 1.5  # an app that leaves: every engine stopped (the trace closed) within this
HANG_S = 60.0  # the harness's own guard: a request still running after this has hung

CAP_USD = 0.8  # a day cap, reached part way through the run
PRICES = Prices(default=ModelPrice(input_per_million=100.0, output_per_million=400.0))

POLICIES = (
    Policy(
        name="soak-local-first",
        privacy={"mode": "off"},  # a fault policy: its prompts carry no secret
        routing={"prefer": "local", "ttft_deadline_ms": 1200, "stall_ms": 800, "retries": 1},
        sampling={"max_tokens": 10},
    ),
    Policy(
        name="soak-cloud-first",
        privacy={"mode": "off"},  # a fault policy: its prompts carry no secret
        routing={"prefer": "cloud", "ttft_deadline_ms": 1000, "stall_ms": 700, "retries": 1},
        sampling={"max_tokens": 12},
    ),
    Policy(
        name="soak-hedge",
        privacy={"mode": "off"},  # a fault policy: its prompts carry no secret
        routing={"prefer": "cloud", "ttft_deadline_ms": 2000, "stall_ms": 800},
        hedge={"after_ms": 300},
        sampling={"max_tokens": 8},
    ),
    Policy(
        name="soak-cloud-only",
        privacy={"mode": "off"},  # a fault policy: its prompts carry no secret
        routing={
            "prefer": "cloud",
            "fallback_order": ("cloud",),
            "ttft_deadline_ms": 1500,
            "retries": 2,
        },
        sampling={"max_tokens": 8},
    ),
    resolve_policy("voice-assistant").with_(sampling={"max_tokens": 8}),  # a preset
    Policy(
        name="soak-private",
        routing={"prefer": "cloud", "ttft_deadline_ms": 1500, "stall_ms": 800},
        privacy={"mode": "keep-local"},
        sampling={"max_tokens": 8},
    ),
)
PROMPTS = (
    "Name one colour.",
    "What is 7 plus 5?",
    "Say hello in French.",
    "Give a synonym of happy.",
    "Write one short sentence about the sea.",
    "What is the capital of Italy?",
    "Name a fruit that is yellow.",
    "Describe a cat in five words.",
)
FAULT_WEIGHTS = {
    "none": 3,
    "stall": 1,
    "drip": 1,
    "reset": 2,
    "http500": 1,
    "http429": 1,
    "sse_garbage": 1,
    "keepalive": 1,
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One request, drawn before the run."""

    i: int
    policy: Policy
    prompt: str
    secret: str | None  # text that must stay local (keep-local prompts)
    fault: str
    faults: Faults
    read: str  # "events" (async with + events()) or "tokens" (bare async for)
    leave_after_tokens: int | None  # the app breaks out after this many tokens
    cancel_after_s: float | None  # the app's cancel scope fires after this long


@dataclasses.dataclass
class Result:
    spec: Spec
    outcome: str = "?"  # complete | error:<Type> | left | hung | untyped:<Type>
    elapsed_s: float = 0.0  # from stream() to the app done with it
    stopped_s: float | None = None  # after the app left: until the request's work ended
    over_deadline_s: float = 0.0
    duplicated: int = 0
    lost: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)
    switches: int = 0
    engines: tuple[str, ...] = ()
    error: str = ""  # the error that ended it, as the app saw it
    exposed: str = ""  # the trace and the non-Token events, as text (scanned for secrets)


def draw_fault(rng: random.Random, kind: str) -> Faults:
    seed = rng.randrange(2**31)
    if kind == "stall":
        return Faults(first_byte_stall_ms=rng.uniform(300, MAX_STALL_S * 1000), seed=seed)
    if kind == "drip":  # every chunk late by up to 0.5 s: tokens drip, some gaps pass stall_ms
        return Faults(latency_ms=30, jitter_ms=rng.uniform(150, 500), seed=seed)
    if kind == "reset":  # anywhere from the first byte to a few SSE chunks in
        return Faults(reset_after_bytes=rng.randrange(0, 1800), seed=seed)
    if kind == "http500":
        return Faults(http_status=500, fail_first=rng.choice((1, 2, None)), seed=seed)
    if kind == "http429":
        return Faults(http_status=429, retry_after_s=rng.choice((0.2, 1.0, 30.0)),
                      fail_first=rng.choice((1, None)), seed=seed)  # fmt: skip
    if kind == "sse_garbage":
        return Faults(sse_garbage=True, fail_first=rng.choice((1, None)), seed=seed)
    if kind == "keepalive":
        return Faults(keepalive_only_s=rng.choice((1.0, math.inf)), keepalive_interval_ms=100,
                      seed=seed)  # fmt: skip
    return Faults(seed=seed)


def draw_specs(n: int, seed: int) -> list[Spec]:
    rng = random.Random(seed)
    kinds, weights = zip(*FAULT_WEIGHTS.items(), strict=True)
    specs = []
    for i in range(n):
        policy = rng.choice(POLICIES)
        secret = None
        prompt = rng.choice(PROMPTS)
        if policy.privacy.mode != "off":
            secret = f"mara.soak{i}.{rng.randrange(10**6)}@example.org"
            prompt = f"My email is {secret}. {prompt}"
        kind = rng.choices(kinds, weights)[0]
        leave = rng.random()
        specs.append(
            Spec(
                i=i,
                policy=policy,
                prompt=prompt,
                secret=secret,
                fault=kind,
                faults=draw_fault(rng, kind),
                read="tokens" if rng.random() < 0.25 else "events",
                leave_after_tokens=rng.randint(1, 4) if leave < 0.12 else None,
                cancel_after_s=rng.uniform(0.05, 1.5) if 0.12 <= leave < 0.2 else None,
            )
        )
    return specs


# ---- one request --------------------------------------------------------------------------------


async def run_one(client: HybridClient, proxy: FaultProxy, spec: Spec) -> Result:
    proxy.faults = spec.faults
    res = Result(spec)
    events: list[Event] = []
    texts: list[str] = []  # what the app received, piece by piece
    traces: list[Trace] = []
    error: BaseException | None = None
    left_at: float | None = None
    trace: Trace | None = None
    t0 = time.perf_counter()
    with anyio.move_on_after(HANG_S) as guard:
        with anyio.CancelScope() as app_scope:
            if spec.cancel_after_s is not None:
                app_scope.deadline = anyio.current_time() + spec.cancel_after_s
            try:
                if spec.read == "events":
                    async with client.stream(spec.prompt, policy=spec.policy) as s:
                        trace = s.trace
                        async for event in s.events():
                            events.append(event)
                            if isinstance(event, Token):
                                texts.append(event.text)
                                if len(texts) == spec.leave_after_tokens:
                                    left_at = time.perf_counter()
                                    break
                else:
                    left_at = await read_tokens(client, spec, texts, traces)
            except HybridError as exc:
                error = exc
            except Exception as exc:  # anything else is a failure of the suite's subject
                error = exc
        if app_scope.cancelled_caught:
            left_at = time.perf_counter()
    t_end = time.perf_counter()
    res.elapsed_s = t_end - t0
    if guard.cancelled_caught:
        res.outcome = "hung"
        res.problems.append(f"no end after {HANG_S:.0f} s")
        return res
    trace = trace or (traces[0] if traces else None)
    if trace is None:  # stream() itself refused the request
        kind = "error" if isinstance(error, HybridError) else "untyped"
        res.outcome = f"{kind}:{type(error).__name__}"
        if kind == "untyped":
            res.problems.append(f"untyped refusal: {error!r}")
        return res
    res.exposed = "\n".join(
        [repr(trace), repr(trace.summary()), *(repr(e) for e in events if not isinstance(e, Token))]
    )
    if left_at is not None:  # the app left: the request's work must stop promptly
        with anyio.move_on_after(STOP_BOUND_S * 4):
            while trace.t_done is None:  # noqa: ASYNC110 (plain trace state, no event)
                await anyio.sleep(0.01)
        if trace.t_done is None:
            res.problems.append("still running long after the app left")
            res.stopped_s = math.inf
        else:
            res.stopped_s = max(0.0, trace.t_done - left_at)
        res.outcome = "left"
    elif error is not None:
        res.error = f"{type(error).__name__}: {error}"
        kind = "error" if isinstance(error, HybridError) else "untyped"
        res.outcome = f"{kind}:{type(error).__name__}"
    elif spec.read == "events" and not any(isinstance(e, Done) for e in events):
        res.outcome = "untyped:NoDone"
        res.problems.append("the events ended without Done or an error")
    else:
        res.outcome = "complete"
    if res.outcome.startswith("untyped"):
        res.problems.append(f"untyped end: {error!r}")
    deadline_s = (spec.policy.routing.ttft_deadline_ms or 0.0) / 1000.0
    res.over_deadline_s = max(0.0, res.elapsed_s - deadline_s)
    if res.outcome != "left" and res.over_deadline_s > BOUND_S:
        res.problems.append(f"ended {res.over_deadline_s:.2f} s past the deadline")
    if res.stopped_s is not None and res.stopped_s > STOP_BOUND_S:
        res.problems.append(f"stopped {res.stopped_s:.2f} s after the app left")
    check_text(res, trace, events, texts)
    return res


async def read_tokens(
    client: HybridClient, spec: Spec, texts: list[str], traces: list[Trace]
) -> float | None:
    """The bare form: `async for token in client.stream(...)`, left with `break` (the Stream's
    finaliser stops the work once this frame drops it)."""
    stream = client.stream(spec.prompt, policy=spec.policy)
    traces.append(stream.trace)
    left_at = None
    async for text in stream:
        texts.append(text)
        if len(texts) == spec.leave_after_tokens:
            left_at = time.perf_counter()
            break
    return left_at


def check_text(res: Result, trace: Trace, events: list[Event], texts: list[str]) -> None:
    """Nothing lost, nothing duplicated: the app's pieces against the Token events and the
    trace, and each mid-stream failover's seam against the delivered prefix."""
    res.switches = len(trace.switches)
    res.engines = tuple(trace.started)
    app_text = "".join(texts)
    finished = res.outcome != "left"
    if res.spec.read == "events":
        tokens = [e for e in events if isinstance(e, Token)]
        if "".join(t.text for t in tokens) != app_text:
            res.problems.append("the Token events differ from the app's text")
    # the trace counts a token when it is handed over; an app that left may not have read all
    counted = trace.n_tokens
    if finished and counted != len(texts):
        res.lost += abs(counted - len(texts))
        res.problems.append(f"trace counted {counted} tokens, the app got {len(texts)}")
    elif not finished and counted < len(texts):
        res.duplicated += len(texts) - counted
        res.problems.append(f"trace counted {counted} tokens, the app got {len(texts)}")
    if res.spec.read != "events":
        return
    # the mid-stream Fallback events, in order, with the characters the app had before each
    seams: list[tuple[int, str, str]] = []
    got = 0
    for e in events:
        if isinstance(e, Token):
            got += len(e.text)
        elif isinstance(e, Fallback) and got > 0:
            seams.append((got, e.from_engine, e.to_engine))
    if finished and len(seams) != len(trace.switches):
        res.problems.append(f"{len(seams)} mid-stream Fallback events, trace has {trace.switches}")
    for (got_before, src, dst), switch in zip(seams, trace.switches, strict=False):
        t_src, t_dst, delivered = switch.from_engine, switch.to_engine, switch.delivered_chars
        if (got_before, src, dst) != (delivered, t_src, t_dst):
            res.problems.append(
                f"seam: app had {got_before} chars at {src}->{dst}, trace says {delivered} "
                f"at {t_src}->{t_dst}"
            )
            res.lost += abs(got_before - delivered)
        prefix = app_text[:delivered].strip()
        after = app_text[delivered:].lstrip()
        if len(prefix) >= 3 and after.startswith(prefix):
            res.duplicated += len(prefix)
            res.problems.append(f"seam {t_src}->{t_dst}: the continuation repeats {prefix!r}")
    after_seam = [e for e in events if isinstance(e, Token)]
    if seams:
        n_before = 0
        got = 0
        for e in after_seam:
            if got >= seams[0][0]:
                break
            got += len(e.text)
            n_before += 1
        if any(t.engine != seams[0][2] for t in after_seam[n_before:]):
            res.problems.append("tokens after a failover came from the failed engine")


# ---- resources --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Resources:
    """What the process holds. Tolerance: threads are compared by identity except the idle
    worker pools that anyio (`to_thread`, "AnyIO worker thread") and asyncio (the default
    executor, "asyncio_N") keep for reuse and retire on their own after 10 s of idleness;
    asyncio tasks, sockets and file descriptors are compared exactly (the clients, engines and
    proxies are closed first, so their pools and listeners are gone too)."""

    threads: frozenset[tuple[int | None, str]]
    tasks: int
    sockets: int
    fds: int

    @classmethod
    def now(cls) -> _Resources:
        pooled = ("AnyIO worker thread", "asyncio_")
        threads = frozenset(
            (t.ident, t.name) for t in threading.enumerate() if not t.name.startswith(pooled)
        )
        fds = sockets = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the fd of the listing itself, closed by now
                continue
            fds += 1
            sockets += target.startswith("socket:")
        return cls(threads, len(asyncio.all_tasks()), sockets, fds)

    def leaks(self, before: _Resources) -> dict[str, int]:
        return {
            "threads": len(self.threads - before.threads),
            "tasks": max(0, self.tasks - before.tasks),
            "sockets": max(0, self.sockets - before.sockets),
            "fds": max(0, self.fds - before.fds),
        }


async def settled_leaks(before: _Resources, limit_s: float = 5.0) -> dict[str, int]:
    """Leaks once closing connections and finishing threads have had `limit_s` to end."""
    t_end = time.monotonic() + limit_s
    while True:
        leaks = _Resources.now().leaks(before)
        if not any(leaks.values()) or time.monotonic() > t_end:
            return leaks
        await anyio.sleep(0.05)


# ---- the soak -------------------------------------------------------------------------------


@pytest.fixture
def soak_proxies(cloud_server: HybridServer) -> Iterator[list[FaultProxy]]:
    proxies = [
        FaultProxy(upstream=("127.0.0.1", cloud_server.port), record=True) for _ in range(WORKERS)
    ]
    for p in proxies:
        p.start()
    try:
        yield proxies
    finally:
        for p in proxies:
            p.stop()


def make_client(
    model_path: Path, proxy: FaultProxy, ledger: SQLiteLedger, log: DecisionLog
) -> HybridClient:
    return HybridClient(
        local=LlamaCppEngine(model_path, n_ctx=1024, n_threads=1),
        cloud=OpenAIEngine(
            base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS, timeout=CLOUD_TIMEOUT_S
        ),
        router=None,
        ledger=ledger,
        prices=PRICES,
        budget_caps=[Cap(None, "day", CAP_USD)],
        decision_log=log,
    )


async def test_soak(
    model_path: Path,
    soak_proxies: list[FaultProxy],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    specs = draw_specs(SOAK_N, SOAK_SEED)
    ledger = SQLiteLedger(tmp_path / "spend.db")
    log = DecisionLog(tmp_path / "decisions.db")
    # warm up once, so the process-wide pieces (the llama thread, the SQLite connections, the
    # proxies' threads) exist before the baseline
    async with make_client(model_path, soak_proxies[0], ledger, log) as warm:
        await warm.complete("Say hi.", policy=POLICIES[1])
    await anyio.sleep(0.2)
    before = _Resources.now()
    results: list[Result] = []
    budget_peaks: list[float] = []
    queue = iter(specs)
    t_start = time.perf_counter()

    async def worker(w: int) -> None:
        async with make_client(model_path, soak_proxies[w], ledger, log) as client:
            for spec in queue:
                results.append(await run_one(client, soak_proxies[w], spec))
                s = ledger.spend("day")
                budget_peaks.append(s.settled_usd + s.reserved_usd)
            soak_proxies[w].faults = Faults()

    async def watch_budget() -> None:  # settled + held, every 50 ms while the soak runs
        while True:
            s = await anyio.to_thread.run_sync(ledger.spend, "day")
            budget_peaks.append(s.settled_usd + s.reserved_usd)
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as outer:
        outer.start_soon(watch_budget)
        async with anyio.create_task_group() as tg:
            for w in range(WORKERS):
                tg.start_soon(worker, w)
        outer.cancel_scope.cancel()
    wall_s = time.perf_counter() - t_start
    leaks = await settled_leaks(before)
    spent = ledger.spend("day")
    overrun = max(0.0, max(budget_peaks, default=0.0) - CAP_USD, spent.settled_usd - CAP_USD)

    secrets_found = scan_secrets(specs, results, soak_proxies, caplog, log, tmp_path)
    ledger.close()
    log.close()

    table = soak_table(results, wall_s, leaks, spent.settled_usd, overrun, secrets_found)
    with capsys.disabled():
        print("\n" + table)
    problems = [f"#{r.spec.i} ({r.spec.policy.name}, {r.spec.fault}): {p}"
                for r in results for p in r.problems]  # fmt: skip
    assert len(results) == SOAK_N
    assert not problems, "\n".join(problems[:40])
    assert leaks == {"threads": 0, "tasks": 0, "sockets": 0, "fds": 0}, leaks
    assert overrun == 0.0
    assert not secrets_found, secrets_found
    # the run did what it claims: faults of every kind, answers from both engines
    if SOAK_N >= 100:
        assert set(Counter(r.spec.fault for r in results)) == set(FAULT_WEIGHTS)
        assert any("cloud" in r.engines for r in results if r.outcome == "complete")
        assert any(r.outcome == "complete" and r.engines[-1:] == ("local",) for r in results)


def scan_secrets(
    specs: list[Spec],
    results: list[Result],
    proxies: list[FaultProxy],
    caplog: pytest.LogCaptureFixture,
    log: DecisionLog,
    tmp_path: Path,
) -> list[str]:
    """Where a secret was found: the API key or a keep-local prompt's text in the logs, the
    decision log (its rows and its files), or a keep-local secret in the bytes sent out."""
    found: list[str] = []
    private = [s.secret for s in specs if s.secret]
    logs = caplog.text + "\n".join(str(r.args) for r in caplog.records)
    rows = repr(log.rows())
    files = b"".join(p.read_bytes() for p in tmp_path.glob("decisions.db*"))
    sent = b"".join(h + b for p in proxies for h, b in p.requests())
    for secret in [API_KEY, *private]:
        if secret in logs:
            found.append(f"{secret!r} in the logs")
        if secret in rows or secret.encode() in files:
            found.append(f"{secret!r} in the decision log")
    # the scans can see: the key went out on every cloud request, and the logs are not empty
    assert API_KEY.encode() in sent and caplog.records and private
    for secret in private:
        if secret.encode() in sent:
            found.append(f"keep-local {secret!r} was sent to the cloud")
    for r in results:  # traces and events (not the Token events: the model may echo a prompt)
        for secret in [API_KEY, r.spec.secret or API_KEY]:
            if secret in r.exposed:
                found.append(f"{secret!r} in the trace or events of request #{r.spec.i}")
    return found


def soak_table(
    results: list[Result],
    wall_s: float,
    leaks: dict[str, int],
    spent: float,
    overrun: float,
    secrets: list[str],
) -> str:
    by_fault: dict[str, Counter[str]] = {}
    for r in results:
        by_fault.setdefault(r.spec.fault, Counter())[r.outcome] += 1
    outcomes = Counter(r.outcome for r in results)
    completed = [r for r in results if r.outcome != "left"]
    left = [r.stopped_s or 0.0 for r in results if r.outcome == "left"]
    lines = [
        f"soak: {len(results)} requests, {WORKERS} at a time, seed {SOAK_SEED}, "
        f"{wall_s:.1f} s wall",
        "faults (requests: outcomes):",
    ]
    for fault in FAULT_WEIGHTS:
        c = by_fault.get(fault, Counter())
        detail = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        lines.append(f"  {fault:<12} {sum(c.values()):>4}: {detail}")
    lines += [
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
        "policies: "
        + ", ".join(
            f"{k} {v}" for k, v in sorted(Counter(r.spec.policy.name for r in results).items())
        ),
        f"served by: cloud {sum(r.engines[-1:] == ('cloud',) for r in results)}, "
        f"local {sum(r.engines[-1:] == ('local',) for r in results)}; "
        f"mid-stream failovers {sum(r.switches for r in results)}",
        f"max time past the deadline: "
        f"{max((r.over_deadline_s for r in completed), default=0.0):.2f} s (bound {BOUND_S:.1f} s)",
        f"max stop time after the app left: {max(left, default=0.0):.2f} s "
        f"(bound {STOP_BOUND_S:.1f} s)",
        f"duplicated characters: {sum(r.duplicated for r in results)}, "
        f"lost: {sum(r.lost for r in results)}",
        "leaked resources: " + ", ".join(f"{k} {v}" for k, v in leaks.items()),
        f"budget: spent {spent:.4f} USD of a {CAP_USD:.2f} USD cap, overrun {overrun:.4f} USD",
        f"secrets found: {len(secrets)}",
        f"problems: {sum(len(r.problems) for r in results)}",
    ]
    # llama_cpp.server (interrupt_requests, on by default) ends a streaming answer with [DONE]
    # and no finish reason when another request waits for the model: the engine's typed
    # CloudProtocolError, not an injected fault
    unfaulted = [r for r in results if r.spec.fault == "none" and r.error]
    if unfaulted:
        lines.append("errors without an injected fault (the stand-in's interrupt_requests):")
    lines += [f"  #{r.spec.i} {r.spec.policy.name}: {r.error[:300]}"
              for r in unfaulted]  # fmt: skip
    return "\n".join(lines)
