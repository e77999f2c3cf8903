"""`GuardedEngine`: privacy and budget checks wrapped around a cloud engine, at the seam.

    cloud = GuardedEngine(OpenAIEngine(...), privacy="keep-local",
                          ledger="spend.db", prices=prices, caps=[Cap(None, "day", 5.0)])

Like an httpx transport middleware, it sees every request the orchestrator sends to the cloud:
the first attempt, a retry, a fallback, a hedge, a mid-stream continuation (whose
`assistant_prefix` carries local text) and anything a later plan sends through `stream()`. Before
any byte leaves, it scans the whole request (every chat message, a continuation's included, with
the tool calls and tool results it carries; every string of the tool definitions and response
format; every string in the engine options) and raises `PrivacyBlockedError` on a finding (mode
"keep-local"); then it reserves the worst-case cost or raises `BudgetExceededError`. Both
refusals are typed and not retryable: the orchestrator answers from the local engine instead, and
the reason says privacy or budget.

The reservation is settled in a `finally`, so every way a stream ends is accounted for: from the
`Finish` chunk's reported usage; from counted deltas and tool calls (their tokens estimated) and
the prompt bound (which counts the tool definitions) when usage is missing,
the consumer left early, the request was cancelled or failed mid-answer; released when the request
was never sent (the engine yielded no `RequestSent` mark, which it yields just before sending, no
text and no `Finish`) or the endpoint answered with an HTTP error status (not billed). A settle
without reported usage counts the prompt at `prompt_token_bound` (the one upper bound, the same
the reservation held) and the deltas received: the ledger may overstate such a request, never
understate it.

The reservation is the request's true upper bound (`request_output_bound`: `max_tokens`, or a
larger one in `extra_body`, times its `n`, plus a Predicted Outputs prediction, whose rejected
tokens are billed as output), and the stream is held to it: an endpoint that sends more content
deltas than that bound is cut there (the answer ends with finish reason "length"). A request
settled above its reservation anyway (the usage it reports says more) is recorded as billed and
as an overrun: the ledger closes the request's caps (`guard.budget`), and the request's trace
says so (`Trace.overrun_usd`).

Where a request may go and under whose budget is not part of the request (`GenerationRequest`
is wire-only): the client passes a `RequestContext` (the policy's scope, its privacy mode) beside
it, by binding the guard to it for one request (`guard.bind(context)`), so every path of that
request's plan (retry, hedge, failover) carries the same context.

The wrapper exposes the `Engine` protocol, and forwards through itself the capabilities a plan
needs of the engine it wraps (`engines.capabilities`): `verification_post` (a verifier's request,
as a `guarded_call`), `verification_endpoint` and `set_api_key`. A method it does not guard does
not exist on it, so new cloud paths go through `stream()` or `guarded_call()`, never around the
guard; `wrapped()` names the engine guarded, to read (its info, its limit), not to send through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import aclosing
from dataclasses import dataclass, field, fields, is_dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from hybridllm import clock
from hybridllm.engines.base import (
    Engine,
    EngineInfo,
    GenerationRequest,
    Message,
    chat_messages,
    prompt_token_bound,
)
from hybridllm.engines.capabilities import Endpoint, Outgoing, SetsApiKey, VerifiesAtEndpoint
from hybridllm.engines.options import OpenAIOptions
from hybridllm.engines.tokens import estimate_text_tokens
from hybridllm.errors import (
    BudgetExceededError,
    CloudStatusError,
    ConfigError,
    LedgerUnavailableError,
    PolicyError,
    PrivacyBlockedError,
    RateLimitedError,
)
from hybridllm.events import Called, Chunk, Delta, EngineName, Finish, RequestSent
from hybridllm.guard.budget import (
    Cap,
    Ledger,
    ModelPrice,
    Prices,
    Reservation,
    SQLiteLedger,
    TokenUsage,
    tenant_caps,
    user_tag,
)
from hybridllm.guard.ledgers import as_ledger
from hybridllm.guard.privacy import Finding, kinds, message_texts, strings, tool_texts
from hybridllm.guard.privacy_judge import PrivacyJudge, borderline, person_names
from hybridllm.guard.privacy_ner import PrivacyScanner, default_scanner
from hybridllm.guard.rates import RateCounter, rate_counter
from hybridllm.policy import Tenant

log = logging.getLogger(__name__)
T = TypeVar("T")
PrivacyMode = Literal["keep-local", "off"]
PRIVACY_MODES: tuple[PrivacyMode, ...] = ("keep-local", "off")
# a request longer than this is scanned on a worker thread (the patterns: about 1 ms per
# 10,000 characters); with the NER layer, every request is (25 ms at 155 characters)
_SCAN_IN_THREAD_CHARS = 8_000


# told of each settled cloud request: the usage counted, its cost in USD, and what of that cost
# lay above its reservation (an overrun; 0.0 for a request that kept to its bound)
SettleHook = Callable[[TokenUsage, float, float], None]


@dataclass(frozen=True)
class RequestContext:
    """What the guard needs beside the wire request: the budget scope (a policy's name: its
    caps apply), the privacy mode for this request (None: the guard's own mode), and a hook
    told of each of its cloud requests the ledger settles (the request's trace records them;
    a released reservation costs nothing and is not told)."""

    scope: str = "default"
    privacy: PrivacyMode | None = None
    # scan with the NER layer too (when installed); a client passes its policy's `[privacy] ner`
    ner: bool = True
    on_settle: SettleHook | None = field(default=None, compare=False, repr=False)
    # when the request's deadline falls (`clock.now()` time; None: none): the privacy judge's
    # budget ends there
    due: float | None = None
    # the end user (the policy's per-user caps hold it) and the tenant billed (its caps hold
    # it): the request's `user` and `tenant`
    user: str | None = None
    tenant: Tenant | None = None

    def __post_init__(self) -> None:
        if self.privacy is not None and self.privacy not in PRIVACY_MODES:
            raise ConfigError(f"privacy must be one of {PRIVACY_MODES}, not {self.privacy!r}")


def request_token_bound(request: GenerationRequest) -> int:
    """The prompt tokens a reservation holds for `request`: `prompt_token_bound` of the chat
    messages it sends (a continuation's included, tool calls and results with them) and of its
    tool definitions and response format."""
    return prompt_token_bound(chat_messages(request), request.tools)


def request_output_bound(request: GenerationRequest) -> int:
    """The most output tokens `request` can be billed: `max_tokens` (or a larger `max_tokens` /
    `max_completion_tokens` in `OpenAIOptions.extra_body`) plus a Predicted Outputs prediction
    (one token per byte at most; rejected prediction tokens are billed as output), times the
    choices asked for (`n` in `extra_body`)."""
    out, n, prediction = request.max_tokens, 1, 0
    options = request.option(OpenAIOptions)
    if options is not None:
        extra = options.extra_body or {}
        out = max(out, _count(extra.get("max_tokens")), _count(extra.get("max_completion_tokens")))
        n = max(1, _count(extra.get("n")))
        prediction = len((options.prediction or "").encode("utf-8"))
    return (out + prediction) * n


def _count(value: object) -> int:
    """A JSON field's positive integer, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def request_texts(request: GenerationRequest) -> Iterator[tuple[str, str]]:
    """(location, text) for every string that would leave with the request: the chat messages
    (tool calls' arguments and tool results included), the tool definitions and response
    format, the engine options."""
    yield from message_texts(chat_messages(request))
    yield from tool_texts(request.tools)
    for option in request.options:
        if is_dataclass(option):
            for f in fields(option):
                where = f"options.{type(option).__name__}.{f.name}"
                yield from strings(where, getattr(option, f.name))


def _usage(data: Mapping[str, Any]) -> TokenUsage | None:
    """The usage a JSON answer reports (None: none, or not counts)."""
    u = data.get("usage")
    if not isinstance(u, Mapping):
        return None
    p, c = u.get("prompt_tokens"), u.get("completion_tokens")
    return TokenUsage(p, c) if isinstance(p, int) and isinstance(c, int) else None


def usd(amount: float) -> str:
    """An amount with enough decimals to tell small ones apart ($0.0000312, not $0.0000)."""
    if amount == 0:
        return "$0"
    decimals = 2
    while decimals < 9 and abs(amount) < 10 ** (2 - decimals):
        decimals += 1
    return f"${amount:.{decimals}f}"


class GuardedEngine:
    """Wraps a cloud `Engine`: privacy refusal, then budget reservation, then the request."""

    def __init__(
        self,
        inner: Engine,
        *,
        privacy: PrivacyMode = "keep-local",
        ledger: Ledger | str | Path | None = None,
        prices: Prices | str | Path | None = None,
        caps: Sequence[Cap] = (),
        scanner: PrivacyScanner | None = None,
        judge: PrivacyJudge | None = None,
    ) -> None:
        """`ledger`: a `Ledger` (`SQLiteLedger`, `RedisLedger`) or what `ledger_from_url` reads
        (an SQLite path, `sqlite:///path`, `redis://host:port/db`); `prices`: a `Prices` or the path
        of its TOML file (None: the shipped prices, `Prices.shipped()`); `caps` without a ledger
        get an in-memory one (this process only); a ledger for a model no price covers is a
        `ConfigError`;
        `scanner`: the privacy scan (None: the process's shared one, patterns + NER when
        installed). `start()` (or `preload()`) loads its NER pipelines when privacy is on
        (`privacy` here, or `preload_privacy` set by a client whose policy turns it on).
        `judge`: the local model as the judge of borderline prompts under "keep-local"
        (`privacy_judge`; None: none)."""
        if privacy not in PRIVACY_MODES:
            raise ConfigError(f"privacy must be one of {PRIVACY_MODES}, not {privacy!r}")
        if ledger is not None:
            ledger = as_ledger(ledger)
        if prices is None:
            prices = Prices.shipped()
        elif isinstance(prices, str | Path):
            prices = Prices.from_toml(prices)
        if caps and ledger is None:
            ledger = SQLiteLedger()  # caps need a ledger: an in-memory one for this process
        self.inner = inner
        self.name: EngineName = inner.name
        self.privacy: PrivacyMode = privacy
        self.scanner = scanner or default_scanner()
        self.judge = judge
        self.preload_privacy = False
        # a client preloads once all its engines have started (`preload`): the pipelines' load
        # holds the GIL for seconds and slowed the local engine's start beside it 3x
        self.preload_at_start = True
        self._preloading = False
        self.ledger: Ledger | None = ledger
        self.caps = tuple(caps)
        # caps of one scope (a policy's own budget), set by the client as it meets the policy
        self.scoped_caps: dict[str, tuple[Cap, ...]] = {}
        # a scope's `[limits] per_user_rpm`, and where it is counted (the ledger's counter)
        self.scoped_rpm: dict[str, int] = {}
        self._rates: tuple[Ledger, RateCounter] | None = None
        self.model = inner.info().model
        self.price: ModelPrice | None = prices.find(self.model)
        if ledger is not None:
            self.price = prices.price(self.model)  # a ledger that cannot cost: the error now

    # ---- the Engine protocol ----------------------------------------------------------------

    async def start(self) -> None:
        await self.inner.start()
        if self.preload_at_start:
            self.preload()

    def preload(self) -> None:
        """Load the privacy scan's NER pipelines on a thread where privacy is on (`privacy`, or
        `preload_privacy`), once: off the first request's path (a scan that needs them
        meanwhile waits for them on its worker thread)."""
        if (self.privacy != "off" or self.preload_privacy) and not self._preloading:
            self._preloading = True
            threading.Thread(
                target=_preload_quietly, args=(self.scanner,), name="hybridllm-ner", daemon=True
            ).start()

    def info(self) -> EngineInfo:
        return self.inner.info()

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return self.inner.predict_ttft_s(request)

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return self.inner.count_tokens(messages)

    def bind(self, context: RequestContext) -> BoundGuard:
        """This guard as one request's engine: every stream it sends carries `context`."""
        return BoundGuard(self, context)

    def wrapped(self) -> Engine:
        """The cloud engine guarded, to read (its info, its limit): never send through it."""
        return self.inner

    def set_api_key(self, api_key: str) -> None:
        """The guarded engine's `set_api_key` (`ConfigError` when it takes no key)."""
        if not isinstance(self.inner, SetsApiKey):
            raise ConfigError(f"the cloud engine ({type(self.inner).__name__}) takes no API key")
        self.inner.set_api_key(api_key)

    # ---- verifying drafts: the guarded engine's, through the guard ----------------------------

    def verification_endpoint(self) -> Endpoint | None:
        inner = self.inner
        return inner.verification_endpoint() if isinstance(inner, VerifiesAtEndpoint) else None

    async def verification_post(
        self,
        path: str,
        body: Mapping[str, Any],
        outgoing: Outgoing | None = None,
        context: RequestContext | None = None,
    ) -> dict[str, Any]:
        """The guarded engine's `verification_post` as a `guarded_call`: `outgoing` (None:
        read from the body) scanned and reserved, the answer's usage settled."""
        inner = self.inner
        if not isinstance(inner, VerifiesAtEndpoint):
            raise ConfigError(f"the cloud engine ({type(inner).__name__}) cannot verify drafts")
        sent = outgoing or Outgoing.of_body(body)

        async def call() -> tuple[dict[str, Any], TokenUsage | None]:
            data = await inner.verification_post(path, body)
            return data, _usage(data)

        bounds = sent.prompt_tokens, sent.max_tokens
        return await self.guarded_call(sent.texts, *bounds, call, context)

    async def aclose(self) -> None:
        await self.inner.aclose()

    # ---- guards -----------------------------------------------------------------------------

    def findings(self, request: GenerationRequest, deep: bool = True) -> tuple[Finding, ...]:
        """What the scanner finds in everything the request would send."""
        return self.scanner.scan((), extra=request_texts(request), deep=deep)

    def check(
        self, request: GenerationRequest, context: RequestContext | None = None
    ) -> tuple[Finding, ...]:
        """Raise `PrivacyBlockedError` if the request may not leave the device; else what was
        found (names alone, left to a judge that `clears_names`)."""
        mode = (context.privacy if context is not None else None) or self.privacy
        if mode != "keep-local":
            return ()
        found = self.findings(request, deep=context is None or context.ner)
        judge = self.judge
        if found and not (judge and judge.clears_names and set(kinds(found)) == {"person"}):
            log.info("privacy: %s found, kept from the %s engine", kinds(found), self.name)
            raise PrivacyBlockedError(kinds(found), engine=self.name)
        return found

    async def judged(
        self, request: GenerationRequest, context: RequestContext, found: Sequence[Finding]
    ) -> None:
        """Ask the judge about a borderline request (`privacy_judge.borderline`) bound for the
        cloud under "keep-local"; raise `PrivacyBlockedError` (kind "judge") when it says
        private or its budget (the judge's own, cut at the request's deadline) runs out."""
        mode = context.privacy or self.privacy
        if self.judge is None or mode != "keep-local":
            return
        sent = list(request_texts(request))
        texts = [text for loc, text in sent if loc.endswith(".content")]
        case = borderline(texts, kinds(found))
        if case is None:
            return
        budget = None if context.due is None else max(0.0, context.due - clock.now())
        names = person_names(found, sent) if case == "name_alone" else []
        verdict = await self.judge.verdict(texts, budget, names)
        if verdict.private:
            why = "its deadline" if verdict.missed_deadline else "private data"
            log.info("privacy: judge (%s): %s, kept from the %s engine", case, why, self.name)
            raise PrivacyBlockedError(("judge",), engine=self.name)

    def budget_left_usd(
        self, scope: str = "default", user: str | None = None, tenant: Tenant | None = None
    ) -> float | None:
        """USD left under the tightest day/month cap for `scope` (and the end user `user`'s
        and the tenant's caps; None: no cap or no ledger)."""
        if self.ledger is None:
            return None
        caps, name = self.caps_for(scope, tenant), None if tenant is None else tenant.name
        return self.ledger.remaining(caps, scope, self.name, user, name)

    def set_scoped_caps(
        self, scope: str, caps: Sequence[Cap], per_user_rpm: int | None = None
    ) -> None:
        """The caps of one scope (a policy's own `[budget]`) and its `[limits] per_user_rpm`,
        set by the client as it meets the policy. A cap the guard cannot cost (no price for the
        cloud model) is a `PolicyError` here, at the first request under it, never a cap that
        silently does not hold."""
        if per_user_rpm is None:
            self.scoped_rpm.pop(scope, None)
        else:
            self.scoped_rpm[scope] = per_user_rpm
            if self.ledger is None:
                self.ledger = SQLiteLedger()  # counted in a ledger: this process's own
        if caps and self.price is None:
            raise PolicyError(
                f"policy {scope!r} caps cloud spend, but the cloud model {self.model!r} has no "
                "price to cost its requests with: pass prices= with a TOML file that prices it "
                "(format: docs/privacy-and-budget.md), or use a policy without [budget]",
                field="budget",
            )
        if caps and self.ledger is None:
            self.ledger = SQLiteLedger()  # caps need a ledger: an in-memory one for this process
        self.scoped_caps[scope] = tuple(caps)

    def caps_for(self, scope: str, tenant: Tenant | None = None) -> tuple[Cap, ...]:
        """The client's caps plus the scope's own, plus the tenant's (`tenant_caps`)."""
        return self.caps + self.scoped_caps.get(scope, ()) + tenant_caps(tenant)

    def fits(
        self,
        scope: str,
        prompt_tokens: int,
        max_tokens: int,
        user: str | None = None,
        tenant: Tenant | None = None,
    ) -> tuple[bool, str]:
        """Would a request of this size (`prompt_tokens`: its `prompt_token_bound`) fit every
        cap of `scope` (and of `user` and `tenant`) now, worst case? With the reason when not.
        The same check as the reservation's (`Ledger.check`), so the two agree; the reservation
        stays the authority."""
        refusal = self.refusal(scope, prompt_tokens, max_tokens, user, tenant)
        if refusal is None:
            return True, ""
        if isinstance(refusal, LedgerUnavailableError):
            return False, f"the ledger {refusal.ledger} cannot be reached ({refusal.cause})"
        if isinstance(refusal, RateLimitedError):
            return False, f"{refusal.cap}: reached, for {refusal.retry_after_s:.1f} s more"
        return False, (
            f"{refusal.cap} cap {usd(refusal.limit_usd)}: spent {usd(refusal.spent_usd)}, "
            f"in flight {usd(refusal.reserved_usd)}, this request up to {usd(refusal.needed_usd)}"
        )

    def refusal(
        self,
        scope: str,
        prompt_tokens: int,
        max_tokens: int,
        user: str | None = None,
        tenant: Tenant | None = None,
    ) -> BudgetExceededError | None:
        """The error a reservation of this size would raise now (None: it fits, or no ledger)."""
        if self.ledger is None:
            return None
        limited = self._rate_refusal(scope, user, tenant, count=False)
        if limited is not None or self.price is None:
            return limited
        return self.ledger.check(
            price=self.price,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            scope=scope,
            caps=self.caps_for(scope, tenant),
            engine=self.name,
            user=user,
            tenant=None if tenant is None else tenant.name,
        )

    def _rate_refusal(
        self, scope: str, user: str | None, tenant: Tenant | None, *, count: bool
    ) -> BudgetExceededError | None:
        """The refusal of the scope's `per_user_rpm` for `user` (None: under it, counted when
        `count`; or no limit, no user); an unreachable ledger refuses (fails closed)."""
        rpm, ledger = self.scoped_rpm.get(scope), self.ledger
        if rpm is None or user is None or ledger is None:
            return None
        if self._rates is None or self._rates[0] is not ledger:
            self._rates = (ledger, rate_counter(ledger))
        tag = user_tag(user, None if tenant is None else tenant.name)
        try:
            wait = self._rates[1].hit(f"u:{tag}", rpm, count=count)
        except LedgerUnavailableError as exc:
            return exc
        return None if wait is None else RateLimitedError(rpm, wait, engine=self.name)

    async def _reserve(
        self, request: GenerationRequest, context: RequestContext
    ) -> Reservation | None:
        """The request's reservation, and one count of its user's requests this minute (the
        reservation released where the count is refused: `RateLimitedError`)."""
        prompt, out = request_token_bound(request), request_output_bound(request)
        reservation = await self._reserve_tokens(prompt, out, context)
        if context.scope not in self.scoped_rpm or context.user is None:
            return reservation  # no rate to count: no thread hop on the way to the cloud
        limited = await anyio.to_thread.run_sync(
            partial(self._rate_refusal, context.scope, context.user, context.tenant, count=True)
        )
        if limited is not None:
            if reservation is not None and self.ledger is not None:
                await anyio.to_thread.run_sync(self.ledger.release, reservation)
            log.info("%s", limited)
            raise limited
        return reservation

    async def _reserve_tokens(
        self, prompt: int, max_tokens: int, context: RequestContext
    ) -> Reservation | None:
        if self.ledger is None or self.price is None:
            return None
        ledger, price, scope, tenant = self.ledger, self.price, context.scope, context.tenant

        def reserve() -> Reservation:
            return ledger.reserve(
                model=self.model,
                price=price,
                prompt_tokens=prompt,
                max_tokens=max_tokens,
                scope=scope,
                caps=self.caps_for(scope, tenant),
                engine=self.name,
                user=context.user,
                tenant=None if tenant is None else tenant.name,
            )

        return await anyio.to_thread.run_sync(reserve)

    async def guarded_call(
        self,
        texts: Iterable[tuple[str, str]],
        prompt_tokens: int,
        max_tokens: int,
        call: Callable[[], Awaitable[tuple[T, TokenUsage | None]]],
        context: RequestContext | None = None,
    ) -> T:
        """A cloud call that is not a chat stream (a speculative plan's verification round):
        the same privacy scan of every outgoing text, a reservation of `prompt_tokens` (an
        upper bound of what it sends) and `max_tokens` (an upper bound of the output it can be
        billed: with Predicted Outputs, the prediction's tokens too), and a settlement of the
        usage `call` returns (None: the bounds, estimated; above them: an overrun). An error
        status before content releases it."""
        context = context or RequestContext()
        mode = context.privacy or self.privacy
        if mode == "keep-local":
            found = self.scanner.scan((), extra=texts, deep=context.ner)
            if found:
                log.info("privacy: %s found, kept from the %s engine", kinds(found), self.name)
                raise PrivacyBlockedError(kinds(found), engine=self.name)
        with anyio.CancelScope(shield=True):
            reservation = await self._reserve_tokens(prompt_tokens, max_tokens, context)
        usage: TokenUsage | None = None
        sent = billed = False
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            sent = billed = True
            result, usage = await call()
            return result
        except CloudStatusError as exc:
            billed = exc.received_content
            raise
        finally:
            if reservation is not None:
                with anyio.CancelScope(shield=True):
                    settled = await self._settle_call(
                        reservation, sent and billed, usage, prompt_tokens, max_tokens
                    )
                if settled is not None and context.on_settle is not None:
                    context.on_settle(*settled)

    async def _settle_call(
        self,
        reservation: Reservation,
        billed: bool,
        usage: TokenUsage | None,
        prompt_tokens: int,
        max_tokens: int,
    ) -> tuple[TokenUsage, float, float] | None:
        """Settle (or release) `reservation`: the usage, its cost and the overrun (USD)."""
        ledger = self.ledger
        assert ledger is not None
        if not billed:
            await anyio.to_thread.run_sync(ledger.release, reservation)
            return None
        usage = usage or TokenUsage(prompt_tokens, max_tokens, estimated=True)
        cost = await anyio.to_thread.run_sync(ledger.settle, reservation, usage)
        return usage, cost, max(0.0, cost - reservation.amount_usd)

    async def stream(
        self, request: GenerationRequest, context: RequestContext | None = None
    ) -> AsyncGenerator[Chunk, None]:
        """The guarded stream; `context` None: the default scope and the guard's privacy mode."""
        context = context or RequestContext()
        deep = self.scanner.deep and context.ner
        limit = 0 if deep else _SCAN_IN_THREAD_CHARS
        if sum(len(text) for _, text in request_texts(request)) > limit:
            found = await anyio.to_thread.run_sync(self.check, request, context)  # loop free
        else:
            found = self.check(request, context)
        await self.judged(request, context, found)
        reservation: Reservation | None = None
        sent = False
        deltas = 0
        finish: Finish | None = None
        billed = True
        try:
            # shielded: a cancel while the ledger works must not lose a reservation it made
            # (the finally releases it: nothing was sent)
            with anyio.CancelScope(shield=True):
                reservation = await self._reserve(request, context)
            await anyio.lowlevel.checkpoint_if_cancelled()
            async with aclosing(self.inner.stream(request)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, RequestSent):
                        sent = True
                    elif isinstance(chunk, Delta) and chunk.text:
                        sent = True  # text came back: it was sent, whatever the engine marked
                        deltas += 1
                        if reservation is not None and deltas > reservation.max_tokens:
                            break  # past the bound it was reserved for: cut here
                    elif isinstance(chunk, Called):  # a whole call: its tokens, estimated
                        sent = True
                        deltas += estimate_text_tokens(chunk.name + chunk.arguments)
                    elif isinstance(chunk, Finish):
                        sent = True
                        finish = chunk
                    yield chunk
            if reservation is not None and deltas > reservation.max_tokens:
                yield Finish("length", None, None, clock.now(), usage_estimated=True)
        except CloudStatusError as exc:
            billed = exc.received_content  # an error status before any content is not billed
            raise
        finally:
            if reservation is not None:
                with anyio.CancelScope(shield=True):
                    settled = await self._close(reservation, sent and billed, finish, deltas)
                if settled is not None and context.on_settle is not None:
                    context.on_settle(*settled)

    async def _close(
        self,
        reservation: Reservation,
        billed: bool,
        finish: Finish | None,
        deltas: int,
    ) -> tuple[TokenUsage, float, float] | None:
        """Settle (billed) or release the reservation; the usage, cost and overrun settled, if
        any. Without reported usage: the prompt bound and every delta received, even past the
        bound (what was cut still shows as an overrun)."""
        usage: TokenUsage | None = None
        if (
            billed
            and finish is not None
            and not finish.usage_estimated
            and finish.prompt_tokens is not None
            and finish.completion_tokens is not None
        ):
            usage = TokenUsage(finish.prompt_tokens, finish.completion_tokens)
        # no usage reported: the prompt bound and the deltas counted (one token each)
        return await self._settle_call(
            reservation, billed, usage, reservation.prompt_tokens, deltas
        )


class BoundGuard:
    """A `GuardedEngine` bound to one request's `RequestContext`: what that request's plan gets
    as its cloud engine. It owns nothing (closing it closes nothing; the client closes the
    guard)."""

    def __init__(self, guard: GuardedEngine, context: RequestContext) -> None:
        self.guard = guard
        self.context = context
        self.name: EngineName = guard.name

    async def start(self) -> None:
        await self.guard.start()

    def info(self) -> EngineInfo:
        return self.guard.info()

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return self.guard.predict_ttft_s(request)

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return self.guard.count_tokens(messages)

    def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        return self.guard.stream(request, self.context)

    async def guarded_call(
        self,
        texts: Iterable[tuple[str, str]],
        prompt_tokens: int,
        max_tokens: int,
        call: Callable[[], Awaitable[tuple[T, TokenUsage | None]]],
    ) -> T:
        """`GuardedEngine.guarded_call` under this request's context."""
        return await self.guard.guarded_call(texts, prompt_tokens, max_tokens, call, self.context)

    def wrapped(self) -> Engine:
        return self.guard.wrapped()

    def verification_endpoint(self) -> Endpoint | None:
        return self.guard.verification_endpoint()

    async def verification_post(
        self, path: str, body: Mapping[str, Any], outgoing: Outgoing | None = None
    ) -> dict[str, Any]:
        """`GuardedEngine.verification_post` under this request's context."""
        return await self.guard.verification_post(path, body, outgoing, self.context)

    async def aclose(self) -> None:
        pass


def _preload_quietly(scanner: PrivacyScanner) -> None:
    """Load the NER pipelines (seconds of Python, holding the GIL) at the lowest CPU priority
    where a thread can have its own (Linux): on two cores, loading beside a local answer had
    slowed its decode steps from 27 ms to 330-435 ms; at nice 19 they kept their pace
    (benchmarks/bench_open.py). Where nothing else runs, the load takes as long as before."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    scanner.warm()
