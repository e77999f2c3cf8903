"""Several gateways, one budget: the Redis ledger on a real loopback redis-server (`redis_url`,
tests/conftest.py) shared by processes, its parity with the SQLite ledger, and how a URL picks
it. The two-process streams use `ScriptedEngine` doubles for the engines (orchestration only:
the subject is the shared ledger, not the models)."""

from __future__ import annotations

import multiprocessing
import sys
import uuid
from collections.abc import AsyncGenerator
from datetime import UTC, datetime

import anyio
import pytest
from hypothesis import given, settings, strategies as st

from hybridllm import Cap, GuardedEngine, HybridClient, ModelPrice, Policy, Prices
from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import (
    BudgetExceededError,
    InvalidArgumentError,
    LedgerUnavailableError,
    MissingExtraError,
)
from hybridllm.events import Chunk, Finish
from hybridllm.guard.budget import Reservation, SQLiteLedger, TokenUsage
from hybridllm.guard.budget_redis import RedisLedger
from hybridllm.guard.guarded import request_token_bound
from hybridllm.guard.ledgers import ledger_from_url
from hybridllm.testing import RedisServer, ScriptedEngine

PRICE = ModelPrice(input_per_million=1.0, output_per_million=2.0)
PRICES = Prices(models={"scripted": PRICE})
CLOUD_FIRST = Policy(name="chat", routing={"prefer": "cloud"})
PROMPT = "Summarise the news in one line."
MAX_TOKENS = 8
REQUEST = GenerationRequest(messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS)
# what the scripted cloud reports for every answer: its whole reservation (prompt bound and
# max_tokens), so the spend settled is the spend held and a cap fits a whole number of answers
USAGE = TokenUsage(request_token_bound(REQUEST), MAX_TOKENS)
WORST_USD = PRICE.cost_usd(USAGE.prompt_tokens, USAGE.completion_tokens)
STREAMS_PER_GATEWAY = 50


def fresh(redis_url: str) -> str:
    """The server's URL with a key prefix no other test uses."""
    return f"{redis_url}?prefix=test-{uuid.uuid4().hex}"


class FixedUsageCloud(ScriptedEngine):
    """A scripted cloud whose every answer reports the same usage (`USAGE`), as a provider's
    final chunk does."""

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        async for chunk in super().stream(request):
            if isinstance(chunk, Finish):
                chunk = Finish(chunk.reason, USAGE.prompt_tokens, USAGE.completion_tokens, chunk.t)
            yield chunk


async def _streams(url: str, cap_usd: float) -> dict[str, int]:
    """One gateway: a client on the shared ledger (`ledger=` the URL), 50 streams at once."""
    client = HybridClient(
        local=ScriptedEngine("local", tokens=["l"] * 3, ttft_s=0.01, tpot_s=0.005),
        cloud=FixedUsageCloud("cloud", tokens=["c"] * MAX_TOKENS, ttft_s=0.02, tpot_s=0.005),
        policy=CLOUD_FIRST,
        router=None,
        ledger=url,
        prices=PRICES,
        budget_caps=[Cap(None, "day", cap_usd)],
    )
    assert isinstance(client.cloud, GuardedEngine)
    assert isinstance(client.cloud.ledger, RedisLedger)
    counts = {"local": 0, "cloud": 0, "refused": 0, "unanswered": 0}

    async def one() -> None:
        async with client.stream(PROMPT, max_tokens=MAX_TOKENS) as s:
            text = "".join([t async for t in s])
        counts[s.trace.engine or "unanswered"] += bool(text)
        # kept from the cloud by the budget: at routing (the reason) or at the guard's seam
        reasons = [s.trace.route_reason, *s.trace.refusals]
        counts["refused"] += any("budget:" in r for r in reasons)

    async with client, anyio.create_task_group() as tg:
        for _ in range(STREAMS_PER_GATEWAY):
            tg.start_soon(one)
    return counts


def _gateway(url: str, cap_usd: float, results: multiprocessing.Queue[dict[str, int]]) -> None:
    results.put(anyio.run(_streams, url, cap_usd))


