"""`hybridllm demo`: stream requests through a local model and a cloud, live.

    hybridllm demo                   # the tour: router, fallback, handoff, cascade, speculative,
                                     # priorities, a tool call, a privacy refusal (demo_tour)
    hybridllm demo --quick           # three short requests
    hybridllm demo --no-cloud        # local only (the policies' scenarios)
    OPENAI_BASE_URL=... OPENAI_API_KEY=... hybridllm demo --model gpt-4o-mini   # a real cloud

Models are pulled (with a progress bar) when missing. Without a configured endpoint the demo
starts its own OpenAI-compatible "cloud" (`hybridllm serve-model` with Qwen2.5-Coder-1.5B on
127.0.0.1), behind a `FaultProxy` (the tour's fallback stalls it), and always stops it at the
end, on errors and on Ctrl-C too. That stand-in shares this machine's cores with the local
model, which the demo says: its latencies are not a real cloud's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TextIO

import anyio

from hybridllm.cli.demo_tour import Stage, TourRow, run_tour
from hybridllm.cli.progress import ProgressBar, render_table
from hybridllm.client import HybridClient
from hybridllm.engines import LlamaCppEngine, OpenAIEngine
from hybridllm.engines.base import Engine
from hybridllm.errors import ConfigError
from hybridllm.events import EngineName, ParallelStart, Route, Token
from hybridllm.guard.guarded import usd
from hybridllm.local import resolve, waitpolicy
from hybridllm.testing.hybrid_server import HybridServer
from hybridllm.testing.proxy import FaultProxy
from hybridllm.testing.server import free_port

DEFAULT_LOCAL_MODEL = "qwen2.5-coder-0.5b-instruct"
STANDIN_CLOUD_MODEL = "qwen2.5-coder-1.5b-instruct"
WARM_UP_PROMPT = (
    "This is a warm-up request. Reply with the single word OK and nothing else, please."
)


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: str
    prompt: str
    max_tokens: int
    engine: EngineName | None = None  # force an engine to show it; None: the policy decides
    quick: bool = False  # part of --quick


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "code-completion",
        "code-completion",
        "Complete this Python function. Reply with code only.\n\n"
        "def is_palindrome(s: str) -> bool:",
        64,
        quick=True,
    ),
    Scenario(
        "voice-assistant",
        "voice-assistant",
        "Hey, what's the capital of Australia? Answer in one short sentence.",
        48,
        quick=True,
    ),
    Scenario(
        "chat",
        "chat",
        "In two sentences: why combine a small local LLM with a bigger cloud model?",
        64,
        engine="cloud",
        quick=True,
    ),
    Scenario(
        "translation",
        "translation",
        "Translate into French: 'The train to Lyon leaves at half past eight.'",
        48,
    ),
    Scenario(
        "private",
        "private",
        "Summarise this note in one sentence: 'Dentist moved to Friday 9am, bring the "
        "insurance card and 40 euros for the co-pay.'",
        48,
    ),
    Scenario(
        "long-writing",
        "long-writing",
        "Write the opening paragraph of a short story about a lighthouse keeper who finds a "
        "message in a bottle.",
        96,
    ),
)
QUICK_MAX_TOKENS = 32
TOUR_MAX_TOKENS = 40
SHARED_CORES = (
    "note: the stand-in cloud runs on this machine, on the same {n} cores as the local model: "
    "its latencies include that contention (a plan that runs both engines at once slows both) "
    "and are not a real cloud's"
)


@dataclass(frozen=True)
class Row:
    scenario: str
    engine: str
    ttft_ms: float | None
    tpot_ms: float | None
    tokens: int
    total_ms: float | None
    parallel: str | None = None  # the engine started in parallel with the one preferred


# ---- terminal output ---------------------------------------------------------------------------


class Status:
    """`text ...` with a live elapsed time on a terminal; `text ... done (1.2 s)` at the end."""

    def __init__(self, text: str, out: TextIO) -> None:
        self.text = text
        self.out = out
        self.elapsed = 0.0
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Status:
        self._t0 = time.perf_counter()
        self.out.write(f"{self.text} ...")
        self.out.flush()
        if self.out.isatty():
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(0.1):
            self.out.write(f"\r{self.text} ... {time.perf_counter() - self._t0:5.1f} s")
            self.out.flush()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.elapsed = time.perf_counter() - self._t0
        outcome = "done" if et is None else "failed" if issubclass(et, Exception) else "stopped"
        result = f" {outcome} ({self.elapsed:.1f} s)"
        if self._thread is not None:  # redraw the line, erasing the ticking time
            result = f"\r{self.text} ...{result}\x1b[K"
        self.out.write(result + "\n")
        self.out.flush()


class AnswerWriter:
    """Streams answer text indented under its header, wrapping prose at word boundaries.

    Leading blank space is dropped; a piece that starts a new word (a leading space) moves to a
    new line when it would run past `width`, so code lines are left alone.
    """

    def __init__(self, out: TextIO, indent: str = "    ", width: int | None = None) -> None:
        self.out = out
        self.indent = indent
        self.width = width or min(shutil.get_terminal_size().columns, 100)
        self.started = False
        self.column = 0  # 0: at the start of a line

    def write(self, text: str) -> None:
        if not self.started:
            text = text.lstrip()
            if not text:
                return
            self.started = True
        for i, piece in enumerate(text.split("\n")):
            if i:
                self.out.write("\n")
                self.column = 0
            if self.column and piece.startswith(" ") and self.column + len(piece) > self.width:
                self.out.write("\n")
                self.column = 0
                piece = piece.lstrip(" ")
            if piece:
                if not self.column:
                    self.out.write(self.indent)
                    self.column = len(self.indent)
                self.out.write(piece)
                self.column += len(piece)
        self.out.flush()

    def end(self) -> None:
        if self.column:
            self.out.write("\n")
            self.column = 0
        self.out.flush()


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def format_table(rows: list[Row]) -> str:
    head = ("scenario", "engine", "TTFT ms", "TPOT ms", "tokens", "total ms", "parallel")
    cells = [
        (
            r.scenario,
            r.engine,
            _ms(r.ttft_ms),
            _ms(r.tpot_ms),
            str(r.tokens),
            _ms(r.total_ms),
            r.parallel or "-",
        )
        for r in rows
    ]
    return render_table(head, cells, numeric_from=2)


def format_tour(rows: list[TourRow]) -> str:
    head = ("act", "engine", "plan", "what happened", "TTFT ms", "tokens", "total ms")
    cells = [
        (r.act, r.engine, r.plan, r.note, _ms(r.ttft_ms), str(r.tokens), _ms(r.total_ms))
        for r in rows
    ]
    return render_table(head, cells, numeric_from=4)


def parallel_note(rows: list[Row]) -> str:
    """What the parallel cloud starts of a run cost, in words ("" when there were none)."""
    n = sum(r.parallel == "cloud" for r in rows)
    if not n:
        return ""
    return (
        f"{n} of {len(rows)} requests also started the cloud in parallel: the engine preferred "
        "was predicted past the policy's deadline. Each one is a cloud request paid for, "
        "whichever engine answered first. A policy can forbid it ([hedge] parallel_cloud = "
        "false) or cap it ([hedge] parallel_cloud_share = 0.2)."
    )


# ---- setup ---------------------------------------------------------------------------------------


def _pull(name: str, out: TextIO) -> Path:
    """The model's file, pulled with a progress bar if it is not in the cache yet."""
    bar = ProgressBar(f"pulling {name}", stream=out)
    try:
        return resolve.resolve_model(name, pull=True, progress=bar)
    finally:
        bar.close()


