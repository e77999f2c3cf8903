"""`GuardedEngine`: privacy and budget checks wrapped around a cloud engine, at the seam.

    cloud = GuardedEngine(OpenAIEngine(...), privacy="keep-local",
                          ledger=Ledger("spend.db"), prices=prices, caps=[Cap(None, "day", 5.0)])

Like an httpx transport middleware, it sees every request the orchestrator sends to the cloud:
the first attempt, a retry, a fallback, a hedge, a mid-stream continuation (whose
`assistant_prefix` carries local text) and anything a later plan sends through `stream()`. Before
any byte leaves, it scans the whole request (every message, the assistant prefix, every string in
`extra`) and raises `PrivacyBlockedError` on a finding (mode "keep-local"); then it reserves the
worst-case cost or raises `BudgetExceededError`. Both refusals are typed and not retryable: the
orchestrator answers from the local engine instead, and the reason says privacy or budget.

The reservation is settled in a `finally`, so every way a stream ends is accounted for: from the
`Finish` chunk's reported usage; from counted deltas (and the prompt bound) when usage is missing,
the consumer left early, the request was cancelled or failed mid-answer; released when the request
was never sent (no `request_sent` mark from the engine, which marks just before sending) or the
endpoint answered with an HTTP error status (not billed). A settle without reported usage counts
the prompt at its bound: the ledger may overstate such a request, never understate it.

The wrapper exposes only the `Engine` protocol: a method it does not guard does not exist on it,
so new cloud paths must go through `stream()` (or call `check()` first), never around the guard.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread

from hybridllm.engines.base import Engine, EngineInfo, GenerationRequest, PrivacyMode
from hybridllm.engines.openai_engine import CONTINUE_INSTRUCTION
from hybridllm.errors import CloudStatusError, ConfigError, PrivacyBlockedError
from hybridllm.events import Chunk, Delta, EngineName, Finish, Mark
from hybridllm.guard.budget import Cap, Ledger, ModelPrice, Prices, Reservation, TokenUsage
from hybridllm.guard.privacy import Finding, kinds, scan

PRIVACY_MODES: tuple[PrivacyMode, ...] = ("keep-local", "off")
_SCAN_IN_THREAD_CHARS = 32_000  # longer requests are scanned on a worker thread (about 3 ms+)


def prompt_token_bound(request: GenerationRequest) -> int:
    """An upper bound on the prompt tokens the endpoint counts: byte-level BPE tokenizers make at
    most one token per UTF-8 byte; plus chat-template tokens (8 per message, 64 per request for
    a default system prompt). Pessimistic on purpose: a reservation must never be too small."""
    texts = [str(m.get("content", "")) for m in request.messages]
    n_messages = len(texts)
    if request.assistant_prefix:
        texts += [request.assistant_prefix, CONTINUE_INSTRUCTION]
        n_messages += 2
    return sum(len(t.encode("utf-8")) for t in texts) + 8 * n_messages + 64


def request_texts(request: GenerationRequest) -> Iterator[tuple[str, str]]:
    """(location, text) for every string that would leave with the request."""
    for i, message in enumerate(request.messages):
        for key, value in message.items():
            if isinstance(value, str):
                yield f"messages[{i}].{key}", value
    if request.assistant_prefix:
        yield "assistant_prefix", request.assistant_prefix
    yield from _strings("extra", request.extra)


def _strings(where: str, value: object) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(f"{where}.{k}", v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _strings(f"{where}[{i}]", v)


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
        count_prompt_tokens: Callable[[GenerationRequest], int] = prompt_token_bound,
    ) -> None:
        """`ledger`: a `Ledger` or the path of its SQLite file; `prices`: a `Prices` or the path
        of its TOML file; `caps` without a ledger get an in-memory one (this process only)."""
        if privacy not in PRIVACY_MODES:
            raise ConfigError(f"privacy must be one of {PRIVACY_MODES}, not {privacy!r}")
        if isinstance(ledger, str | Path):
            ledger = Ledger(ledger)
        if isinstance(prices, str | Path):
            prices = Prices.from_toml(prices)
        if caps and ledger is None:
            ledger = Ledger()  # caps need a ledger: an in-memory one for this process
        self.inner = inner
        self.name: EngineName = inner.name
        self.privacy: PrivacyMode = privacy
        self.ledger = ledger
        self.caps = tuple(caps)
        # caps of one scope (a policy's own budget), set by the client as it meets the policy
        self.scoped_caps: dict[str, tuple[Cap, ...]] = {}
        self.count_prompt_tokens = count_prompt_tokens
        self.model = inner.info().model
        self.price: ModelPrice | None = None
        if ledger is not None:
            if prices is None:
                raise ConfigError("a budget ledger needs prices= to cost cloud requests")
            self.price = prices.price(self.model)

    # ---- the Engine protocol ----------------------------------------------------------------

    async def start(self) -> None:
        await self.inner.start()

    def info(self) -> EngineInfo:
        return self.inner.info()

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return self.inner.predict_ttft_s(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    # ---- guards -----------------------------------------------------------------------------

    def findings(self, request: GenerationRequest) -> tuple[Finding, ...]:
        """What the detector finds in everything the request would send."""
        return scan((), extra=request_texts(request))

    def check(self, request: GenerationRequest) -> None:
        """Raise `PrivacyBlockedError` if the request may not leave the device."""
        mode = request.privacy or self.privacy
        if mode == "keep-local":
            found = self.findings(request)
            if found:
                raise PrivacyBlockedError(kinds(found), engine=self.name)

    def budget_left_usd(self, scope: str = "default") -> float | None:
        """USD left under the tightest day/month cap for `scope` (None: no cap or no ledger)."""
        if self.ledger is None:
            return None
        return self.ledger.remaining(self.caps_for(scope), scope)

    def caps_for(self, scope: str) -> tuple[Cap, ...]:
        """The client's caps plus the scope's own."""
        return self.caps + self.scoped_caps.get(scope, ())

    def fits(self, scope: str, prompt_tokens: int, max_tokens: int) -> tuple[bool, str]:
        """Would a request of this size fit every cap of `scope` now (worst case)? With the
        reason when not. (What routing asks before it picks the cloud; the reservation in
        `stream()` stays the authority.)"""
        if self.ledger is None or self.price is None:
            return True, ""
        amount = self.price.cost_usd(prompt_tokens, max_tokens)
        caps = self.caps_for(scope)
        for cap in caps:
            if cap.period == "request" and cap.applies(scope) and amount > cap.limit_usd:
                return False, f"{cap.describe()} cap {cap.limit_usd:.4f} USD < {amount:.4f} USD"
        left = self.ledger.remaining(caps, scope)
        if left is not None and amount > left:
            return False, f"{left:.4f} USD left under the caps < {amount:.4f} USD worst case"
        return True, ""

    async def _reserve(self, request: GenerationRequest) -> Reservation | None:
        if self.ledger is None or self.price is None:
            return None
        ledger, price = self.ledger, self.price
        prompt = self.count_prompt_tokens(request)

        def reserve() -> Reservation:
            return ledger.reserve(
                model=self.model,
                price=price,
                prompt_tokens=prompt,
                max_tokens=request.max_tokens,
                scope=request.scope,
                caps=self.caps_for(request.scope),
            )

        return await anyio.to_thread.run_sync(reserve)

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        if sum(len(text) for _, text in request_texts(request)) > _SCAN_IN_THREAD_CHARS:
            await anyio.to_thread.run_sync(self.check, request)  # keep the event loop free
        else:
            self.check(request)
        reservation: Reservation | None = None
        sent = False
        deltas = 0
        finish: Finish | None = None
        billed = True
        try:
            # shielded: a cancel while the ledger works must not lose a reservation it made
            # (the finally releases it: nothing was sent)
            with anyio.CancelScope(shield=True):
                reservation = await self._reserve(request)
            await anyio.lowlevel.checkpoint_if_cancelled()
            async with aclosing(self.inner.stream(request)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, Mark) and chunk.name == "request_sent":
                        sent = True
                    elif isinstance(chunk, Delta) and chunk.text:
                        deltas += 1
                    elif isinstance(chunk, Finish):
                        finish = chunk
                    yield chunk
        except CloudStatusError as exc:
            billed = exc.received_content  # an error status before any content is not billed
            raise
        finally:
            if reservation is not None:
                with anyio.CancelScope(shield=True):
                    await self._close(reservation, request, sent and billed, finish, deltas)

    async def _close(
        self,
        reservation: Reservation,
        request: GenerationRequest,
        billed: bool,
        finish: Finish | None,
        deltas: int,
    ) -> None:
        ledger = self.ledger
        assert ledger is not None
        if not billed:
            await anyio.to_thread.run_sync(ledger.release, reservation)
            return
        if (
            finish is not None
            and not finish.usage_estimated
            and finish.prompt_tokens is not None
            and finish.completion_tokens is not None
        ):
            usage = TokenUsage(finish.prompt_tokens, finish.completion_tokens)
        else:  # no usage reported: the prompt bound and the deltas counted (one token each)
            usage = TokenUsage(
                reservation.prompt_tokens, min(deltas, request.max_tokens), estimated=True
            )
        await anyio.to_thread.run_sync(ledger.settle, reservation, usage)