def test_two_gateway_processes_never_overspend_one_redis_budget_scripted(redis_url: str) -> None:
    """100 concurrent streams from two processes, each with its own client and its own
    RedisLedger on one server, under a cap that holds 7.5 worst cases: every stream is answered
    (by the cloud, or locally after a budget refusal), the spend settled stays under the cap and
    nothing settled above its reservation."""
    url = fresh(redis_url)
    cap = 7.5 * WORST_USD
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[dict[str, int]] = ctx.Queue()
    procs = [ctx.Process(target=_gateway, args=(url, cap, results)) for _ in range(2)]
    for p in procs:
        p.start()
    counts = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    with RedisLedger(url) as ledger:
        spend = ledger.spend("day")
        settled = [e for e in ledger.entries() if e["state"] == "settled"]
    cloud = sum(c["cloud"] for c in counts)
    print(f"cap ${cap:.6f}: settled ${spend.settled_usd:.6f} over {cloud} cloud answers; {counts}")
    assert spend.settled_usd <= cap and spend.overrun_usd == 0 and spend.reserved_usd == 0
    assert len(settled) == cloud == 7  # 7.5 answers' worth: the 8th never fits
    assert sum(c["local"] for c in counts) == sum(c["refused"] for c in counts) > 0
    assert cloud + sum(c["local"] for c in counts) == 2 * STREAMS_PER_GATEWAY
    assert spend.settled_usd == pytest.approx(cloud * WORST_USD)


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2026, 1, 31, 23, 0, tzinfo=UTC).timestamp()

    def __call__(self) -> float:
        return self.t


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["reserve", "settle", "release", "check", "wait"]),
            st.integers(0, 20),
            st.sampled_from(["chat", "batch"]),
        ),
        max_size=30,
    )
)
def test_the_redis_ledger_keeps_the_same_books_as_the_sqlite_one(
    redis_url: str, ops: list[tuple[str, int, str]]
) -> None:
    """The same operations on one clock, on both ledgers: the same entries (every column, the
    times included), the same refusals word for word, the same spend."""
    clock = Clock()
    caps = [Cap(None, "day", 0.01), Cap("chat", "month", 0.015), Cap("batch", "request", 0.004)]
    books: list[tuple[SQLiteLedger | RedisLedger, list[Reservation]]] = [
        (SQLiteLedger(clock=clock, ttl_s=1800), []),
        (RedisLedger(fresh(redis_url), clock=clock, ttl_s=1800), []),
    ]
    for op, n, scope in ops:
        seen = [_apply(ledger, open_, op, n, scope, caps, clock) for ledger, open_ in books]
        assert seen[0] == seen[1], op
        if op == "wait":
            clock.t += 600 * n
    sqlite, redis = (ledger for ledger, _ in books)
    assert sqlite.entries() == redis.entries()
    for period in ("day", "month"):
        for scope in (None, "chat", "batch"):
            assert sqlite.spend(period, scope) == redis.spend(period, scope)
    assert sqlite.remaining(caps, "chat") == redis.remaining(caps, "chat")
    redis.close()


def _apply(
    ledger: SQLiteLedger | RedisLedger,
    open_: list[Reservation],
    op: str,
    n: int,
    scope: str,
    caps: list[Cap],
    clock: Clock,
) -> object:
    """One operation; what it answered (an amount, a refusal's text, a count)."""
    if op in ("reserve", "check"):
        args = {"price": PRICE, "prompt_tokens": 300 * n, "max_tokens": 50 * n, "scope": scope}
        if op == "check":
            refusal = ledger.check(**args, caps=caps)  # type: ignore[arg-type]
            return None if refusal is None else str(refusal)
        try:
            open_.append(ledger.reserve(model="m", **args, caps=caps))  # type: ignore[arg-type]
        except BudgetExceededError as exc:
            return str(exc)
        return open_[-1].amount_usd
    if op == "settle" and open_:  # now and then above the reservation: an overrun
        return ledger.settle(open_[n % len(open_)], TokenUsage(300 * n, 70 * n))
    if op == "release" and open_:
        ledger.release(open_.pop(n % len(open_)))
    return ledger.expire() if op == "wait" else None