def _configured_cloud(args: argparse.Namespace) -> OpenAIEngine | None:
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    if not (base_url or api_key):
        if args.model:
            raise ConfigError(
                "--model names a cloud model, but no endpoint is configured: set "
                "OPENAI_BASE_URL / OPENAI_API_KEY or pass --base-url / --api-key"
            )
        return None
    return OpenAIEngine(base_url=args.base_url, api_key=args.api_key, model=args.model)


def run_demo(args: argparse.Namespace) -> int:
    """The `hybridllm demo` command (see the module docstring)."""
    out = sys.stdout
    threads: int = args.threads or os.cpu_count() or 1
    if threads < 1:
        raise ConfigError(f"--threads must be at least 1, not {threads}")
    local_name: str = args.local_model or DEFAULT_LOCAL_MODEL
    cloud = None if args.no_cloud else _configured_cloud(args)
    standin = not args.no_cloud and cloud is None
    tour = not args.quick and not args.no_cloud
    scenarios = [s for s in SCENARIOS if s.quick or not args.quick]
    what = "the tour" if tour else f"{len(scenarios)} requests, one after another"
    out.write(f"hybridllm demo: {what}\n")
    out.write(f"  local: {local_name} (llama.cpp, {threads} threads)\n")
    if cloud is not None:
        out.write(f"  cloud: {cloud.model} at {cloud.base_url or 'the OpenAI API'}\n")
    elif standin:
        name = args.standin_model or STANDIN_CLOUD_MODEL
        out.write(f"  cloud: no endpoint configured, using a stand-in: {name}\n")
        out.write("\n".join(textwrap.wrap(SHARED_CORES.format(n=os.cpu_count()), 100)) + "\n")
    else:
        out.write("  cloud: none (--no-cloud)\n")
    out.write("\n")
    out.flush()
    if standin:
        # the stand-in cloud and the local engine share these cores (a race runs both at once):
        # threads that spin while they wait would slow each other down many times over
        os.environ.setdefault(waitpolicy.ENV, "PASSIVE")
    _pull(local_name, out)
    local = LlamaCppEngine(local_name, n_threads=threads, warm_up=False, pull=True)
    with contextlib.ExitStack() as stack:
        standin_name: str = args.standin_model or STANDIN_CLOUD_MODEL
        proxy = _start_standin(stack, standin_name, threads, out) if standin else None
        if proxy is not None:
            cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key="none", model=standin_name)
        show = _Show(scenarios, args.quick, tour, proxy, standin)
        rows = anyio.run(_run_async, local, cloud, show, out)
    _summary(rows, out)
    return 0


