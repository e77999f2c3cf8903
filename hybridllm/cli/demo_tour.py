"""The demo's tour (`hybridllm demo` with a cloud): one act per thing the SDK does, each streamed
live with its route reason and figures, and one row per request in the final table.

1. the router at work on a mix of prompts (the `chat` policy: the router decides);
2. a fallback: the cloud stalls (a `FaultProxy` holds its first byte) and the local engine
   answers inside the deadline;
3. a handoff: the local engine starts, the cloud continues from its exact text;
4. a cascade kept local (an easy prompt) and one escalated (a hard one): the local model's
   confidence decides;
5. speculative drafting: the local model drafts, the cloud verifies; drafts are painted dim
   and retractions struck through;
6. priorities: an interactive request overtakes a background one on the device;
7. a tool call: the answer calls a local function, whose result goes back for the final text;
8. a privacy refusal: a prompt with personal data under a policy that blocks it; nothing is
   sent anywhere.

What each act shows is what happened, read from the events and the trace: a cascade on this
run's models may keep or escalate either prompt, and the table says which.
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import anyio

from hybridllm import errors
from hybridllm.client import HybridClient
from hybridllm.events import (
    Draft,
    Fallback,
    Handoff,
    Hedge,
    ParallelStart,
    Paused,
    Retract,
    Route,
    Token,
    ToolCall,
)
from hybridllm.policy import Policy
from hybridllm.runtime.trace import Trace
from hybridllm.testing import FaultProxy
from hybridllm.testing.faults import Faults

__all__ = ["ACTS", "Stage", "TourRow", "run_tour"]

ROUTER_MIX = (
    "What is 12 times 12?",
    "List the first five prime numbers and say what a prime is, in one sentence.",
    "Translate into French, keeping the meaning exact: 'I would have come if you had asked.'",
)
EASY, HARD = (
    "Name three colours of the rainbow.",
    "Give the first ten Fibonacci numbers and the rule.",
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FALLBACK = Policy.model_validate(
    {"name": "demo-fallback", "routing": {"prefer": "cloud", "ttft_deadline_ms": 900}}
)
# quality first: the cloud's answer, drafted locally; a verification on a loaded stand-in may
# take seconds, which the chat policy's 4 s stall would cut short
SPECULATE = Policy.model_validate(
    {
        "name": "demo-speculative",
        "routing": {"prefer": "cloud", "ttft_deadline_ms": 5000, "stall_ms": 20000},
    }
)
# the chat policy's 500 ms deadline leaves the local model no time to judge itself on a
# loaded device (the cascade then races both engines): a second lets the judgement show
CASCADE = Policy.model_validate(
    {"name": "demo-cascade", "routing": {"prefer": "auto", "ttft_deadline_ms": 1500}}
)
BLOCKED = Policy.model_validate(
    {"name": "demo-block", "routing": {"prefer": "cloud"}, "privacy": {"mode": "block"}}
)
STALL_MS = 4000
# the interactive question waits for the summary's first token, at most this long
PRIORITY_ARRIVAL_LIMIT_S = 30.0


@dataclass
class TourRow:
    act: str
    engine: str
    plan: str
    ttft_ms: float | None
    tokens: int
    total_ms: float | None
    note: str


@dataclass
class Stage:
    """What every act gets: the client, the proxy in front of the cloud (None: a configured
    endpoint, which the demo does not stall), where to write, the answers' token limit, and
    whether to paint with ANSI (a terminal)."""

    client: HybridClient
    proxy: FaultProxy | None
    out: TextIO
    max_tokens: int
    ansi: bool


class Painter:
    """Writes an answer as it streams: committed text plain, drafts dim, retractions struck
    through (`[text]` and `~~text~~` without a terminal), each engine's span marked."""

    def __init__(self, out: TextIO, ansi: bool) -> None:
        self.out, self.ansi = out, ansi
        self.pending = ""  # drafted text shown and not yet committed or retracted
        self.started = False

    def _write(self, text: str, style: str = "") -> None:
        if not self.started:
            self.out.write("    ")
            self.started = True
        text = text.replace("\n", "\n    ")
        self.out.write(f"\x1b[{style}m{text}\x1b[0m" if self.ansi and style else text)
        self.out.flush()

    def draft(self, text: str) -> None:
        self.pending += text
        self._write(text if self.ansi else f"[{text}]", "2")

    def retract(self, text: str) -> None:
        self.pending = self.pending[: len(self.pending) - len(text)]
        self._write(f"~~{text}~~", "9;31")

    def token(self, text: str) -> None:
        """Committed text: what a shown draft already holds is not written again."""
        shown = min(len(text), len(self.pending))
        if text[:shown] != self.pending[:shown]:
            shown = 0
        self.pending = self.pending[shown:]
        if text[shown:]:
            self._write(text[shown:])

    def end(self) -> None:
        if self.started:
            self.out.write("\n")
            self.out.flush()


