"""`HybridClient`: the public face of hybridllm.

    client = HybridClient(local=LlamaCppEngine(), cloud=OpenAIEngine(base_url=..., model=...))
    async with client:
        async for token in client.stream(messages, policy="voice-assistant"):
            speak(token)

Scripts without an event loop use the blocking forms: `with client:` and
`client.stream_sync(...)` / `client.complete_sync(...)`, which run the client on a private
event loop thread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, Unpack

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.from_thread import BlockingPortal, start_blocking_portal

from hybridllm import errors, logs
from hybridllm.engines import validate
from hybridllm.engines.base import Engine, GenerationRequest, Message
from hybridllm.engines.capabilities import Warms
from hybridllm.engines.tokens import prompt_token_bound
from hybridllm.events import EngineName, Event, Token, ToolCall
from hybridllm.guard.budget import Cap, Ledger, Prices, Quota, SQLiteLedger, user_quota
from hybridllm.guard.guarded import PRIVACY_MODES, GuardedEngine, PrivacyMode, RequestContext
from hybridllm.guard.ledgers import as_ledger
from hybridllm.guard.privacy_judge import PrivacyJudge
from hybridllm.guard.privacy_known import NameRecogniser
from hybridllm.guard.privacy_ner import ner_wanted, say_ner_missing
from hybridllm.policy import PlanName, Policy, PolicyCache, Tenant
from hybridllm.routing.decide import PROBE_AFTER
from hybridllm.routing.decision import CloudConsidered, Decision, RequestFacts, RoutePreview
from hybridllm.routing.hedging import backup_ttft_s
from hybridllm.routing.inputs import Scorer
from hybridllm.routing.log import DecisionLogLike
from hybridllm.routing.logs import as_decision_log
from hybridllm.routing.score import RouterScore
from hybridllm.runtime.admission import (
    RequestArgs,
    StreamArgs,
    build_request,
    check_constraints,
    check_names,
)
from hybridllm.runtime.gather import (
    CloudStart,
    Gatherer,
    GuardBudget,
    ner_ready,
    policy_caps,
    privacy_kinds,
    refusal_error,
)
from hybridllm.runtime.health import CircuitBreaker, EngineState, check_engines
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.plans.cascade import score_messages, warn_foreign_stage2
from hybridllm.runtime.plans.choose import Plan, choose_plan
from hybridllm.runtime.public_names import clear_public_names
from hybridllm.runtime.retry import RetryPolicy
from hybridllm.runtime.roster import Roster
from hybridllm.runtime.stream import RequestRun, Stream, StreamItem
from hybridllm.runtime.trace import Trace
from hybridllm.telemetry import StatsReport, Telemetry

log = logging.getLogger(__name__)

Messages = str | Sequence[Mapping[str, str]]


# a prompt longer than this is admitted on a worker thread (the router's score and the privacy
# scan grow with it: about 100 ms at 2,000 characters with the NER layer, a few ms without)
INLINE_ADMISSION_CHARS = 1_000
# the failures that say an engine cannot be reached (logged once, `_outcome`)
UNREACHABLE = (errors.CloudConnectionError, errors.CloudTimeoutError)
# how long one engine's check may take (`HybridClient.check()`, the gateway at start)
CHECK_TIMEOUT_S = 3.0


@dataclass
class _Ticket:
    """One request between its call and its decision: what the cheap half of admission made
    (`HybridClient._ticket`), and the route once decided."""

    request: GenerationRequest
    policy: Policy  # bound to the client's engines: its names are the sides (`Roster.bind`)
    forced: EngineName | None  # the side the call's `engine=` names
    plan: PlanName | None
    streamed: bool
    # the clouds the policy allows, by name, in its order; the one serving the cloud side
    clouds: tuple[EngineName, ...] = ()
    cloud: EngineName | None = None
    route: RoutePreview | None = None
    cloud_start: CloudStart | None = None  # its entry in the policy's parallel-cloud window
    dropped: int = 0  # the oldest messages left out to fit the local context (overflow "trim")


def _ner_preload(policy: Policy) -> bool:
    """Whether a client opening under `policy` loads the NER layer; where it would but the
    privacy extra is missing, that is said once at start (`say_ner_missing`)."""
    say_ner_missing(policy.privacy)
    return ner_wanted(policy.privacy)


def _costly(ticket: _Ticket) -> bool:
    """Could gathering this request's facts stall the event loop past about a millisecond?"""
    if ner_wanted(ticket.policy.privacy) and ticket.policy.privacy.mode != "off":
        return True
    chars = sum(len(str(m.get("content", ""))) for m in ticket.request.messages)
    return chars > INLINE_ADMISSION_CHARS


@dataclass(frozen=True)
class Completion:
    """A whole answer (`HybridClient.complete()`): its `text`, the `tool_calls` it made (empty
    when none), why it ended (`finish_reason`: "stop", "length", "tool_calls"), and with a
    `json_schema` or `json_object` response format the answer parsed (`parsed`; else None)."""

    text: str
    trace: Trace
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    parsed: Any = None


T = TypeVar("T")

# conversations the cloud answered that may wait for the local engine's background prefill
WARM_QUEUE = 4


