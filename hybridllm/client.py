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

import math
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.from_thread import BlockingPortal, start_blocking_portal

from hybridllm import errors
from hybridllm.engines import validate
from hybridllm.engines.base import Engine, EngineOptions, GenerationRequest, Message
from hybridllm.events import EngineName, Priority
from hybridllm.guard.budget import Cap, Ledger, Prices
from hybridllm.guard.guarded import PRIVACY_MODES, GuardedEngine, PrivacyMode, RequestContext
from hybridllm.policy import PlanName, Policy, PolicyCache
from hybridllm.routing.decide import Decision, LiveState, RequestFacts
from hybridllm.routing.inputs import Scorer
from hybridllm.routing.log import DecisionLog
from hybridllm.routing.score import RouterScore
from hybridllm.runtime.gather import (
    GuardBudget,
    Routing,
    policy_caps,
    privacy_kinds,
    refusal_error,
)
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.runtime.latency import LatencyModel
from hybridllm.runtime.plans.cascade import nothing_streamed, score_messages
from hybridllm.runtime.plans.choose import Plan, choose_plan
from hybridllm.runtime.stream import RequestRun, Stream, StreamItem
from hybridllm.runtime.trace import Trace

Messages = str | Sequence[Mapping[str, str]]


@dataclass(frozen=True)
class Completion:
    text: str
    trace: Trace