def _start_standin(stack: contextlib.ExitStack, name: str, threads: int, out: TextIO) -> FaultProxy:
    """The stand-in cloud (`hybridllm serve-model NAME`) behind a FaultProxy, both stopped when
    `stack` closes (on errors and Ctrl-C too)."""
    path = _pull(name, out)
    port = free_port()
    # requests mostly run one after another, so the server may use every core too
    server = HybridServer(path, alias=name, n_ctx=4096, port=port, n_threads=threads)

    def stop() -> None:
        if server.pid is not None:  # None: never started
            server.stop()
            out.write("stand-in cloud stopped\n")
            out.flush()

    stack.callback(stop)
    with Status(f"starting stand-in cloud ({name} on 127.0.0.1:{port})", out):
        server.start()
    return stack.enter_context(FaultProxy(upstream=("127.0.0.1", port)))


def _summary(rows: list[Row] | list[TourRow], out: TextIO) -> None:
    tour = [r for r in rows if isinstance(r, TourRow)]
    plain = [r for r in rows if isinstance(r, Row)]
    out.write("\nsummary\n" + (format_tour(tour) if tour else format_table(plain)) + "\n")
    note = parallel_note(plain)
    if note:
        out.write("\n" + "\n".join(textwrap.wrap(note, 100)) + "\n")
    out.flush()


@dataclass(frozen=True)
class _Show:
    """What the demo runs: the scenarios (or the tour), and the stand-in's proxy if any."""

    scenarios: list[Scenario]
    quick: bool
    tour: bool
    proxy: FaultProxy | None
    standin: bool


async def _run_async(
    local: LlamaCppEngine, cloud: Engine | None, show: _Show, out: TextIO
) -> list[Row] | list[TourRow]:
    client = HybridClient(local=local, cloud=cloud)
    async with contextlib.AsyncExitStack() as stack:
        with Status(f"loading local model {local.model}", out):
            await stack.enter_async_context(client)
        with Status("warming up local model", out):
            await client.complete(WARM_UP_PROMPT, engine="local", max_tokens=8, temperature=0.0)
        if local.prefill_tps and local.tpot_s:
            out.write(
                f"local model ready: prefill ~{local.prefill_tps:.0f} tokens/s, "
                f"decode ~{local.tpot_s * 1000:.0f} ms/token\n"
            )
        if show.standin:
            with Status("warming up stand-in cloud", out):
                await client.complete(WARM_UP_PROMPT, engine="cloud", max_tokens=4, temperature=0)
        if show.tour:
            stage = Stage(client, show.proxy, out, TOUR_MAX_TOKENS, out.isatty())
            return await run_tour(stage)
        n = len(show.scenarios)
        return [
            await _one(client, sc, f"[{i}/{n}]", show.quick, out)
            for i, sc in enumerate(show.scenarios, 1)
        ]


async def _one(client: HybridClient, sc: Scenario, counter: str, quick: bool, out: TextIO) -> Row:
    forced = sc.engine if sc.engine is None or sc.engine in client.engines else None
    max_tokens = min(sc.max_tokens, QUICK_MAX_TOKENS) if quick else sc.max_tokens
    wanted = f", engine={sc.engine!r}" if sc.engine else ""
    out.write(f"\n{counter} {sc.name}  (policy {sc.policy!r}{wanted})\n")
    width = min(shutil.get_terminal_size().columns, 100) - 4
    for line in sc.prompt.splitlines():
        for part in textwrap.wrap(line, width) or [""]:
            out.write(f"  > {part}".rstrip() + "\n")
    out.flush()
    writer = AnswerWriter(out)
    async with client.stream(
        sc.prompt, policy=sc.policy, engine=forced, max_tokens=max_tokens, seed=7
    ) as s:
        async for event in s.events():
            if isinstance(event, Route):
                note = f"; wanted {sc.engine}, which this run lacks" if sc.engine != forced else ""
                out.write(f"  -> {event.engine}: {event.reason}{note}\n")
                out.flush()
            elif isinstance(event, ParallelStart):
                paid = " (a cloud request, paid for)" if event.engine == "cloud" else ""
                out.write(f"  ++ {event.engine} started in parallel{paid}\n")
                out.flush()
            elif isinstance(event, Token):
                writer.write(event.text)
    writer.end()
    t = s.trace
    tokens = t.completion_tokens if t.completion_tokens is not None else t.n_tokens
    finish = ", stopped at max_tokens" if t.finish_reason == "length" else ""
    also = ""
    if t.parallel_engine is not None:
        cost = "" if t.parallel_cost_usd is None else f", {usd(t.parallel_cost_usd)}"
        also = f" | {t.parallel_engine} also ran in parallel{cost}"
    out.write(
        f"  == {t.engine} | TTFT {_ms(t.ttft_ms)} ms | TPOT {_ms(t.tpot_ms)} ms | "
        f"{tokens} tokens{finish}{also}\n"
    )
    out.flush()
    return Row(
        sc.name, t.engine or "-", t.ttft_ms, t.tpot_ms, tokens, t.total_ms, t.parallel_engine
    )