def _roster(local: object, cloud: object, engines: object) -> Roster:
    """The client's engines: `engines=` by the app's names, or the shorthand `local=` (the
    device's) and `cloud=`; each engine takes its name."""
    if engines is not None:
        if local is not None or cloud is not None:
            raise errors.ConfigError("give engines= or local=/cloud=, not both")
        roster = Roster.of(engines)  # type: ignore[arg-type]  # checked there
    else:
        if local is None and cloud is None:
            raise errors.ConfigError("HybridClient needs at least one engine (local= or cloud=)")
        for arg, eng in (("local", local), ("cloud", cloud)):
            if eng is not None and not isinstance(eng, Engine):
                raise errors.InvalidArgumentError(arg, eng, "an Engine (e.g. LlamaCppEngine())")
        given = {n: e for n, e in (("local", local), ("cloud", cloud)) if e is not None}
        roster = Roster.of(given, device="local" if local is not None else None)  # type: ignore[arg-type]
    for name, engine in roster.engines.items():
        engine.name = name
    return roster


def _guards(
    roster: Roster,
    privacy: PrivacyMode,
    ledger: Ledger | str | Path | None,
    prices: Prices | str | Path | None,
    caps: Sequence[Cap],
    judge: PrivacyJudge | None,
) -> dict[EngineName, GuardedEngine]:
    """Each cloud behind its own guard (the privacy scan, its own prices), all on one ledger
    (the client's caps: global, per policy, or per cloud by name)."""
    for cap in caps:
        if isinstance(cap, Cap) and cap.engine is not None and cap.engine not in roster.clouds:
            clouds = ", ".join(roster.clouds) or "none"
            raise errors.InvalidArgumentError(
                "budget_caps", cap, f"caps on this client's clouds by name ({clouds})"
            )
    if not roster.clouds:
        return {}
    if ledger is None and (prices is not None or caps):
        ledger = SQLiteLedger()  # in memory, this process: one for every cloud
    elif ledger is not None:
        ledger = as_ledger(ledger)
    return {
        name: GuardedEngine(
            roster.engines[name],
            privacy=privacy,
            ledger=ledger,
            prices=prices,
            caps=caps,
            judge=judge,
        )
        for name in roster.clouds
    }


def _judge(seconds: object, local: Engine | None) -> PrivacyJudge | None:
    """The privacy judge `privacy_judge` asks for: None, or seconds above 0 with a local
    engine to judge with."""
    if seconds is None:
        return None
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
        raise errors.InvalidArgumentError("privacy_judge", seconds, "None or seconds above 0")
    if local is None:
        raise errors.InvalidArgumentError("privacy_judge", seconds, "None without a local engine")
    return PrivacyJudge(local, budget_s=seconds)