class HybridClient:
    def __init__(
        self,
        local: Engine | None = None,
        cloud: Engine | None = None,
        *,
        policy: str | Path | Policy | None = None,
        policy_dirs: Sequence[str | Path] | None = None,
        router: Scorer | Literal["default"] | None = "default",
        privacy: PrivacyMode = "off",
        ledger: Ledger | str | Path | None = None,
        prices: Prices | str | Path | None = None,
        budget_caps: Sequence[Cap] = (),
        latency: LatencyModel | None = None,
        decision_log: DecisionLog | str | Path | None = None,
    ) -> None:
        """`privacy="keep-local"` keeps requests holding personal or secret data off the cloud
        engine; `ledger` (a `Ledger` or an SQLite path), `prices` (a `Prices` or a TOML path) and
        `budget_caps` reserve and settle every cloud request's cost against the caps (with
        `prices` alone, an in-memory ledger holds the policies' own `[budget]` caps). The cloud
        engine is wrapped in a `GuardedEngine`, which enforces both at its seam on every path
        (fallback, hedge, continuation); routing reads the same detector and ledger to pick the
        local engine up front, with the reason. `router`: an object with `score(messages)` and
        `threshold(...)`, such as `hybridllm.routing.Router.load(path)`; "default" loads the
        shipped router (on a worker thread while the engines start) when the client has both
        engines; None: no router (policies then route by preference and latency alone).
        `decision_log`: a `DecisionLog` (or its SQLite path) that gets one row per request -
        features, score, route, outcome - written off the event loop after the request ends;
        prompt text only with `DecisionLog(path, store_prompts=True)`."""
        if local is None and cloud is None:
            raise errors.ConfigError("HybridClient needs at least one engine (local= or cloud=)")
        for arg, eng in (("local", local), ("cloud", cloud)):
            if eng is not None and not isinstance(eng, Engine):
                raise errors.InvalidArgumentError(arg, eng, "an Engine (e.g. LlamaCppEngine())")
        validate.one_of("privacy", privacy, PRIVACY_MODES)
        policy = validate.policy_ref(policy)
        for i, d in enumerate(policy_dirs or ()):
            validate.directory(f"policy_dirs[{i}]", d)
        if router not in (None, "default") and not callable(getattr(router, "score", None)):
            raise errors.InvalidArgumentError("router", router, 'None, "default" or a Router')
        self._guard: GuardedEngine | None = None
        if cloud is not None:
            if prices is not None and ledger is None:
                ledger = Ledger()
            cloud = self._guard = GuardedEngine(
                cloud, privacy=privacy, ledger=ledger, prices=prices, caps=budget_caps
            )
        self.privacy: PrivacyMode = privacy
        self.local = local
        self.cloud = cloud
        self.policies = PolicyCache(policy_dirs)
        self.policy = self.policies.get(policy)
        if self._guard is not None:  # its start() loads the privacy scan's NER pipelines
            self._guard.preload_privacy = self.policy.privacy.mode != "off"
        gate = (
            None if self._guard is None or self._guard.ledger is None else GuardBudget(self._guard)
        )
        if isinstance(decision_log, str | Path):
            decision_log = DecisionLog(Path(decision_log).expanduser())
        self.decision_log = decision_log
        self._log_lock = threading.Lock()
        self._log_pending: set[str] = set()  # request ids whose row is not written yet
        self._early_feedback: dict[str, bool] = {}
        self._router_spec = router
        scorer = None if router == "default" else router
        self.routing = Routing(latency or LatencyModel(), scorer, gate, privacy_kinds)
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._runs: set[RequestRun] = set()
        self.breakers: dict[EngineName, CircuitBreaker] = {
            "local": CircuitBreaker(),
            "cloud": CircuitBreaker(),
        }
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._sync_cm: AbstractContextManager[HybridClient] | None = None

    @property
    def engines(self) -> dict[EngineName, Engine]:
        found: dict[EngineName, Engine] = {}
        if self.local is not None:
            found["local"] = self.local
        if self.cloud is not None:
            found["cloud"] = self.cloud
        return found

    # ---- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise errors.ClientStateError("this HybridClient is already open")
        try:
            async with anyio.create_task_group() as tg:
                for engine in self.engines.values():
                    tg.start_soon(engine.start)
                if self._router_spec == "default" and len(self.engines) == 2:
                    tg.start_soon(self._load_default_router)
        except BaseExceptionGroup as group:
            with anyio.CancelScope(shield=True):
                for engine in self.engines.values():
                    await engine.aclose()
            raise _first_error(group) from None
        self.routing.seed_from(self.engines)
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        return self

    async def _load_default_router(self) -> None:
        from hybridllm.routing.router import Router  # scikit-learn loads only here

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

    def stream(
        self,
        messages: Messages,
        *,
        policy: str | Path | Policy | None = None,
        engine: Literal["local", "cloud"] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        options: Sequence[EngineOptions] = (),
        priority: Priority | None = None,
        plan: PlanName | None = None,
        show_drafts: bool | None = None,
    ) -> Stream:
        """Start a request now and return its `Stream` (TTFT is measured from this call).
        `options`: typed engine options (`LlamaOptions`, ...); each engine reads its own.
        `priority`: the request's class in a busy engine's queue (None: the policy's).
        `plan`: run this plan where it can ("handoff": local starts, cloud continues;
        "speculative": local drafts, cloud verifies, `show_drafts` adds Draft/Retract events).

        Every argument is checked before anything is sent (`engines.validate`): `messages` a
        non-blank prompt or a list of {"role", "content"} mappings whose last user message is
        not blank; `max_tokens` an int >= 1; `temperature` 0 to 2; `top_p` in (0, 1]; `stop`
        non-empty strings; `seed` 0 to 2**32 - 1; `engine` "local", "cloud" or None; `policy` a
        name, a path or a `Policy` (None: the client's). A bad one raises
        `InvalidArgumentError` (a `ConfigError`) naming it; no engine sees the request.
        `plan="cascade"`: the local model's confidence decides (`runtime/plans/cascade.py`)."""
        trace = Trace()
        if self._tg is None:
            raise errors.ClientStateError(
                "the client is not open: use 'async with HybridClient(...) as client:'"
            )
        msgs = validate.messages(messages)
        policy = validate.policy_ref(policy)
        pol = self._effective(self.policy if policy is None else self.policies.get(policy))
        pol = pol if plan is None else pol.with_plan(plan)
        if show_drafts is not None:
            pol = pol.with_(speculative={"show_drafts": validate.flag("show_drafts", show_drafts)})
        request = GenerationRequest(
            messages=msgs,
            max_tokens=pol.sampling.max_tokens if max_tokens is None else max_tokens,
            temperature=pol.sampling.temperature if temperature is None else temperature,
            top_p=pol.sampling.top_p if top_p is None else top_p,
            stop=pol.sampling.stop if stop is None else validate.stop(stop),
            seed=seed,
            options=options,  # type: ignore[arg-type]  # GenerationRequest checks and copies
            priority=pol.priority if priority is None else priority,  # the queue's class
        )
        privacy: PrivacyMode = "off" if pol.privacy.mode == "off" else "keep-local"
        context = RequestContext(scope=pol.name, privacy=privacy, on_settle=trace.settled)
        spec: Literal["speculative"] | None = "speculative" if plan == "speculative" else None
        decision, facts, state = self.decide(request, pol, engine, preview=False, plan=spec)
        trace.decision = decision.reasons
        trace.predicted_ttft_ms = {name: p.ttft_s * 1e3 for name, p in state.latency.items()}
        fb = state.latency.get(decision.fallback) if decision.fallback else None
        lead = (None if fb is None else fb.ttft_s) if decision.fallback_lead else 0.0
        how = self._plan(decision, request, context, pol, lead, plan)
        send, recv = anyio.create_memory_object_stream[StreamItem](math.inf)
        cloud_off = dict(decision.unavailable).get("cloud")  # a CloudUnavailable event says so
        run = RequestRun(trace, send, self._outcome, cloud_off)
        self._runs.add(run)
        if self.decision_log is not None:
            with self._log_lock:
                self._log_pending.add(trace.request_id)
        self._tg.start_soon(
            self._drive, run, how, facts.prompt_tokens, request, pol.name, facts.router_score
        )
        return Stream(run, recv)

    def _effective(self, policy: Policy) -> Policy:
        """The policy as this client applies it: the client's privacy mode is a floor, and the
        policy's `[budget]` caps go to the cloud guard (scoped by the policy's name)."""
        policy = policy.under_client(self.privacy)
        guard = self._guard
        if guard is not None:
            caps = policy_caps(policy)
            if caps and guard.ledger is None and policy.name not in guard.scoped_caps:
                warnings.warn(
                    f"policy {policy.name!r} has budget caps, but the client has no prices= to "
                    "cost cloud requests with: the caps are not enforced",
                    stacklevel=3,
                )
            guard.scoped_caps[policy.name] = caps
        return policy

    def decide(
        self,
        request: GenerationRequest,
        policy: Policy,
        forced: str | None = None,
        *,
        preview: bool = True,
        plan: Literal["speculative"] | None = None,
    ) -> tuple[Decision, RequestFacts, LiveState]:
        """Where `request` would run now under `policy`, and why (nothing is sent). A preview
        leaves the cloud circuit as it is (a half-open circuit keeps its probe for the next
        request); `stream()` decides with `preview=False`."""
        if forced is not None:
            validate.one_of("engine", forced, ("local", "cloud"))
            if forced not in self.engines:
                raise errors.ConfigError(f"no {forced} engine configured on this client")
        name: EngineName | None = "local" if forced == "local" else "cloud" if forced else None
        decision, facts, state = self.routing.decide(
            request, policy, self.engines, self.breakers, name, preview=preview, plan=plan
        )
        if decision.primary is None:  # the documented type: privacy, budget, or else
            raise refusal_error(decision, facts, policy, request, self._guard)
        return decision, facts, state

    def _plan(
        self,
        decision: Decision,
        request: GenerationRequest,
        context: RequestContext,
        policy: Policy,
        fallback_ttft_s: float | None,
        plan: PlanName | None = None,
    ) -> Plan:
        engines = self.engines
        if self._guard is not None:  # every path of this plan carries the request's context
            engines["cloud"] = self._guard.bind(context)
        return choose_plan(decision, engines, request, policy, fallback_ttft_s, plan, self.routing)

    async def _drive(
        self,
        run: RequestRun,
        plan: Plan,
        prompt_tokens: int,
        request: GenerationRequest,
        scope: str,
        score: float | None = None,
    ) -> None:
        try:
            await run.run(plan)
        finally:
            self._runs.discard(run)
            self.routing.latency.observe_trace(run.trace, prompt_tokens)
            if "local" in run.trace.started:
                self.routing.note_local(request.messages)
            if self.decision_log is not None:
                with anyio.CancelScope(shield=True):  # a few ms: the row is not lost on cancel
                    await anyio.to_thread.run_sync(
                        _log_decision, self.decision_log, run.trace, request, scope, score
                    )
                rid = run.trace.request_id
                with self._log_lock:
                    self._log_pending.discard(rid)
                    early = self._early_feedback.pop(rid, None)
                if early is not None:
                    self.decision_log.feedback(rid, early)

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

    async def router_score(self, messages: Messages) -> RouterScore:
        """Stage 1, stage 2 (the local model's own signals) and the combined score."""
        msgs = validate.messages(messages)
        return await score_messages(self.routing.router, self.engines.get("local"), msgs)

    async def complete(self, messages: Messages, **kwargs: Any) -> Completion:
        """The whole answer at once, with its trace."""
        with nothing_streamed():  # a cascade may judge the whole local answer
            s = self.stream(messages, **kwargs)
        async with s:
            text = "".join([token async for token in s])
        return Completion(text, s.trace)

    def _outcome(self, engine: EngineName, exc: BaseException | None) -> None:
        self.breakers[engine].record(exc)

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

    def stream_sync(self, messages: Messages, **kwargs: Any) -> Iterator[str]:
        """Blocking token iterator for scripts without an event loop."""
        portal = self._blocking_portal()
        s: Stream = portal.call(partial(self.stream, messages, **kwargs))
        try:
            while True:
                try:
                    token: str = portal.call(s.__anext__)
                except StopAsyncIteration:
                    return
                yield token
        finally:
            portal.call(s.aclose)

    def complete_sync(self, messages: Messages, **kwargs: Any) -> Completion:
        portal = self._blocking_portal()
        result: Completion = portal.call(partial(self.complete, messages, **kwargs))
        return result


def _log_decision(
    log: DecisionLog, trace: Trace, request: GenerationRequest, scope: str, score: float | None
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
        fallback=trace.fallback_reason is not None or bool(trace.switches),
        cascade=trace.cascade,
    )


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """Unwrap a task group's errors: the first HybridError if any, else the first error."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    hybrid = [e for e in leaves if isinstance(e, errors.HybridError)]
    return (hybrid or leaves)[0]


def normalize_messages(messages: Messages) -> tuple[Message, ...]:
    """A prompt string becomes one user message; bad messages get an `InvalidArgumentError`."""
    return validate.messages(messages)