def _say(stage: Stage, line: str) -> None:
    stage.out.write(line + "\n")
    stage.out.flush()


@dataclass
class Played:
    """One request of an act: its table row, its trace and the tool calls it made."""

    row: TourRow
    trace: Trace
    calls: list[ToolCall]
    route: str = "-"  # the engine the decision picked (the answer may come from the other)


async def play(
    stage: Stage,
    act: str,
    messages: Any,
    quiet: bool = False,
    answering: anyio.Event | None = None,
    **args: Any,
) -> Played:
    """Stream one request, painting its events (`quiet`: its answer written at the end, for a
    request that runs beside another; `answering`: set at its first token); its row, trace and
    tool calls."""
    held = io.StringIO()
    out: TextIO = held if quiet else stage.out
    painter = Painter(out, stage.ansi)
    calls: list[ToolCall] = []
    route = "-"
    args.setdefault("max_tokens", stage.max_tokens)
    async with stage.client.stream(messages, **args) as s:
        async for event in s.events():
            _paint(out, painter, event)
            if answering is not None and isinstance(event, Token):
                answering.set()
            if isinstance(event, ToolCall):
                calls.append(event)
            elif isinstance(event, Route):
                route = event.engine
    painter.end()
    if quiet:
        _say(stage, f"  ({act}, written as it ended)\n" + held.getvalue().rstrip())
    return Played(_row(act, s.trace), s.trace, calls, route)


def _paint(out: TextIO, painter: Painter, event: Any) -> None:
    if isinstance(event, Token):
        painter.token(event.text)
    elif isinstance(event, Draft):
        painter.draft(event.text)
    elif isinstance(event, Retract):
        painter.retract(event.text)
    elif isinstance(event, Route | Fallback | Handoff | Paused | ToolCall):
        painter.end()
        painter.started = False
        out.write("  " + _describe(event) + "\n")
        out.flush()


def _describe(event: Any) -> str:
    if isinstance(event, Route):
        return f"-> {event.engine}: {event.reason}"
    if isinstance(event, ParallelStart):
        return f"++ {event.to_engine} started in parallel: {event.reason}"
    if isinstance(event, Hedge):
        return f"++ hedge: {event.to_engine} started: {event.reason}"
    if isinstance(event, Fallback):
        return f"!! {event.from_engine} -> {event.to_engine}: {event.reason}"
    if isinstance(event, Handoff):
        return (
            f">> handoff after {event.tokens} {event.from_engine} tokens: "
            f"{event.to_engine} continues ({event.reason})"
        )
    if isinstance(event, Paused):
        return (
            f"|| paused after {event.delivered_tokens} tokens for {event.reason}; resumed "
            f"{event.resumed_after_ms:.0f} ms later"
        )
    return f"() tool call {event.name}({event.arguments}) by {event.engine}"


def _row(act: str, t: Trace, note: str = "") -> TourRow:
    tokens = t.completion_tokens if t.completion_tokens is not None else t.n_tokens
    engines = "+".join(dict.fromkeys(s.engine for s in t.spans)) or (t.engine or "-")
    return TourRow(act, engines, t.plan or "-", t.ttft_ms, tokens, t.total_ms, note)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} ms"