class HybridClient:
    _measuring: anyio.CancelScope | None = None  # the privacy judge's bar, while it is measured

    def __init__(
        self,
        local: Engine | None = None,
        cloud: Engine | None = None,
        *,
        engines: Mapping[EngineName, Engine] | None = None,
        policy: str | Path | Policy | None = None,
        policy_dirs: Sequence[str | Path] | None = None,
        router: Scorer | Literal["default"] | None = "default",
        privacy: PrivacyMode = "off",
        ledger: Ledger | str | Path | None = None,
        prices: Prices | str | Path | None = None,
        budget_caps: Sequence[Cap] = (),
        latency: LatencyModel | None = None,
        decision_log: DecisionLogLike | str | Path | None = None,
        telemetry: Telemetry | None = None,
        privacy_judge: float | None = None,
    ) -> None:
        """`engines`: the engines by the app's names (`{"local": LlamaCppEngine(), "fast":
        OpenAIEngine(...), "smart": OpenAIEngine(...)}`: at most one on the device; `local=`
        and `cloud=` are the shorthand for `{"local": ..., "cloud": ...}`); events, traces,
        stats and policies name them so (`runtime.roster`).
        `privacy="keep-local"` keeps requests holding personal or secret data off the cloud
        engine; `ledger` (a `Ledger`, or a path or URL for `ledger_from_url`), `prices` (a `Prices`
        or a TOML path) and `budget_caps` reserve and settle every cloud request's cost against the
        caps (with `prices` alone, an in-memory ledger holds the policies' own `[budget]` caps). The
        cloud engine is wrapped in a `GuardedEngine`, which enforces both at its seam on every path
        (fallback, hedge, continuation); routing reads the same detector and ledger to pick the
        local engine up front, with the reason. `router`: an object with `score(messages)` and
        `threshold(...)`, such as `hybridllm.routing.Router.load(path)`; "default" loads the
        shipped router (on a worker thread while the engines start) when the client has both
        engines; None: no router (policies then route by preference and latency alone).
        `decision_log`: a `DecisionLog` or `RedisDecisionLog` (or a path or URL for
        `decision_log_from_url`: `redis://...` shares one log among gateways) that gets one row
        per request - features, score, route, outcome - written off the event loop after the
        request ends; prompt text only with `DecisionLog(path, store_prompts=True)`.
        `telemetry`: what the client aggregates and exports about its requests (`stats()`,
        OpenTelemetry; default `Telemetry()`: a one-hour window, OpenTelemetry as
        `HYBRIDLLM_OTEL` says).
        `privacy_judge`: seconds the local model may take to judge a borderline prompt bound for
        the cloud under "keep-local" (`guard.privacy_judge`; None: no judge)."""
        roster = self._roster = _roster(local, cloud, engines)
        validate.one_of("privacy", privacy, PRIVACY_MODES)
        policy = validate.policy_ref(policy)
        for i, d in enumerate(policy_dirs or ()):
            validate.directory(f"policy_dirs[{i}]", d)
        if router not in (None, "default") and not callable(getattr(router, "score", None)):
            raise errors.InvalidArgumentError("router", router, 'None, "default" or a Router')
        device = None if roster.device is None else roster.engines[roster.device]
        judge = self._judge = _judge(privacy_judge, device)
        self._guards = _guards(roster, privacy, ledger, prices, budget_caps, judge)
        self.privacy: PrivacyMode = privacy
        self.policies = PolicyCache(policy_dirs)
        self.policy = self.policies.get(policy)
        roster.check(self.policy)  # an engine it names that the client lacks: PolicyError
        preload = _ner_preload(self.policy.under_client(privacy))
        for guard in self._guards.values():  # the privacy scan's NER pipelines: `__aenter__`
            guard.preload_privacy, guard.preload_at_start = preload, False
        gate = GuardBudget(self._guards) if self._guards else None  # a ledger may come later
        self.decision_log = as_decision_log(decision_log)
        self.telemetry = _telemetry(telemetry)
        self._log_lock = threading.Lock()
        self._log_pending: set[str] = set()  # request ids whose row is not written yet
        self._early_feedback: dict[str, bool] = {}
        self._router_spec = router
        scorer = None if router == "default" else router
        self.routing = Gatherer(latency or LatencyModel(), scorer, gate, privacy_kinds, ner_ready)
        self.routing.latency.device = roster.device or "local"
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        # cloud-answered conversations for the local engine to prefill; the task doing it
        self._to_warm: deque[_WarmUp] = deque(maxlen=WARM_QUEUE)
        self._warming: anyio.CancelScope | None = None
        self._runs: set[RequestRun] = set()
        self.breakers = {e: CircuitBreaker(name=e) for e in roster.engines}
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._sync_cm: AbstractContextManager[HybridClient] | None = None
        self.last_check: dict[EngineName, EngineState] = {}  # at the last `check()`
        self._unreachable: set[EngineName] = set()  # said at WARNING, not answered since

    @property
    def engines(self) -> dict[EngineName, Engine]:
        """The engines by name, in the app's order (each cloud behind its guard)."""
        return {n: self._guards.get(n, e) for n, e in self._roster.engines.items()}

    @property
    def local(self) -> Engine | None:
        """The engine on the device (None: none)."""
        device = self._roster.device
        return None if device is None else self._roster.engines[device]

    @property
    def cloud(self) -> Engine | None:
        """The first cloud, behind its guard (None: none)."""
        clouds = self._roster.clouds
        return self._guards[clouds[0]] if clouds else None

    @property
    def _guard(self) -> GuardedEngine | None:
        """The first cloud's guard (None: no cloud)."""
        clouds = self._roster.clouds
        return self._guards[clouds[0]] if clouds else None

    # ---- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise errors.ClientStateError("this HybridClient is already open")
        try:
            async with anyio.create_task_group() as tg:
                for engine in self.engines.values():
                    tg.start_soon(engine.start)
                if self._router_spec == "default" and self._roster.device and self._roster.clouds:
                    tg.start_soon(self._load_default_router)
        except BaseExceptionGroup as group:
            with anyio.CancelScope(shield=True):
                for engine in self.engines.values():
                    await engine.aclose()
            raise errors.first_error(group) from None
        self.routing.seed_from(self.engines)
        warn_foreign_stage2(self.routing.router, self.engines.values())
        for guard in self._guards.values():  # once the engines have started, not beside them
            guard.preload()
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        self._measuring = anyio.CancelScope()
        if self._judge is not None and self._judge.names is not None:
            self._tg.start_soon(self._measure_name_bar, self._judge.names, self._measuring)
        return self

    async def _measure_name_bar(self, names: NameRecogniser, scope: anyio.CancelScope) -> None:
        """The privacy judge's bar for names (`NameRecogniser.bar`), measured in the background
        at start (a few seconds of short local jobs that any request overtakes), so that the
        first name alone is judged within its deadline. Closing the client stops it."""
        with scope:
            try:
                await names.bar()
            except errors.HybridError as exc:
                log.warning("privacy judge: the bar for names was not measured (%s)", exc)

    async def _load_default_router(self) -> None:
        from hybridllm.routing.router import Router

        try:
            self.routing.router = await anyio.to_thread.run_sync(Router.load)
        except errors.RouterArtifactError as exc:
            if exc.reason != "missing":
                raise  # a shipped artifact that is tampered with or too new is an error
            warnings.warn(f"no router artifact ({exc}); routing without it", stacklevel=2)

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        for run in list(self._runs):
            run.cancel()
        if self._warming is not None:
            self._warming.cancel()
        if self._measuring is not None:
            self._measuring.cancel()
        try:
            if stack is not None:
                await stack.aclose()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                for engine in self.engines.values():
                    await engine.aclose()
                await self.routing.speculation.aclose()

    # ---- requests ---------------------------------------------------------------------------

    def stream(self, messages: Messages, **args: Unpack[StreamArgs]) -> Stream:
        """Start a request now and return its `Stream` (TTFT is measured from this call).
        `messages`: a non-blank prompt or a list of {"role", "content"} mappings whose last
        user message is not blank; the keyword arguments: `StreamArgs`. A bad argument raises
        `InvalidArgumentError` (a `ConfigError`) naming it; no engine sees the request."""
        return self._start(messages, args, streamed=True)

    def _start(self, messages: Messages, args: StreamArgs, *, streamed: bool) -> Stream:
        """`stream()`, and `complete()` (`streamed` False: the answer is taken whole). The
        arguments are checked here, at the call; the rest of admission (the router's score, the
        privacy scan, the decision) runs in the request's task, off the event loop where it
        costs (`_facts`): a refusal ends the stream with its error."""
        if self._tg is None:
            raise errors.ClientStateError(
                "the client is not open: use 'async with HybridClient(...) as client:'"
            )
        ticket = self._ticket(messages, args, streamed=streamed)
        send, recv = anyio.create_memory_object_stream[StreamItem](math.inf)
        trace = Trace(policy=ticket.policy.name, device=self._roster.device)
        run = RequestRun(trace, send, self._outcome)
        self._runs.add(run)
        if self.decision_log is not None:
            with self._log_lock:
                self._log_pending.add(trace.request_id)
        self._tg.start_soon(self._drive, run, ticket)
        return Stream(run, recv)

    async def _serve(self, ticket: _Ticket, run: RequestRun) -> None:
        """Admit the request (its facts off the loop where they cost), decide, run the plan."""
        facts = await self._facts(ticket)
        if ticket.dropped:
            run.rec.trimmed(ticket.dropped)
        facts = await clear_public_names(
            self._judge, ticket.request, ticket.policy, ticket.forced, facts
        )
        route = ticket.route = self._route(ticket, facts, preview=False)
        self._plan_cloud(ticket, route.decision)
        ticket.cloud_start = self.routing.note_decision(ticket.policy.name, route.decision)
        decision, state, pol, trace = route.decision, route.state, ticket.policy, run.trace
        log.debug("request %s: %r, %r", trace.request_id, decision, route.facts)
        log.debug("request %s: prompt %s", trace.request_id, logs.content(ticket.request.messages))
        run.rec.decided(decision, {name: p.ttft_s * 1e3 for name, p in state.latency.items()})
        fb = state.latency.get(decision.fallback) if decision.fallback else None
        lead = None if fb is None else backup_ttft_s(fb, rescue=decision.rescue)
        lead = lead if decision.fallback_lead else 0.0
        due = None if decision.deadline_s is None else trace.t_start + decision.deadline_s
        run.admitted(
            cloud_unavailable=dict(decision.unavailable).get("cloud"),  # CloudUnavailable says so
            deadline_ms=pol.routing.ttft_deadline_ms,
            retry=RetryPolicy(pol.routing.retries, due),
            json_answer=route.facts.atomic == "json",
        )
        privacy: PrivacyMode = "off" if pol.privacy.mode == "off" else "keep-local"
        context = RequestContext(
            scope=pol.name,
            privacy=privacy,
            on_settle=run.rec.settled,
            ner=ner_wanted(pol.privacy),
            due=due,
            user=ticket.request.user,
            tenant=ticket.request.tenant,
        )
        await self._plan(decision, ticket, context, lead)(run)

    async def _facts(self, ticket: _Ticket) -> RequestFacts:
        """The request's facts: on a worker thread where counting the prompt's tokens, the
        router's score and the privacy scan may cost more than about a millisecond (a long
        prompt, or the NER layer), so the event loop (the app's audio, UI, other streams) does
        not stall; inline otherwise. (The client's engines are closed only after its requests'
        tasks end, so a worker thread never counts with a model being unloaded.)"""
        if _costly(ticket):
            return await anyio.to_thread.run_sync(self._gather, ticket)
        return self._gather(ticket)

    def _gather(self, ticket: _Ticket, preview: bool = False) -> RequestFacts:
        """The request cut to fit (`[sampling] overflow = "trim"`, `ticket.dropped`), then its
        facts (`preview`: for `decide()`, which keeps no deadline)."""
        sides = self._sides(ticket)
        ticket.request, ticket.dropped = self.routing.trimmed(ticket.request, ticket.policy, sides)
        pol, forced = ticket.policy, ticket.forced
        return self.routing.facts(ticket.request, pol, forced, sides, preview=preview)

    def _sides(self, ticket: _Ticket) -> dict[EngineName, Engine]:
        """The engines as routing sees this request: the device's as "local", the cloud that
        serves it as "cloud"."""
        return self._roster.by_side(self.engines, ticket.cloud)

    def _considered(self, ticket: _Ticket) -> tuple[CloudConsidered, ...]:
        """Each cloud the request's policy allows, in order: chosen, or why it was passed over."""
        return self._roster.considered(
            ticket.clouds,
            ticket.cloud,
            lambda name: not self.breakers[name].would_allow(),
            lambda name: self.engines[name].info().unavailable is not None,
        )

    def _pick_cloud(self, ticket: _Ticket, *, quality: bool = False) -> EngineName | None:
        """The cloud that serves the request's cloud side: the first in its order that can
        serve now. Where the cloud is wanted for its answer (the policy puts a cloud first for
        quality, or the router's tier asks for it), a cloud whose circuit opened for deadline
        misses alone (slow, not broken) still can: routing keeps it with the next cloud and the
        device as its rescues, as with one cloud, rather than giving its requests to another
        cloud it did not choose."""
        r = ticket.policy.routing
        quality = quality or ticket.policy.order[0] == "cloud" and r.objective != "latency"

        def usable(name: EngineName) -> bool:
            slow = quality and self.breakers[name].slow
            return self._usable(name) or slow and self.engines[name].info().unavailable is None

        return self._roster.pick_cloud(ticket.clouds, usable)

    def _usable(self, name: EngineName) -> bool:
        """Could this engine take a request now (its circuit lets one through, it is not
        unavailable)? Read only: a half-open circuit keeps its probe."""
        return self.breakers[name].would_allow() and self.engines[name].info().unavailable is None

    async def check(self, timeout_s: float = CHECK_TIMEOUT_S) -> dict[EngineName, EngineState]:
        """Each engine's state now (`EngineState`: reachable, key accepted, model found, its
        circuit, why it is unavailable), each engine's check bounded by `timeout_s`; nothing
        is generated or billed. A cloud whose key is refused stops sending as after a refused
        request; an engine that cannot serve is logged once per check at WARNING. Kept as
        `last_check` (the gateway's /healthz reads it)."""
        validate.number("timeout_s", timeout_s, above=0.0)
        if self._tg is None:
            raise errors.ClientStateError(
                "the client is not open: use 'async with HybridClient(...) as client:'"
            )
        self.last_check = await check_engines(self.engines, self.breakers, timeout_s)
        return self.last_check

    def decide(
        self,
        messages: Messages,
        policy: str | Path | Policy | None = None,
        **args: Unpack[RequestArgs],
    ) -> RoutePreview:
        """Where this request would run now, and why; nothing is sent. It takes what `stream()`
        takes and goes through the same admission (`_ticket`, `_route`: the client's privacy
        floor, the policy's plan, the request's defaults), so the preview is the decision
        `stream()` would make (here on the calling thread: a preview of a long prompt may take
        a few ms, or more with the NER layer), except that it does not ask the privacy judge
        about a name alone (`stream()` may then clear a public figure's name; the preview keeps
        it local). A preview leaves the circuits as they are (a half-open circuit keeps its
        probe for the next request). A request no engine may
        serve raises its refusal (a `RefusedError`: `PrivacyBlockedError`,
        `BudgetExceededError`, or the class itself)."""
        full: StreamArgs = {**args, "policy": policy}
        ticket = self._ticket(messages, full, streamed=True)
        return self._route(ticket, self._gather(ticket, preview=True), preview=True)

    def _ticket(self, messages: Messages, args: StreamArgs, *, streamed: bool) -> _Ticket:
        """The cheap, synchronous half of admission, at the call: the checked arguments, the
        effective policy, the request (a bad one raises here, before anything runs)."""
        check_names(args)
        msgs = validate.messages(messages)
        named = self._effective(validate.policy_ref(args.get("policy")), args)
        pol = self._roster.bind(named)
        request = build_request(msgs, pol, args)
        forced, clouds = args.get("engine"), self._roster.cloud_order(named)
        if forced is not None:
            forced, clouds = self._forced(forced, clouds)
        ticket = _Ticket(request, pol, forced, args.get("plan"), streamed, clouds)
        ticket.cloud = self._pick_cloud(ticket)
        check_constraints(request, self._sides(ticket), forced)
        return ticket

    def _forced(
        self, engine: object, clouds: tuple[EngineName, ...]
    ) -> tuple[EngineName, tuple[EngineName, ...]]:
        """The call's `engine=`: a side ("local", "cloud": the policy's clouds) or an engine's
        name; the side it forces and the clouds that may serve."""
        roster = self._roster
        names = tuple(dict.fromkeys(("local", "cloud", *roster.engines)))
        name = validate.one_of("engine", engine, names)
        side = name if name in ("local", "cloud") else roster.side(name)
        if side == "local" and roster.device is None or side == "cloud" and not roster.clouds:
            raise errors.ConfigError(f"no {side} engine configured on this client")
        if name in roster.clouds:
            clouds = (name,)
        return side, clouds or roster.clouds

    def _route(self, ticket: _Ticket, facts: RequestFacts, *, preview: bool) -> RoutePreview:
        """The decision from the facts and the live state; a request no engine may serve
        raises its refusal (a `RefusedError`)."""
        self._to_tier(ticket, facts)
        self._within_budget(ticket)
        sides = self._sides(ticket)
        route = self.routing.decide(
            ticket.request,
            ticket.policy,
            sides,
            {side: self.breakers[e.name] for side, e in sides.items()},
            ticket.forced,
            preview=preview,
            plan=ticket.plan,
            streamed=ticket.streamed,
            facts=facts,
        )
        state = dataclasses.replace(route.state, clouds=self._considered(ticket))
        route = route._replace(state=state)
        if route.decision.primary is None:  # the documented type: privacy, budget, or else
            log.info("refused at routing%s: %s", " (preview)" * preview, route.decision.reason)
            raise refusal_error(
                route.decision,
                route.facts,
                ticket.policy,
                ticket.request,
                self._guards.get(ticket.cloud or ""),
                route.state.context,
            )
        return route

    def _plan_cloud(self, ticket: _Ticket, decision: Decision) -> None:
        """The cloud a plan's table names (the handoff's continuer, the cascade's escalation,
        the speculative verifier) takes the request's cloud part where the policy allows it
        and it can serve now; the request's other clouds stay its next ones."""
        name = ticket.policy.plan_cloud(decision.plan)
        if name is None or name not in ticket.clouds or not self._usable(name):
            return
        ticket.clouds = (name, *(c for c in ticket.clouds if c != name))
        ticket.cloud = name

    def _within_budget(self, ticket: _Ticket) -> None:
        """A cloud whose caps (its own, or the policy's priced by its model) cannot cover this
        request hands it to the next usable cloud in its order that can (routing then sees a
        cloud that fits); where none can, the cloud stays and routing says why."""
        if len(ticket.clouds) < 2 or ticket.forced is not None or not ticket.policy.cloud_allowed:
            return  # no other cloud to hand it to: routing's own budget check says the rest
        assert ticket.cloud is not None
        bound = prompt_token_bound(ticket.request.messages, ticket.request.tools)

        def fits(name: EngineName) -> bool:
            guard, request = self._guards[name], ticket.request
            max_tokens, user, tenant = request.max_tokens, request.user, request.tenant
            return guard.fits(ticket.policy.name, bound, max_tokens, user, tenant)[0]

        if fits(ticket.cloud):
            return
        for name in ticket.clouds:
            if name != ticket.cloud and self._usable(name) and fits(name):
                ticket.cloud = name
                return

    def _to_tier(self, ticket: _Ticket, facts: RequestFacts) -> None:
        """Under `[routing] tiers`: the clouds in the order the request's tier tries them (its
        own cloud first, then the harder tiers'), and the first that can serve now serves."""
        tiers, tier = ticket.policy.routing.tiers, facts.router_tier
        if tiers is None or tier is None or tier == "local":
            return
        ticket.clouds = self._roster.tiered(ticket.clouds, tiers, tier)
        ticket.cloud = self._pick_cloud(ticket, quality=True)  # the router asks for its quality

    def _effective(self, policy: str | Path | Policy | None, args: RequestArgs) -> Policy:
        """The policy as this client applies it to one request: the call's `plan=` (added to
        its plans, `Policy.with_plan`) and `show_drafts=`; the client's privacy mode is a
        floor; the policy's `[budget]` caps go to the cloud guard (scoped by its name)."""
        pol = self.policy if policy is None else self.policies.get(policy)
        plan, show_drafts = args.get("plan"), args.get("show_drafts")
        if plan is not None:
            pol = pol.with_plan(plan)
        if show_drafts is not None:
            pol = pol.with_(speculative={"show_drafts": validate.flag("show_drafts", show_drafts)})
        pol = pol.under_client(self.privacy)
        for guard in self._guards.values():  # a cap it cannot cost is a PolicyError
            guard.set_scoped_caps(pol.name, policy_caps(pol), pol.limits.per_user_rpm)
        return pol

    def _plan(
        self,
        decision: Decision,
        ticket: _Ticket,
        context: RequestContext,
        fallback_ttft_s: float | None,
    ) -> Plan:
        """The decided plan, its clouds bound to the request's context (every path of the plan
        carries it); the policy's other clouds that can serve now are its next clouds."""
        sides = self._sides(ticket)
        if ticket.cloud is not None:
            sides["cloud"] = self._guards[ticket.cloud].bind(context)
        others = [n for n in ticket.clouds if n != ticket.cloud and self._usable(n)]
        if ticket.forced is not None or "cloud" not in decision.engines:
            others = []
        backups = tuple(self._guards[n].bind(context) for n in others)
        ahead = (decision.deadline_s, fallback_ttft_s)
        predicted = tuple(self._backup_ttft_s(n, ticket, *ahead) for n in others)
        return choose_plan(
            decision,
            sides,
            ticket.request,
            ticket.policy,
            fallback_ttft_s,
            self.routing,
            backups,
            predicted,
        )

    def _backup_ttft_s(
        self, name: EngineName, ticket: _Ticket, deadline_s: float | None, lead_s: float | None
    ) -> float | None:
        """A next cloud's predicted time to a first token, as the race reads it: one predicted
        past the deadline is started for a late cloud only on a failure, so it would never be
        measured again; once it has gone `PROBE_AFTER` requests without a first token, it is
        probed: started with the device's rescue (`lead_s` before the deadline), as routing
        probes a primary."""
        predicted = self._predicted_ttft_s(name, ticket)
        if predicted is None or deadline_s is None or predicted <= deadline_s:
            return predicted
        if self.routing.latency.unmeasured.get(name, 0) < PROBE_AFTER:
            return predicted
        self.routing.latency.probed(name)
        return deadline_s if lead_s is None else min(deadline_s, lead_s)

    def _predicted_ttft_s(self, name: EngineName, ticket: _Ticket) -> float | None:
        """The engine's expected time to a first token for this request (None: unmeasured)."""
        latency, route = self.routing.latency, ticket.route
        if route is None or not latency.knows(name):
            return None
        facts = route.facts
        return latency.predict(name, facts.prompt_tokens, facts.max_tokens).ttft_s

    async def _drive(self, run: RequestRun, ticket: _Ticket) -> None:
        try:
            with self.telemetry.request(run.trace):
                await run.run(partial(self._serve, ticket))
        finally:
            self._runs.discard(run)
            await self._after(run, ticket)

    async def _after(self, run: RequestRun, ticket: _Ticket) -> None:
        """What the client learns from a finished request: the latency model, the local KV
        cache's prompt, the decision log's row (a request refused at admission has none)."""
        request, route = ticket.request, ticket.route
        if route is not None:
            self.routing.latency.observe_trace(run.trace, route.facts.prompt_tokens)
        if ticket.cloud_start is not None and run.trace.cloud_cancelled:
            ticket.cloud_start.extra = True  # a cloud request paid for and not used
        if self._roster.device in run.trace.started:
            self.routing.note_local(request.messages)
        if ticket.forced != "cloud" and "local" in ticket.policy.order:  # a local turn may come
            self._continue_locally(run, request)
        content = self.telemetry.content(request.messages, run.delivered_text, run.calls)
        if content is not None:
            run.rec.captured(content)
        self.telemetry.finished(run.trace, request.messages, run.delivered_text, run.calls)
        with anyio.CancelScope(shield=True):  # the request's spans are not lost on cancel
            await self.telemetry.export(run.trace)
        if self.decision_log is not None:
            await self._log_row(self.decision_log, run.trace, ticket)

    async def _log_row(self, dlog: DecisionLogLike, trace: Trace, ticket: _Ticket) -> None:
        """The request's row in the decision log, and feedback the app gave before it was
        written. A log that fails (a lost Redis server, a full disk) costs that row, with a
        warning: the answer was delivered, and the client's other requests go on."""
        route = ticket.route
        score = None if route is None else route.facts.router_score
        rid = trace.request_id
        try:
            with anyio.CancelScope(shield=True):  # a few ms: the row is not lost on cancel
                await anyio.to_thread.run_sync(
                    _log_decision, dlog, trace, ticket.request, ticket.policy.name, score
                )
            with self._log_lock:
                self._log_pending.discard(rid)
                early = self._early_feedback.pop(rid, None)
            if early is not None:
                dlog.feedback(rid, early)
        except Exception as exc:  # whatever the store raised: never the app's error
            with self._log_lock:
                self._log_pending.discard(rid)
                self._early_feedback.pop(rid, None)
            log.warning(
                "the decision log lost request %s's row: %s: %s", rid, type(exc).__name__, exc
            )

    def _continue_locally(self, run: RequestRun, request: GenerationRequest) -> None:
        """The cloud wrote the end of this answer: have the local engine prefill the
        conversation with it, in the background, so that a local next turn pays only for its
        new message (one at a time, the last `WARM_QUEUE` waiting; any request cuts one). Not
        for a request the caller sent to the cloud, nor under a policy without the local
        engine: their next turns are the cloud's too, and a warm-up would only spend the
        device's CPU."""
        trace, local = run.trace, self.local
        if not isinstance(local, Warms) or self._tg is None:
            return
        if trace.error_type is not None or run.calls or not trace.spans:
            return
        if self._roster.side(trace.spans[-1].engine) != "cloud" or not run.delivered_text:
            return
        messages = [*request.messages, {"role": "assistant", "content": run.delivered_text}]
        key = request.conversation
        if key is not None:  # the conversation's newer turn replaces its waiting one
            self._drop_warm_ups(key)
        self._to_warm.append(_WarmUp(messages, key))
        if self._warming is None:
            self._warming = anyio.CancelScope()
            self._tg.start_soon(self._warm_all, local, self._warming)

    async def _warm_all(self, local: Warms, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                while self._to_warm:
                    await self._warm(local, self._to_warm.popleft())
        finally:
            self._warming = None

    async def _warm(self, local: Warms, job: _WarmUp) -> None:
        try:
            tokens = await local.warm(job.messages, job.key)
            log.debug("the local engine prefilled %d tokens of a cloud turn", tokens)
        except errors.HybridError as exc:  # a background nicety: never the app's error
            log.debug("the local engine did not prefill a cloud turn: %r", exc)

    def _drop_warm_ups(self, key: str) -> None:
        """Drop the warm-ups waiting for the conversation the app keyed `key`."""
        self._to_warm = deque((w for w in self._to_warm if w.key != key), WARM_QUEUE)

    async def forget(self, conversation: str) -> None:
        """The app closed the conversation it keyed `conversation` (`stream(...,
        conversation=...)`): the local engine drops the KV state it kept for it, and a warm-up
        waiting for it is dropped, so that it takes no more memory."""
        validate.conversation(conversation)
        self._drop_warm_ups(conversation)
        local = self.local
        if isinstance(local, Warms):
            freed = await local.forget(conversation)
            log.debug("forgot a conversation: %d bytes of KV state freed", freed)

    def quota(
        self,
        user: str,
        policy: str | Path | Policy | None = None,
        *,
        tenant: Tenant | None = None,
    ) -> Quota:
        """What the end user `user` (of `tenant`, where the app has tenants) has spent and has
        left this UTC day and month under the policy's per-user caps (`[budget]
        per_user_day_usd`, `per_user_month_usd`; None: the client's policy), over every cloud's
        ledger: for the app to show, like a quota state. Without a ledger, nothing was spent."""
        validate.user(user)
        pol = self.policy if policy is None else self.policies.get(policy)
        name = None if tenant is None else tenant.name
        return user_quota(self.ledgers(), policy_caps(pol), user, name)

    def ledgers(self) -> list[Ledger]:
        """Each distinct ledger the client's clouds book in (none without a budget)."""
        return list({id(g.ledger): g.ledger for g in self._guards.values() if g.ledger}.values())

    def stats(self) -> StatsReport:
        """Rolling P50/P95/P99 of TTFT, TPOT, ITL and the delivery hop, per engine, per policy
        and overall, with counts (requests, failures, fallbacks, hedges, parallel starts,
        deadline misses, the cloud's share, the spend), over the telemetry's window."""
        return self.telemetry.stats.report()

    def feedback(self, request: Trace | str, good: bool) -> None:
        """The user's verdict on an answer (by its trace or request id), for the decision log;
        `hybridllm router train --from-log` learns from it."""
        if self.decision_log is None:
            raise errors.ClientStateError("feedback needs a decision_log= on the client")
        rid = request.request_id if isinstance(request, Trace) else request
        with self._log_lock:
            if rid in self._log_pending:  # its row is still being written: applied after it
                self._early_feedback[rid] = good
                return
        self.decision_log.feedback(rid, good)

    async def router_score(
        self, messages: Messages, *, rotations_ms: float | None = None
    ) -> RouterScore:
        """Stage 1, stage 2 (the local model's own signals) and the combined score.
        `rotations_ms`: the most a multiple-choice prompt's option rotations may add, priced
        before they start (past it they are not read and the prompt is scored without them,
        `RouterScore.model` "combined_plain"); None: always read."""
        msgs = validate.messages(messages)
        if rotations_ms is not None:
            validate.number("rotations_ms", rotations_ms, minimum=0.0)
        max_s = None if rotations_ms is None else rotations_ms / 1000.0
        return await score_messages(self.routing.router, self.local, msgs, rotations_max_s=max_s)

    async def complete(
        self,
        messages: Messages,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (as openai-python's own `timeout=`)
        **args: Unpack[StreamArgs],
    ) -> Completion:
        """The whole answer at once, with its trace (the arguments of `stream()`). Nothing is
        streamed, so a cascade may judge the whole local answer (`cascade_judge`). `timeout`:
        seconds for the whole answer (None: no bound); past it the request is closed and
        `AnswerTimeoutError` holds what had come (its text, tool calls and trace)."""
        if timeout is not None:
            validate.number("timeout", timeout, above=0.0)
        s = self._start(messages, args, streamed=False)
        pieces: list[str] = []
        calls: list[ToolCall] = []
        async with s:
            with anyio.move_on_after(math.inf if timeout is None else timeout) as bound:
                async for event in s.events():
                    if isinstance(event, Token):
                        pieces.append(event.text)
                    elif isinstance(event, ToolCall):
                        calls.append(event)
        text, finish = "".join(pieces), s.trace.finish_reason
        if bound.cancelled_caught:
            assert timeout is not None
            raise errors.AnswerTimeoutError(
                timeout, text=text, tool_calls=tuple(calls), trace=s.trace
            )
        fmt = args.get("response_format") or {}
        wants_json = fmt.get("type") in ("json_object", "json_schema")
        parsed = json.loads(text) if wants_json and text and not calls else None  # checked
        return Completion(text, s.trace, tuple(calls), finish, parsed)

    def _outcome(self, engine: EngineName, exc: BaseException | None) -> None:
        """An engine's outcome: its circuit counts it, and an engine found unreachable is said
        once at WARNING (the answer goes on elsewhere, silently in a plain `async for`), again
        only after it has answered in between."""
        self.breakers[engine].record(exc)
        if exc is None:
            self._unreachable.discard(engine)
        elif isinstance(exc, UNREACHABLE) and engine not in self._unreachable:
            self._unreachable.add(engine)
            log.warning("the %s engine is unreachable (%s); the other engine serves", engine, exc)

    # ---- blocking wrappers ------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._blocking_portal()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close a client that was used through the blocking wrappers."""
        portal_cm, client_cm = self._portal_cm, self._sync_cm
        self._portal = self._portal_cm = self._sync_cm = None
        if portal_cm is not None:
            try:
                if client_cm is not None:
                    client_cm.__exit__(None, None, None)
            finally:
                portal_cm.__exit__(None, None, None)

    def _blocking_portal(self) -> BlockingPortal:
        if self._portal is None:
            if self._tg is not None:
                raise errors.ClientStateError(
                    "this client is open in an event loop: use stream(), not stream_sync()"
                )
            portal_cm = start_blocking_portal()
            portal = portal_cm.__enter__()
            # the client's task group must live in one task: let the portal host it
            client_cm = portal.wrap_async_context_manager(self)
            try:
                client_cm.__enter__()
            except BaseException:
                portal_cm.__exit__(None, None, None)
                raise
            self._portal, self._portal_cm, self._sync_cm = portal, portal_cm, client_cm
        return self._portal

    def stream_sync(self, messages: Messages, **args: Unpack[StreamArgs]) -> Iterator[str]:
        """Blocking token iterator for scripts without an event loop (the arguments of
        `stream()`)."""
        return self._blocking(_texts, messages, args)

    def events_sync(
        self, messages: Messages, **args: Unpack[StreamArgs]
    ) -> Generator[Event, None, None]:
        """Blocking iterator of the typed events of `stream(...).events()`, for framework
        adapters whose sync methods need the route, tool calls and trace as well as the text
        (`hybridllm.integrations.langchain`). Leaving it early stops every engine, as
        `Stream.aclose()` does."""
        return self._blocking(Stream.events, messages, args)

    def _blocking(
        self, items_of: Callable[[Stream], AsyncIterator[T]], messages: Messages, args: StreamArgs
    ) -> Generator[T, None, None]:
        """`items_of(stream)` one by one through the client's blocking portal; leaving early
        closes the stream (every engine stops)."""
        portal = self._blocking_portal()
        s: Stream = portal.call(partial(self.stream, messages, **args))
        items = items_of(s)
        try:
            while True:
                try:
                    item: T = portal.call(items.__anext__)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            portal.call(s.aclose)

    def complete_sync(
        self, messages: Messages, *, timeout: float | None = None, **args: Unpack[StreamArgs]
    ) -> Completion:
        """The whole answer at once, blocking (the arguments of `stream()`, and `timeout` as
        `complete()` takes it)."""
        portal = self._blocking_portal()
        call = partial(self.complete, messages, timeout=timeout, **args)
        result: Completion = portal.call(call)
        return result

    def forget_sync(self, conversation: str) -> None:
        """`forget()`, blocking."""
        self._blocking_portal().call(self.forget, conversation)


@dataclass(frozen=True, slots=True)
class _WarmUp:
    """A conversation waiting for the local engine to prefill a turn the cloud served, and the
    app's key for it (None: none given)."""

    messages: list[Message]
    key: str | None


def _texts(stream: Stream) -> AsyncIterator[str]:
    return stream  # `async for text in stream`: the answer's text


def _telemetry(telemetry: object) -> Telemetry:
    """The client's `telemetry=` argument, checked (None: the default `Telemetry()`)."""
    if telemetry is None:
        return Telemetry()
    if not isinstance(telemetry, Telemetry):
        raise errors.InvalidArgumentError("telemetry", telemetry, "a Telemetry or None")
    return telemetry


def _log_decision(
    log: DecisionLogLike, trace: Trace, request: GenerationRequest, scope: str, score: float | None
) -> None:
    from hybridllm.routing.features import extract

    rid = log.record(
        route=trace.started[0] if trace.started else "none",
        features=extract(request.messages).dense_dict(),
        score=score,
        policy=scope,
        messages=request.messages,
        request_id=trace.request_id,
    )
    log.outcome(
        rid,
        engine=trace.engine,
        ttft_ms=trace.ttft_ms,
        error_kind=None if trace.error_type is None else trace.error_type.__name__,
        fallback=trace.fell_back,
        cascade=None if trace.cascade is None else trace.cascade.as_dict(),
        trace=trace.to_dict(),
    )


def normalize_messages(messages: Messages) -> tuple[Message, ...]:
    """A prompt string becomes one user message; bad messages get an `InvalidArgumentError`."""
    return validate.messages(messages)
