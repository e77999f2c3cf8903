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
import statistics
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import anyio
from anyio.abc import TaskGroup
from anyio.from_thread import BlockingPortal, start_blocking_portal

from hybridllm import errors
from hybridllm.budget import Cap, Ledger, Prices
from hybridllm.engines.base import Engine, GenerationRequest, Message, PrivacyMode
from hybridllm.engines.guarded import GuardedEngine
from hybridllm.events import EngineName
from hybridllm.health import CircuitBreaker
from hybridllm.orchestrate import race
from hybridllm.policy import Policy, resolve_policy
from hybridllm.stream import RequestRun, Stream, _Item
from hybridllm.trace import Trace

Messages = str | Sequence[Mapping[str, str]]
Plan = Callable[[RequestRun], Awaitable[None]]
_ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})


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
        privacy: PrivacyMode = "off",
        ledger: Ledger | str | Path | None = None,
        prices: Prices | str | Path | None = None,
        budget_caps: Sequence[Cap] = (),
    ) -> None:
        """`privacy="keep-local"` keeps requests holding personal or secret data off the cloud
        engine; `ledger` (a `Ledger` or an SQLite path), `prices` (a `Prices` or a TOML path) and
        `budget_caps` reserve and settle every cloud request's cost against the caps. Any of them
        wraps the cloud engine in a `GuardedEngine`."""
        if local is None and cloud is None:
            raise errors.ConfigError("HybridClient needs at least one engine (local= or cloud=)")
        if cloud is not None and (privacy != "off" or ledger is not None or budget_caps):
            cloud = GuardedEngine(
                cloud, privacy=privacy, ledger=ledger, prices=prices, caps=budget_caps
            )
        self.local = local
        self.cloud = cloud
        self.policy = resolve_policy(policy)
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._runs: set[RequestRun] = set()
        self._ttft_ms: dict[EngineName, deque[float]] = {
            "local": deque(maxlen=100),
            "cloud": deque(maxlen=100),
        }
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
        except BaseExceptionGroup as group:
            with anyio.CancelScope(shield=True):
                for engine in self.engines.values():
                    await engine.aclose()
            raise _first_error(group) from None
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        return self

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
    ) -> Stream:
        """Start a request now and return its `Stream` (TTFT is measured from this call)."""
        trace = Trace()
        if self._tg is None:
            raise errors.ClientStateError(
                "the client is not open: use 'async with HybridClient(...) as client:'"
            )
        pol = self.policy if policy is None else resolve_policy(policy)
        request = GenerationRequest(
            messages=normalize_messages(messages),
            max_tokens=pol.max_tokens if max_tokens is None else _positive(max_tokens),
            temperature=pol.temperature if temperature is None else temperature,
            top_p=pol.top_p if top_p is None else top_p,
            stop=pol.stop if stop is None else ((stop,) if isinstance(stop, str) else tuple(stop)),
            seed=seed,
            scope=pol.name,
        )
        target, backup, reason = self._route(pol, engine)
        deadline = None if pol.ttft_deadline_ms is None else pol.ttft_deadline_ms / 1000.0
        plan: Plan
        if backup is not None:
            plan = partial(
                race,
                primary=target,
                fallback=backup,
                request=request,
                deadline_s=deadline,
                reason=reason,
                hedge_s=self._hedge_s(pol, target.name),
                stall_s=None if pol.stall_ms is None else pol.stall_ms / 1000.0,
            )
        else:
            plan = partial(
                RequestRun.single,
                engine=target,
                request=request,
                reason=reason,
                retries=pol.retries,
                deadline_s=deadline,
            )
        send, recv = anyio.create_memory_object_stream[_Item](math.inf)
        run = RequestRun(trace, send, self._outcome)
        self._runs.add(run)
        self._tg.start_soon(self._drive, run, plan)
        return Stream(run, recv)

    async def _drive(self, run: RequestRun, plan: Plan) -> None:
        try:
            await run.run(plan)
        finally:
            self._runs.discard(run)
            tr = run.trace
            if tr.engine is not None and tr.ttft_ms is not None and tr.error is None:
                self._ttft_ms[tr.engine].append(tr.ttft_ms)

    def _hedge_s(self, policy: Policy, primary: EngineName) -> float | None:
        """When to hedge: the policy's delay, or the primary's observed p95 TTFT for "auto"."""
        if policy.hedge_after_ms is None:
            return None
        if policy.hedge_after_ms != "auto":
            return policy.hedge_after_ms / 1000.0
        seen = self._ttft_ms[primary]
        if len(seen) < 5:
            return None  # not enough history yet: the deadline alone applies
        return statistics.quantiles(seen, n=20, method="inclusive")[18] / 1000.0

    async def complete(self, messages: Messages, **kwargs: Any) -> Completion:
        """The whole answer at once, with its trace."""
        async with self.stream(messages, **kwargs) as s:
            text = "".join([token async for token in s])
        return Completion(text, s.trace)

    def _route(self, policy: Policy, forced: str | None) -> tuple[Engine, Engine | None, str]:
        """(primary, backup or None, reason). A forced engine gets no backup."""
        engines = self.engines
        if forced is not None:
            if forced not in ("local", "cloud"):
                raise errors.ConfigError(f"engine must be 'local' or 'cloud', not {forced!r}")
            if forced == "cloud" and not policy.allow_cloud:
                raise errors.PolicyError(f"policy {policy.name!r} keeps requests on the device")
            if forced not in engines:
                raise errors.ConfigError(f"no {forced} engine configured on this client")
            return engines[forced], None, f"engine={forced} forced by the caller"
        local = engines.get("local")
        cloud = engines.get("cloud") if policy.allow_cloud else None
        why = f"policy {policy.name!r} prefers {policy.prefer}"
        # an open circuit sends requests to the local engine at once (when there is one)
        if cloud is not None and local is not None and not self.breakers["cloud"].allow():
            cloud = None
            why += "; cloud circuit open"
        first, second = (cloud, local) if policy.prefer == "cloud" else (local, cloud)
        if first is None:
            first, second = second, None
            if policy.prefer != "auto":
                why += f"; no {policy.prefer} engine available"
        if first is None:
            raise errors.PolicyError(
                f"policy {policy.name!r} allows no engine this client has (cloud disabled)"
            )
        return first, second, why

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
    """A prompt string becomes one user message; malformed messages get a ConfigError."""
    if isinstance(messages, str):
        return ({"role": "user", "content": messages},)
    out: list[Message] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise errors.ConfigError(f"messages[{i}] must be a mapping with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise errors.ConfigError(f"messages[{i}].role must be one of {sorted(_ROLES)}")
        if not isinstance(content, str):
            raise errors.ConfigError(f"messages[{i}].content must be a string")
        out.append({"role": role, "content": content})
    if not out:
        raise errors.ConfigError("messages is empty")
    return tuple(out)


def _positive(n: int) -> int:
    if n < 1:
        raise errors.ConfigError(f"max_tokens must be at least 1, not {n}")
    return n
