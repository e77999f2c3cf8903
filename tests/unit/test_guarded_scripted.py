"""`GuardedEngine` in the orchestrator, with `ScriptedEngine` doubles (orchestration logic only;
the real server is in test_guarded_integration.py): refusals fall back to the local engine, and
every way a cloud stream ends settles or releases its reservation."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import anyio
import pytest

from hybridllm import (
    Cap,
    Fallback,
    GuardedEngine,
    HybridClient,
    ModelPrice,
    Policy,
    Prices,
    RefusedError,
    Route,
    SQLiteLedger,
    Token,
    clock,
)
from hybridllm.engines.base import EngineInfo, GenerationRequest
from hybridllm.errors import (
    AllEnginesFailedError,
    CloudConnectionError,
    LocalEngineError,
    PrivacyBlockedError,
    ServerError,
)
from hybridllm.events import Chunk, Delta, Finish, RequestSent
from hybridllm.guard.budget import Reservation
from hybridllm.guard.guarded import request_token_bound
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

PRICE = ModelPrice(input_per_million=1.0, output_per_million=2.0)
PRICES = Prices(models={"scripted": PRICE})
CLOUD_FIRST = Policy(name="chat", routing={"prefer": "cloud"})
EMAIL = "bob.jones@corp-mail.org"


def local_and_cloud(**cloud: object) -> tuple[ScriptedEngine, ScriptedEngine]:
    return (
        ScriptedEngine("local", tokens=["local", " answer"], ttft_s=0.01),
        ScriptedEngine("cloud", **cloud) if cloud else ScriptedEngine("cloud", tokens=["cloud"]),  # type: ignore[arg-type]
    )


async def test_by_default_personal_data_stays_local_and_privacy_off_lets_it_through() -> None:
    """The default `[privacy] mode` is "keep-local" with the pattern layer: an email address
    never reaches the cloud unless the policy says `mode = "off"`."""
    local, cloud = local_and_cloud()
    async with HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST) as client:
        kept = await client.complete(f"write to {EMAIL}")
        assert kept.text == "local answer" and cloud.requests == []
        assert "privacy_local" in kept.trace.reason_codes
        open_policy = CLOUD_FIRST.with_(privacy={"mode": "off"})
        text = (await client.complete(f"write to {EMAIL}", policy=open_policy)).text
    assert isinstance(client.cloud, GuardedEngine) and client.cloud.inner is cloud
    assert text == "cloud" and EMAIL in str(cloud.requests)  # privacy off: let through


async def test_privacy_refusal_sends_nothing_and_local_answers() -> None:
    local, cloud = local_and_cloud()
    client = HybridClient(local=local, cloud=cloud, policy=CLOUD_FIRST, privacy="keep-local")
    async with client:
        async with client.stream(f"Write a reply to {EMAIL}") as s:
            events = [e async for e in s.events()]
        benign = await client.complete("Write a haiku about rain.")
    assert not [r for r in cloud.requests if EMAIL in str(r)]  # nothing reached the cloud
    assert "".join(e.text for e in events if isinstance(e, Token)) == "local answer"
    tr = s.trace
    # routing saw the finding first: local from the start, the reason says privacy
    assert tr.engine == "local" and tr.started == ("local",) and tr.fallback_reason is None
    assert "privacy_local" in tr.reason_codes
    route = next(e for e in events if isinstance(e, Route))
    assert route.engine == "local" and not any(isinstance(e, Fallback) for e in events)
    assert EMAIL not in repr(tr) + repr(events) + str(tr.summary())
    assert benign.text == "cloud" and benign.trace.engine == "cloud"


async def test_a_hedge_never_carries_a_flagged_prompt() -> None:
    local = ScriptedEngine("local", tokens=["slow", " local"], ttft_s=0.15)
    cloud = ScriptedEngine("cloud", tokens=["fast cloud"], ttft_s=0.0)
    hedged = Policy(name="hedged", routing={"prefer": "local"}, hedge={"after_ms": 10})
    async with HybridClient(local=local, cloud=cloud, policy=hedged, privacy="keep-local") as c:
        private = await c.complete(f"my email is {EMAIL}")
        benign = await c.complete("what is 2 + 2?")
    assert private.text == "slow local" and not private.trace.hedged  # no cloud to hedge with
    assert "privacy_local" in private.trace.reason_codes
    assert benign.text == "fast cloud" and benign.trace.engine == "cloud"
    assert len(cloud.requests) == 1 and EMAIL not in str(cloud.requests)


async def test_a_failover_continuation_with_flagged_text_is_not_sent() -> None:
    crash = LocalEngineError("decode failed", engine="local", received_content=True)
    local = ScriptedEngine("local", script=[0.0, "Sure: write to ", 0.0, EMAIL, 0.0, crash])
    cloud = ScriptedEngine("cloud", tokens=["cloud"])
    local_first = Policy(name="local", routing={"prefer": "local"})
    async with HybridClient(
        local=local, cloud=cloud, policy=local_first, privacy="keep-local"
    ) as c:
        with pytest.raises(AllEnginesFailedError) as info:
            await c.complete("Invent a contact address for Bob.")
    assert cloud.requests == []
    assert "privacy" in str(info.value) and EMAIL not in str(info.value)


async def test_budget_refusal_goes_local_and_cloud_only_raises_it() -> None:
    local, cloud = local_and_cloud()
    caps = [Cap(None, "request", 1e-6)]  # no request fits
    kw = {"policy": CLOUD_FIRST, "prices": PRICES, "budget_caps": caps}
    async with HybridClient(local=local, cloud=cloud, **kw) as client:  # type: ignore[arg-type]
        done = await client.complete("hello")
    assert done.text == "local answer" and cloud.requests == []
    assert "budget_local" in done.trace.reason_codes
    async with HybridClient(cloud=ScriptedEngine("cloud", tokens=["x"]), **kw) as only:  # type: ignore[arg-type]
        with pytest.raises(RefusedError, match="budget: cannot cover .*global per-request"):
            await only.complete("hello")


class ReportingEngine:
    """A scripted cloud double that reports usage in its Finish (like a server with
    include_usage), or fails before sending."""

    name = "cloud"

    def __init__(self, tokens: list[str], *, prompt_tokens: int = 30, fail_unsent: bool = False):
        self.tokens = tokens
        self.prompt_tokens = prompt_tokens
        self.fail_unsent = fail_unsent

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def info(self) -> EngineInfo:
        return EngineInfo(name="cloud", model="scripted")

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return None

    def count_tokens(self, messages: object) -> int | None:
        return None

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        if self.fail_unsent:
            raise CloudConnectionError("connect refused")
        yield RequestSent(clock.now())
        for tok in self.tokens:
            await anyio.sleep(0.001)
            yield Delta(tok, clock.now())
        yield Finish("stop", self.prompt_tokens, len(self.tokens), clock.now())


async def drain(engine: GuardedEngine, request: GenerationRequest, take: int | None = None) -> None:
    n = 0
    agen = engine.stream(request)
    try:
        async for chunk in agen:
            n += isinstance(chunk, Delta)
            if take is not None and n >= take:
                break
    finally:
        await agen.aclose()


async def test_every_ending_settles_or_releases() -> None:
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=10)
    bound = request_token_bound(req)

    def guard(inner: object) -> GuardedEngine:
        return GuardedEngine(inner, privacy="off", ledger=ledger, prices=PRICES)  # type: ignore[arg-type]

    ledger = SQLiteLedger()
    await drain(guard(ReportingEngine(["a", "b", "c"])), req)  # reported usage
    await drain(guard(ReportingEngine(["a", "b", "c", "d"])), req, take=2)  # the consumer left
    with pytest.raises(CloudConnectionError):
        await drain(guard(ReportingEngine(["a"], fail_unsent=True)), req)  # never sent
    with pytest.raises(ServerError):  # an error status before any content: not billed
        await drain(guard(ScriptedEngine("cloud", script=[ServerError("x", status_code=503)])), req)
    reset = CloudConnectionError("reset", received_content=True)
    with pytest.raises(CloudConnectionError):  # failed mid-answer: billed as counted
        await drain(guard(ScriptedEngine("cloud", script=["a", "b", reset])), req)
    rows = [
        (e["state"], e["prompt_tokens"], e["completion_tokens"], e["estimated"])
        for e in ledger.entries()
    ]
    assert rows == [
        ("settled", 30, 3, 0),
        ("settled", bound, 2, 1),
        ("released", bound, None, 0),
        ("released", bound, None, 0),
        ("settled", bound, 2, 1),
    ]
    assert ledger.spend("day").reserved_usd == 0


@pytest.mark.virtual_clock  # the streams' timing is not the subject: no real sleeping
async def test_100_concurrent_streams_never_overspend_a_small_cap() -> None:
    """ScriptedEngine doubles (the real server's version is in test_guarded_integration.py):
    100 streams at once through the client, a cap that covers a few worst cases; every refused
    request is answered locally, some consumers leave early, and settled spend stays under."""
    ledger = SQLiteLedger()
    local = ScriptedEngine("local", tokens=["l"] * 3, ttft_s=0.01, tpot_s=0.005)
    cloud = ScriptedEngine("cloud", tokens=["c"] * 8, ttft_s=0.02, tpot_s=0.005)
    prompt = "Summarise the news in one line."
    req = GenerationRequest(messages=[{"role": "user", "content": prompt}], max_tokens=8)
    worst = PRICE.cost_usd(request_token_bound(req), 8)
    cap = 7.5 * worst
    client = HybridClient(
        local=local,
        cloud=cloud,
        policy=CLOUD_FIRST,
        ledger=ledger,
        prices=PRICES,
        budget_caps=[Cap(None, "day", cap)],
    )
    served: dict[str, int] = {"local": 0, "cloud": 0}
    refused = 0

    async def one(i: int) -> None:
        nonlocal refused
        async with client.stream(prompt, max_tokens=8) as s:
            async for _ in s:
                if i % 7 == 0:
                    break  # the consumer leaves early
        if i % 7:
            assert s.trace.engine is not None and s.trace.error is None
            served[s.trace.engine] += 1
        refused += any("budget:" in r for r in s.trace.refusals)

    async with client, anyio.create_task_group() as tg:
        for i in range(100):
            tg.start_soon(one, i)
    spent = ledger.spend("day")
    settled = [e for e in ledger.entries() if e["state"] == "settled"]
    print(f"cap ${cap:.6f}, settled ${spent.settled_usd:.6f} over {len(settled)} cloud requests")
    assert spent.reserved_usd == 0 and spent.settled_usd <= cap
    assert len(settled) >= 7 and refused == 100 - len(settled)  # each one cloud or refused
    assert served["local"] > 0 and sum(served.values()) == 100 - len(range(0, 100, 7))


async def test_forced_or_cloud_only_requests_get_the_typed_refusal(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text("[models.scripted]\ninput_per_million = 1\noutput_per_million = 2\n")
    local, cloud = local_and_cloud()
    client = HybridClient(
        local=local,
        cloud=cloud,
        privacy="keep-local",
        ledger=tmp_path / "spend.db",
        prices=prices,
    )
    assert isinstance(client.cloud, GuardedEngine) and client.cloud.ledger is not None
    async with client:
        with pytest.raises(PrivacyBlockedError, match="^privacy: the request contains email"):
            await client.complete(f"mail {EMAIL}", engine="cloud")  # routing refuses it
        # past routing (a path that did not ask it), the guard at the seam refuses too
        request = GenerationRequest(messages=({"role": "user", "content": f"mail {EMAIL}"},))
        with pytest.raises(PrivacyBlockedError, match="^privacy: the request contains email"):
            await drain(client.cloud, request)
        assert (await client.complete("hi", engine="cloud")).text == "cloud"
    assert [e["state"] for e in client.cloud.ledger.entries()] == ["settled"]
    assert cloud.requests and all(EMAIL not in str(r) for r in cloud.requests)


class SlowLedger(SQLiteLedger):
    """A ledger whose reserve() takes 200 ms (a busy file)."""

    def reserve(self, **kw: Any) -> Reservation:
        time.sleep(0.2)
        return super().reserve(**kw)


async def test_a_cancel_while_reserving_releases_the_reservation() -> None:
    ledger = SlowLedger()
    guard = GuardedEngine(
        ScriptedEngine("cloud", tokens=["a"]), privacy="off", ledger=ledger, prices=PRICES
    )
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=10)
    with anyio.move_on_after(0.05) as scope:
        await drain(guard, req)
    assert scope.cancelled_caught
    assert [e["state"] for e in ledger.entries()] == ["released"]


async def test_routing_refusals_raise_the_guards_types_scripted() -> None:
    """A refusal decided at routing is the guard's class (a `RefusedError`), with the reasons."""
    from hybridllm.errors import BudgetExceededError, ConfigError

    caps = [Cap(None, "request", 1e-6)]  # no request fits
    kw = {"policy": CLOUD_FIRST, "prices": PRICES, "budget_caps": caps}
    async with HybridClient(cloud=ScriptedEngine("cloud", tokens=["x"]), **kw) as only:  # type: ignore[arg-type]
        with pytest.raises(BudgetExceededError) as info:
            await only.complete("hello")
    refused = info.value
    assert type(refused) is BudgetExceededError and not isinstance(refused, ConfigError)
    assert refused.cap == "global per-request" and refused.limit_usd == 1e-6
    assert refused.needed_usd > refused.limit_usd and refused.engine == "cloud"
    assert any(r.startswith("budget: cannot cover") for r in refused.reasons)
    assert not refused.retryable and "decision: " in str(refused)
    local, cloud = local_and_cloud()
    async with HybridClient(
        local=local, cloud=cloud, policy=CLOUD_FIRST, privacy="keep-local"
    ) as client:
        with pytest.raises(PrivacyBlockedError) as blocked:
            await client.complete(f"write to {EMAIL}", engine="cloud")
    assert type(blocked.value) is PrivacyBlockedError and blocked.value.kinds == ("email",)
    assert blocked.value.reasons and EMAIL not in str(blocked.value) and cloud.requests == []


# ---- the reservation is a true bound; an overrun closes the caps -----------------------------


class OverBilling(ReportingEngine):
    """A cloud double whose reported usage is above what it was asked for (a provider that
    bills past `max_tokens`)."""

    def __init__(self, completion_tokens: int) -> None:
        super().__init__(["x"])
        self.completion_tokens = completion_tokens

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        yield RequestSent(time.perf_counter())
        yield Delta("x", time.perf_counter())
        yield Finish("stop", self.prompt_tokens, self.completion_tokens, time.perf_counter())


async def test_a_prediction_is_reserved_as_output() -> None:
    """Predicted Outputs bill rejected prediction tokens as output: the reservation holds them,
    so a cap that covers `max_tokens` alone refuses a request with a long prediction."""
    from hybridllm import OpenAIOptions
    from hybridllm.errors import BudgetExceededError

    ledger = SQLiteLedger()
    inner: Any = ReportingEngine(["a"])
    guard = GuardedEngine(inner, privacy="off", ledger=ledger, prices=PRICES)
    msgs = [{"role": "user", "content": "hi"}]
    plain = GenerationRequest(messages=msgs, max_tokens=10)
    predicted = GenerationRequest(
        messages=msgs, max_tokens=10, options=(OpenAIOptions(prediction="y" * 500),)
    )
    bound = request_token_bound(plain)
    per_request = PRICE.cost_usd(bound, 10 + 100)  # room for 100 prediction tokens, not 500
    guard.caps = (Cap(None, "request", per_request),)
    await drain(guard, plain)
    with pytest.raises(BudgetExceededError, match="per-request"):
        await drain(guard, predicted)
    guard.caps = ()
    await drain(guard, predicted)
    held = [e["reserved_nano"] for e in ledger.entries()]
    assert held == [PRICE.cost_nano(bound, 10), PRICE.cost_nano(bound, 510)]


async def test_usage_billed_above_the_reservation_is_an_overrun_that_closes_the_cap() -> None:
    caps = [Cap(None, "day", 1.0)]
    cloud = OverBilling(completion_tokens=5000)
    async with HybridClient(cloud=cloud, prices=PRICES, budget_caps=caps) as client:  # type: ignore[arg-type]
        first = await client.complete("hello", max_tokens=10)
        with pytest.raises(RefusedError, match="closed for this UTC day"):
            await client.complete("hello", max_tokens=10)  # the cap holds from now on
        assert client.cloud.ledger.spend("day").overrun_usd == first.trace.overrun_usd  # type: ignore[union-attr]
    spent = first.trace.spent[0]
    assert spent.completion_tokens == 5000 and spent.usd == PRICE.cost_usd(30, 5000)  # as billed
    assert first.trace.overrun_usd > 0 and spent.overrun_usd == first.trace.overrun_usd


async def test_a_stream_past_max_tokens_is_cut_at_the_bound_and_flagged() -> None:
    """A server that ignores `max_tokens` (and reports no usage): the guard stops the answer at
    the bound it reserved for; the delta that proved the overrun is settled, not shown."""
    cloud = ScriptedEngine("cloud", tokens=[str(i) for i in range(20)])
    caps = [Cap(None, "day", 1.0)]
    async with HybridClient(cloud=cloud, prices=PRICES, budget_caps=caps) as client:
        done = await client.complete("hello", max_tokens=5)
        with pytest.raises(RefusedError):
            await client.complete("hello", max_tokens=5)
    assert done.text == "01234" and done.trace.finish_reason == "length"
    assert done.trace.spent[0].completion_tokens == 6 and done.trace.overrun_usd > 0
    assert cloud.emitted <= 7  # stopped there, not left to stream on