def _figures(stage: Stage, t: Trace, extra: str = "") -> None:
    cost = "" if not t.spent else f" | ${sum(s.usd for s in t.spent):.6f}"
    _say(stage, f"  == {t.engine} | plan {t.plan} | TTFT {_ms(t.ttft_ms)}{cost}{extra}")


# ---- the acts ---------------------------------------------------------------------------------


async def act_router(stage: Stage) -> list[TourRow]:
    _say(stage, "\n[router] the `chat` policy: the router picks the engine per prompt")
    rows = []
    for prompt in ROUTER_MIX:
        _say(stage, f"  > {prompt}")
        p = await play(stage, "router", prompt, policy="chat", temperature=0.0)
        _figures(stage, p.trace)
        p.row.note = f"routed to {p.route}, answered by {p.trace.engine}"
        rows.append(p.row)
    return rows


async def act_fallback(stage: Stage) -> list[TourRow]:
    if stage.proxy is None:
        _say(stage, "\n[fallback] skipped: the configured cloud is not behind the demo's proxy")
        return []
    _say(stage, f"\n[fallback] the cloud stalls {STALL_MS} ms before its first byte")
    prompt = "Give me one tip for sleeping better."
    _say(stage, f"  > {prompt}")
    stage.proxy.faults = Faults(first_byte_stall_ms=STALL_MS, stall_probability=1.0)
    try:
        p = await play(stage, "fallback", prompt, policy=FALLBACK)
    finally:
        stage.proxy.faults = Faults()
    deadline = FALLBACK.routing.ttft_deadline_ms
    _figures(stage, p.trace, f" | deadline {deadline:.0f} ms")
    rescued = p.trace.engine == "local"
    p.row.note = f"cloud stalled; {'local rescued it' if rescued else 'no rescue'}"
    return [p.row]


async def act_handoff(stage: Stage) -> list[TourRow]:
    _say(stage, "\n[handoff] the local engine starts, the cloud continues from its exact text")
    prompt = "Write three sentences about why lighthouses were painted in stripes."
    _say(stage, f"  > {prompt}")
    # the seam is the point: no first-token deadline (on a slow device the chat preset's 500 ms
    # passes before the first local token, and the cloud is asked for the whole answer)
    seam = Policy.preset("chat").with_(routing={"ttft_deadline_ms": None})
    p = await play(stage, "handoff", prompt, policy=seam, plan="handoff", temperature=0.0)
    h = p.trace.handoff
    _figures(stage, p.trace)
    p.row.note = "no handoff" if h is None else f"{h.local_tokens} local tokens, then {h.outcome}"
    return [p.row]


CASCADE_NOTES = {
    "local": "kept local: confident",
    "cloud": "escalated: not confident",
    "race": "raced: no confidence in time",
}


async def act_cascade(stage: Stage) -> list[TourRow]:
    _say(stage, "\n[cascade] the local model answers; its confidence decides whether to keep it")
    rows = []
    for prompt in (EASY, HARD):
        _say(stage, f"  > {prompt}")
        p = await play(stage, "cascade", prompt, policy=CASCADE, plan="cascade", temperature=0.0)
        c = p.trace.cascade
        _figures(stage, p.trace, "" if c is None else f" | score {c.text:.2f} (cut {c.cut:.2f})")
        p.row.note = "not run" if c is None else CASCADE_NOTES.get(str(c.decision), "-")
        rows.append(p.row)
    return rows


async def act_speculative(stage: Stage) -> list[TourRow]:
    _say(stage, "\n[speculative] local drafts, the cloud verifies; rejected text struck")
    prompt = "Explain what a prime number is, in one sentence."
    _say(stage, f"  > {prompt}")
    args: dict[str, Any] = {"plan": "speculative", "show_drafts": True, "temperature": 0.0}
    p = await play(stage, "speculative", prompt, policy=SPECULATE, **args)
    sp = p.trace.speculation
    _figures(stage, p.trace)
    p.row.note = "not run" if sp is None else f"{sp.accepted}/{sp.drafted} drafted tokens kept"
    if sp is not None and sp.switched:
        p.row.note += "; switched to plain streaming"
    return [p.row]


