"""The engine seam does not leak: a wire-only request with typed per-engine options, capability
flags that the decision reads, the guard's context beside the request, and one cap check."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

from hybridllm import (
    Cap,
    ConfigError,
    Fallback,
    GuardedEngine,
    HybridClient,
    LlamaOptions,
    ModelPrice,
    OpenAIOptions,
    Policy,
    Prices,
    SQLiteLedger,
    Token,
)
from hybridllm.engines.base import EngineInfo, GenerationRequest
from hybridllm.errors import AllEnginesFailedError, BudgetExceededError, CloudConnectionError
from hybridllm.events import Chunk, Delta, Finish, Mark
from hybridllm.guard.guarded import RequestContext, request_token_bound, usd
from hybridllm.routing import LiveState, RequestFacts, decide
from hybridllm.testing import ScriptedEngine

PRICE = ModelPrice(input_per_million=1.0, output_per_million=2.0)
PRICES = Prices(models={"scripted": PRICE})
MSGS = [{"role": "user", "content": "hi"}]

# ---- typed options --------------------------------------------------------------------------


def test_options_are_typed_and_checked() -> None:
    req = GenerationRequest(MSGS, options=[LlamaOptions(draft="off"), OpenAIOptions(user="u1")])
    assert isinstance(req.options, tuple)
    assert req.option(LlamaOptions) == LlamaOptions(draft="off")
    assert GenerationRequest(MSGS).option(OpenAIOptions) is None
    with pytest.raises(ConfigError, match="typed engine options"):
        GenerationRequest(MSGS, options=({"draft": "prompt-lookup"},))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sequence"):
        GenerationRequest(MSGS, options=LlamaOptions())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="two LlamaOptions"):
        GenerationRequest(MSGS, options=(LlamaOptions(), LlamaOptions(draft="off")))
    with pytest.raises(ConfigError, match="draft must be None or one of"):
        LlamaOptions(draft="medusa")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="presence_penalty"):
        OpenAIOptions(presence_penalty=3.0)
    with pytest.raises(ConfigError, match="frequency_penalty"):
        OpenAIOptions(frequency_penalty=True)
    with pytest.raises(ConfigError, match="extra_body"):
        OpenAIOptions(extra_body=["top_k"])  # type: ignore[arg-type]


class _FakeStream:
    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        return self._chunks()

    async def _chunks(self) -> AsyncGenerator[Any, None]:
        delta = SimpleNamespace(content="ok")
        yield SimpleNamespace(
            usage=None, choices=[SimpleNamespace(delta=delta, finish_reason=None)]
        )
        done = SimpleNamespace(delta=None, finish_reason="stop")
        usage = SimpleNamespace(prompt_tokens=5, completion_tokens=1)
        yield SimpleNamespace(usage=usage, choices=[done])

    async def close(self) -> None:
        self.closed = True


@pytest.mark.anyio
async def test_a_local_option_never_reaches_the_cloud_sdk() -> None:
    from hybridllm import OpenAIEngine

    sent: dict[str, Any] = {}

    async def create(**kwargs: Any) -> Any:
        sent.update(kwargs)
        return SimpleNamespace(parse=_FakeStream)

    engine = OpenAIEngine(base_url="http://127.0.0.1:9", api_key="k", model="m")
    raw = SimpleNamespace(create=create)
    engine._client = SimpleNamespace(  # type: ignore[assignment]
        chat=SimpleNamespace(completions=SimpleNamespace(with_raw_response=raw))
    )
    options = (
        LlamaOptions(draft="prompt-lookup"),
        OpenAIOptions(prediction="draft text", presence_penalty=0.5, extra_body={"top_k": 4}),
    )
    req = GenerationRequest(MSGS, temperature=0.0, options=options)
    chunks = [c async for c in engine.stream(req)]
    assert "draft" not in sent and "extra" not in sent
    assert sent["prediction"] == {"type": "content", "content": "draft text"}
    assert sent["presence_penalty"] == 0.5 and sent["extra_body"] == {"top_k": 4}
    assert isinstance(chunks[-1], Finish) and chunks[-1].prompt_tokens == 5
    assert engine.count_tokens(MSGS) is None and engine.info().supports_continuation


# ---- capability flags -----------------------------------------------------------------------


def test_failover_only_between_engines_that_continue() -> None:
    pol = Policy(name="c", routing={"prefer": "cloud"})
    both = decide(RequestFacts(50, 64), pol, LiveState())
    assert both.failover and "no_failover" not in both.codes
    no_cloud = decide(RequestFacts(50, 64), pol, LiveState(continues=frozenset({"local"})))
    assert no_cloud.fallback == "local" and not no_cloud.failover
    assert "no_failover" in no_cloud.codes
    forced = decide(RequestFacts(50, 64, forced="cloud"), pol, LiveState())
    assert forced.fallback is None and not forced.failover


@pytest.mark.anyio
async def test_an_engine_that_cannot_continue_gets_no_failover() -> None:
    reset = CloudConnectionError("connection reset", received_content=True)
    cloud = ScriptedEngine("cloud", script=["Hel", reset])
    local = ScriptedEngine("local", tokens=["lo"], supports_continuation=False)
    async with HybridClient(
        local=local, cloud=cloud, policy=Policy(name="c", routing={"prefer": "cloud"})
    ) as c:
        async with c.stream("greet me") as s:
            events = []
            with pytest.raises(CloudConnectionError):
                async for e in s.events():
                    events.append(e)
    assert not local.requests and not any(isinstance(e, Fallback) for e in events)
    assert [e.text for e in events if isinstance(e, Token)] == ["Hel"]
    assert "no_failover" in s.trace.reason_codes
    assert not isinstance(s.trace.error, AllEnginesFailedError)


# ---- the guard: context beside the request, typed billing -----------------------------------


@pytest.mark.anyio
async def test_every_path_of_a_request_carries_its_scope() -> None:
    """The policy's own caps (its scope) bind the hedge and the failover too: the request
    carries no scope, the bound guard does."""
    ledger = SQLiteLedger()
    cloud = ScriptedEngine("cloud", tokens=["c"], ttft_s=0.01)
    local = ScriptedEngine("local", tokens=["l"], ttft_s=0.3)
    pol = Policy(
        name="hedgy", plans=("single", "hedge"), routing={"prefer": "local"}, hedge={"after_ms": 20}
    )
    client = HybridClient(local=local, cloud=cloud, policy=pol, ledger=ledger, prices=PRICES)
    async with client:
        res = await client.complete("q", max_tokens=4)
    assert res.text == "c" and res.trace.hedged
    assert [(e["scope"], e["state"]) for e in ledger.entries()] == [("hedgy", "settled")]
    assert not hasattr(cloud.requests[0], "scope") and not hasattr(cloud.requests[0], "privacy")


class Unmarked:
    """A cloud engine that never marks RequestSent: text or a Finish still means it was sent."""

    name = "cloud"

    def __init__(self, fail_after_text: bool) -> None:
        self.fail_after_text = fail_after_text

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def info(self) -> EngineInfo:
        return EngineInfo(name="cloud", model="scripted")

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return None

    def count_tokens(self, messages: object) -> int | None:
        return None

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        yield Mark("request_sent", time.perf_counter())  # a name string is not the typed mark
        yield Delta("a", time.perf_counter())
        if self.fail_after_text:
            raise CloudConnectionError("reset", received_content=True)
        yield Finish("stop", 7, 1, time.perf_counter())


@pytest.mark.anyio
async def test_billing_reads_typed_chunks_not_a_mark_name() -> None:
    ledger = SQLiteLedger()
    req = GenerationRequest(MSGS, max_tokens=5)
    for fail in (False, True):
        guard = GuardedEngine(Unmarked(fail), privacy="off", ledger=ledger, prices=PRICES)  # type: ignore[arg-type]
        with pytest.raises(CloudConnectionError) if fail else _nothing():
            async for _ in guard.bind(RequestContext(scope="s")).stream(req):
                pass
    rows = [(e["scope"], e["state"], e["prompt_tokens"]) for e in ledger.entries()]
    assert rows == [("s", "settled", 7), ("s", "settled", request_token_bound(req))]


class _nothing:  # noqa: N801
    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...


@pytest.mark.anyio
async def test_a_bound_guard_owns_nothing() -> None:
    inner = ScriptedEngine("cloud", tokens=["x"], token_count=9)
    guard = GuardedEngine(inner, privacy="off")
    bound = guard.bind(RequestContext(scope="p", privacy="keep-local"))
    await bound.start()
    assert inner.started and bound.name == "cloud" and bound.count_tokens(MSGS) == 9
    await bound.aclose()
    assert inner.started  # the client closes the guard, not one request's binding
    with pytest.raises(ConfigError, match="privacy"):
        RequestContext(privacy="sometimes")  # type: ignore[arg-type]


# ---- one cap check --------------------------------------------------------------------------


def test_fits_and_reserve_share_one_check() -> None:
    ledger = SQLiteLedger()
    caps = [Cap("p", "request", 0.00002), Cap(None, "day", 0.0001)]
    guard = GuardedEngine(ScriptedEngine("cloud"), ledger=ledger, prices=PRICES, caps=caps)
    # 10 + 4 * 2 = 18 micro-dollars: under both
    assert guard.fits("p", 10, 4) == (True, "")
    assert ledger.check(price=PRICE, prompt_tokens=10, max_tokens=4, scope="p", caps=caps) is None
    # 30 micro-dollars: over the per-request cap, the same answer from both, with amounts
    ok, detail = guard.fits("p", 14, 8)
    assert not ok and detail == (
        "policy 'p' per-request cap $0.0000200: spent $0, in flight $0, this request up to "
        "$0.0000300"
    )
    with pytest.raises(BudgetExceededError, match="per-request"):
        ledger.reserve(model="m", price=PRICE, prompt_tokens=14, max_tokens=8, scope="p", caps=caps)
    # the daily cap counts open reservations the same way in both
    for _ in range(5):
        ledger.reserve(model="m", price=PRICE, prompt_tokens=10, max_tokens=4, caps=caps)
    ok, detail = guard.fits("other", 10, 4)
    assert not ok and "global daily cap $0.000100: spent $0, in flight $0.0000900" in detail
    refusal = ledger.check(price=PRICE, prompt_tokens=10, max_tokens=4, caps=caps)
    assert refusal is not None and refusal.cap == "global daily"
    assert [usd(x) for x in (0, 0.5, 12.345, 0.0000312)] == ["$0", "$0.500", "$12.35", "$0.0000312"]


@pytest.mark.anyio
async def test_a_budget_refusal_at_the_seam_still_answers_locally() -> None:
    ledger = SQLiteLedger()
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    client = HybridClient(
        local=local,
        cloud=cloud,
        policy=Policy(name="p", routing={"prefer": "cloud"}),
        ledger=ledger,
        prices=PRICES,
        budget_caps=[Cap(None, "day", 1e-9)],
    )
    async with client:
        res = await client.complete("q", max_tokens=4)
    assert res.text == "l" and not cloud.requests
    assert "budget_local" in res.trace.reason_codes