def test_prefixes_keep_budgets_apart_on_one_server(redis_url: str) -> None:
    a, b = RedisLedger(fresh(redis_url)), RedisLedger(fresh(redis_url))
    caps = [Cap(None, "day", 0.002)]
    a.reserve(model="m", price=PRICE, prompt_tokens=1000, max_tokens=500, caps=caps)
    with pytest.raises(BudgetExceededError):
        a.reserve(model="m", price=PRICE, prompt_tokens=1, max_tokens=1, caps=caps)
    b.reserve(model="m", price=PRICE, prompt_tokens=1000, max_tokens=500, caps=caps)  # b's own
    assert a.spend("day").reserved_usd == b.spend("day").reserved_usd == pytest.approx(0.002)
    assert [e["id"] for e in a.entries()] == [1] == [e["id"] for e in b.entries()]


def test_ledger_from_url_opens_a_redis_ledger_and_names_the_argument(redis_url: str) -> None:
    ledger = ledger_from_url(fresh(redis_url), argument="--ledger")
    assert isinstance(ledger, RedisLedger) and ledger.prefix.startswith("test-")
    with pytest.raises(InvalidArgumentError, match=r"^--ledger must be .*prefix="):
        ledger_from_url(f"{redis_url}?prefix=a{{b}}", argument="--ledger")
    host_port = redis_url.removeprefix("redis://").split("/")[0]
    with pytest.raises(InvalidArgumentError) as info:  # the server has 16 databases, not 99
        ledger_from_url(f"redis://:hunter2@{host_port}/99")
    assert info.value.argument == "ledger" and "hunter2" not in str(info.value)


def test_without_redis_py_a_redis_url_says_which_extra(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis fails
    with pytest.raises(MissingExtraError, match=r"hybridllm\[redis\]"):
        ledger_from_url(fresh(redis_url))


def test_a_lost_redis_server_fails_closed_and_the_answer_goes_local(redis_url: str) -> None:
    """The ledger's server dies after start: routing sends the request to the local engine
    with the reason, the ledger refuses reservations (as over budget), and a request already
    answered is not turned into an error by a settle that cannot be written. (Its own server,
    to stop; `redis_url` only for the skip-or-fail rule when redis-server is missing.)"""
    server = RedisServer()
    server.start()
    ledger = RedisLedger(server.url)
    caps = [Cap(None, "day", 1.0)]
    held = ledger.reserve(model="m", price=PRICE, prompt_tokens=10, max_tokens=10, caps=caps)
    client = HybridClient(
        local=ScriptedEngine("local", tokens=["l"] * 3),
        cloud=FixedUsageCloud("cloud", tokens=["c"] * 3),
        policy=CLOUD_FIRST,
        router=None,
        ledger=ledger,
        prices=PRICES,
        budget_caps=caps,
    )
    server.stop()

    async def ask() -> tuple[str, str | None, str]:
        async with client, client.stream(PROMPT, max_tokens=MAX_TOKENS) as s:
            text = "".join([t async for t in s])
        return text, s.trace.engine, s.trace.route_reason

    text, engine, reason = anyio.run(ask)
    assert (text, engine) == ("lll", "local") and "budget:" in reason
    assert f"the ledger {server.url} cannot be reached (ConnectionError" in reason
    with pytest.raises(LedgerUnavailableError) as info:
        ledger.reserve(model="m", price=PRICE, prompt_tokens=10, max_tokens=10, caps=caps)
    assert isinstance(info.value, BudgetExceededError) and info.value.ledger == server.url
    refusal = ledger.check(price=PRICE, prompt_tokens=10, max_tokens=10, caps=caps)
    assert isinstance(refusal, LedgerUnavailableError)
    assert ledger.remaining(caps) == 0.0 and ledger.remaining([]) is None
    assert ledger.settle(held, TokenUsage(10, 5)) == PRICE.cost_usd(10, 5)  # logged, not raised
    ledger.release(held)
    with pytest.raises(LedgerUnavailableError):
        ledger.spend("day")