async def act_priority(stage: Stage) -> list[TourRow]:
    _say(stage, "\n[priority] a background summary is running; an interactive question arrives")
    results: dict[str, Played] = {}
    answering = anyio.Event()  # the question arrives once the summary is being written

    async def one(prompt: str, priority: str) -> None:
        if priority == "interactive":
            with anyio.move_on_after(PRIORITY_ARRIVAL_LIMIT_S):
                await answering.wait()
        _say(stage, f"  > ({priority}) {prompt}")
        args: dict[str, Any] = {"priority": priority, "temperature": 0.0}
        background = priority == "background"
        started = answering if background else None
        results[priority] = await play(
            stage, priority, prompt, background, started, engine="local", **args
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "Summarise the history of the bicycle.", "background")
        tg.start_soon(one, "What's 2 plus 2?", "interactive")
    bg, fg = results["background"], results["interactive"]
    paused = len(bg.trace.pauses)
    bg.row.note = f"paused {paused}x for the interactive one"
    fg.row.note = "overtook the background answer"
    _figures(stage, fg.trace, f" | the background answer paused {paused}x")
    return [bg.row, fg.row]


async def act_tool(stage: Stage) -> list[TourRow]:
    _say(stage, "\n[tool call] the local model calls a function; the cloud words the answer")
    question = [{"role": "user", "content": "What's the weather in Paris right now?"}]
    _say(stage, f"  > {question[0]['content']}")
    args: dict[str, Any] = {"tools": [WEATHER_TOOL], "tool_choice": "auto", "temperature": 0.0}
    p = await play(stage, "tool call", question, engine="local", **args)
    p.row.note = f"called {', '.join(c.name for c in p.calls) or 'nothing'}"
    if not p.calls:
        return [p.row]
    call = p.calls[0]
    weather = get_weather(**json.loads(call.arguments))
    _say(stage, f"  () get_weather -> {weather}")
    shape = {"id": call.id, "type": "function", "function": _function(call)}
    conversation = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [shape]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(weather)},
    ]
    final = await play(stage, "tool result", conversation, engine="cloud", temperature=0.0)
    _figures(stage, final.trace)
    final.row.note = f"the tool's result, worded by {final.trace.engine}"
    return [p.row, final.row]


def _function(call: ToolCall) -> dict[str, str]:
    return {"name": call.name, "arguments": call.arguments}


def get_weather(city: str = "Paris") -> dict[str, Any]:
    """The demo's local function: a fixed report (no network here)."""
    return {"city": city, "sky": "light rain", "celsius": 14}


async def act_privacy(stage: Stage) -> list[TourRow]:
    _say(stage, "\n[privacy] a cloud-first policy that blocks personal data")
    prompt = "Email jane.doe@example.org that her card 4111 1111 1111 1111 was charged twice."
    _say(stage, f"  > {prompt}")
    try:
        p = await play(stage, "privacy", prompt, policy=BLOCKED)
    except errors.PrivacyBlockedError as exc:
        _say(stage, f"  xx refused ({type(exc).__name__}): {exc}")
        return [TourRow("privacy", "-", "-", None, 0, None, "refused; nothing was sent")]
    p.row.note = "not refused"
    return [p.row]


Act = Callable[[Stage], Awaitable[list[TourRow]]]
ACTS: Sequence[Act] = (
    act_router,
    act_fallback,
    act_handoff,
    act_cascade,
    act_speculative,
    act_priority,
    act_tool,
    act_privacy,
)


async def run_tour(stage: Stage) -> list[TourRow]:
    """Every act in turn; one that fails (a model that cannot render tools, a cloud that
    refuses) is a row saying so, and the tour goes on."""
    rows: list[TourRow] = []
    for act in ACTS:
        try:
            rows += await act(stage)
        except errors.HybridError as exc:
            name = act.__name__.removeprefix("act_")
            _say(stage, f"  xx {name} failed: {type(exc).__name__}: {exc}")
            rows.append(TourRow(name, "-", "-", None, 0, None, f"failed: {type(exc).__name__}"))
    return rows
