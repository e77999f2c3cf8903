"""The budget ledgers: cost math, caps per period and scope, UTC roll-over, expiry, and
correctness across threads and processes sharing one ledger. The behavioural tests run against
both ledgers (`make_ledger`): `SQLiteLedger`, and `RedisLedger` on a real loopback redis-server
(`redis_url`, tests/conftest.py; those cases are marked integration)."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridllm.errors import BudgetExceededError, ConfigError, InvalidArgumentError
from hybridllm.guard.budget import (
    Cap,
    Ledger,
    ModelPrice,
    Prices,
    Reservation,
    Spend,
    SQLiteLedger,
    TokenUsage,
    tenant_caps,
    user_tag,
)
from hybridllm.guard.budget_redis import RedisLedger
from hybridllm.guard.ledgers import ledger_from_url
from hybridllm.guard.prices import NANO
from hybridllm.policy import Tenant

# $1 per million input tokens, $2 per million output tokens: 1 token in = 1 micro-dollar
PRICE = ModelPrice(input_per_million=1.0, output_per_million=2.0)


class Clock:
    def __init__(self, iso: str) -> None:
        self.t = datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()

    def __call__(self) -> float:
        return self.t


class MakeLedger(Protocol):
    """A fresh, empty ledger of the kind under test; `url` the spec another process opens it
    by (`ledger_from_url`)."""

    url: str

    def __call__(
        self, *, clock: Callable[[], float] | None = None, ttl_s: float = 900.0
    ) -> Ledger: ...

    def renew(self) -> None:
        """New empty books: later calls open those (one hypothesis example each)."""
        ...


class SQLiteLedgers:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = ""
        self.made: list[Ledger] = []
        self.renew()

    def renew(self) -> None:
        self.url = str(self.tmp / f"{uuid.uuid4().hex}.db")

    def __call__(self, *, clock: Callable[[], float] | None = None, ttl_s: float = 900.0) -> Ledger:
        ledger = SQLiteLedger(self.url, ttl_s=ttl_s, **({"clock": clock} if clock else {}))
        self.made.append(ledger)
        return ledger


class RedisLedgers(SQLiteLedgers):
    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        super().__init__(Path())

    def renew(self) -> None:
        self.url = f"{self.server_url}?prefix=test-{uuid.uuid4().hex}"

    def __call__(self, *, clock: Callable[[], float] | None = None, ttl_s: float = 900.0) -> Ledger:
        ledger = RedisLedger(self.url, ttl_s=ttl_s, **({"clock": clock} if clock else {}))
        self.made.append(ledger)
        return ledger


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeLedger]:
    """Makes ledgers of one kind; each test gets its own empty books (a new file; a new key
    prefix on the session's redis-server), and every call of one test opens those books."""
    if request.param == "redis":
        ledgers: SQLiteLedgers = RedisLedgers(request.getfixturevalue("redis_url"))
    else:
        ledgers = SQLiteLedgers(tmp_path)
    yield ledgers
    for ledger in ledgers.made:
        ledger.close()


def reserve(
    ledger: Ledger,
    caps: list[Cap],
    prompt: int = 1000,
    out: int = 500,
    scope: str = "chat",
    engine: str | None = None,
    user: str | None = None,
    tenant: str | None = None,
) -> Reservation:
    return ledger.reserve(
        model="m",
        price=PRICE,
        prompt_tokens=prompt,
        max_tokens=out,
        scope=scope,
        caps=caps,
        engine=engine,
        user=user,
        tenant=tenant,
    )


def test_cost_is_exact_and_rounded_up() -> None:
    p = ModelPrice(input_per_million=0.15, output_per_million=0.6)
    assert p.cost_usd(1_000_000, 0) == 0.15
    assert p.cost_usd(0, 1_000_000) == 0.6
    assert p.cost_nano(1, 1) == 150 + 600  # nano-dollars
    assert ModelPrice(input_per_million=0.0001, output_per_million=0).cost_nano(1, 0) == 1


def test_prices_from_toml_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "prices.toml"
    good.write_text(
        '[models."gpt-4o-mini"]\ninput_per_million = 0.15\noutput_per_million = 0.6\n'
        "[default]\ninput_per_million = 5\noutput_per_million = 15\n"
    )
    prices = Prices.from_toml(good)
    assert prices.price("gpt-4o-mini").output_per_million == 0.6
    assert prices.price("other").input_per_million == 5
    bad = tmp_path / "bad.toml"
    bad.write_text('[models."m"]\ninput_per_million = -1\noutput_per_million = 1\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: models\.m\.input_per_million"):
        Prices.from_toml(bad)
    with pytest.raises(ConfigError, match="not found"):
        Prices.from_toml(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="priced models: gpt-4o-mini"):
        Prices(models={"gpt-4o-mini": PRICE}).price("gpt-5")
    with pytest.raises(ConfigError, match="period"):
        Cap(None, "week", 1.0)  # type: ignore[arg-type]


def test_reserve_settle_release_math(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    r = reserve(ledger, [])
    assert r.amount_usd == pytest.approx(1000e-6 + 1000e-6)  # 1000 in + 500 out at $2/M
    assert ledger.spend("day").reserved_usd == pytest.approx(0.002)
    assert ledger.settle(r, TokenUsage(800, 100)) == pytest.approx(800e-6 + 200e-6)
    assert ledger.spend("day").settled_usd == pytest.approx(0.001)
    assert ledger.spend("day").reserved_usd == 0
    assert ledger.settle(r, TokenUsage(5, 5)) == pytest.approx(0.001)  # a second settle: no-op
    r2 = reserve(ledger, [])
    ledger.release(r2)
    assert ledger.spend("day").settled_usd == pytest.approx(0.001)
    assert ledger.spend("month").reserved_usd == 0
    assert [e["state"] for e in ledger.entries()] == ["settled", "released"]


def test_caps_per_period_and_scope_name_the_cap(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    caps = [Cap(None, "day", 0.005), Cap("chat", "day", 0.003), Cap("chat", "request", 0.0025)]
    reserve(ledger, caps)  # chat: 0.002 held
    with pytest.raises(BudgetExceededError) as info:
        reserve(ledger, caps)  # chat would hold 0.004 > 0.003
    err = info.value
    assert not err.retryable and err.cap == "policy 'chat' daily" and err.limit_usd == 0.003
    assert err.reserved_usd == pytest.approx(0.002) and err.needed_usd == pytest.approx(0.002)
    assert str(err).startswith("budget: policy 'chat' daily cap of $0.003000")
    reserve(ledger, caps, scope="batch")  # another scope: only the global cap applies
    with pytest.raises(BudgetExceededError, match="global daily"):
        reserve(ledger, caps, scope="batch")  # global would hold 0.006 > 0.005
    with pytest.raises(BudgetExceededError, match="per-request cap of \\$0.002500"):
        reserve(ledger, caps, prompt=3000)
    assert ledger.remaining(caps, "chat") == pytest.approx(0.001)
    assert ledger.remaining(caps, "batch") == pytest.approx(0.001)


def test_caps_per_engine_hold_that_clouds_requests_and_the_ledger_keeps_its_spend(
    make_ledger: MakeLedger,
) -> None:
    ledger = make_ledger()
    caps = [Cap(None, "day", 0.005), Cap(None, "day", 0.003, engine="smart")]
    r = reserve(ledger, caps, engine="smart")  # smart: 0.002 held
    with pytest.raises(BudgetExceededError) as info:
        reserve(ledger, caps, engine="smart")  # smart would hold 0.004 > 0.003
    assert info.value.cap == "engine 'smart' daily" and info.value.limit_usd == 0.003
    assert ledger.check(price=PRICE, prompt_tokens=1000, max_tokens=500, caps=caps, engine="smart")
    reserve(ledger, caps, engine="fast")  # another cloud: only the global cap holds it
    with pytest.raises(BudgetExceededError, match="global daily"):
        reserve(ledger, caps, engine="fast")  # global would hold 0.006 > 0.005
    ledger.settle(r, TokenUsage(800, 100))
    assert ledger.spend("day", engine="smart") == Spend(0.001, 0.0)
    assert ledger.spend("day", engine="fast") == Spend(0.0, 0.002)
    assert ledger.spend("day") == Spend(0.001, 0.002)
    assert ledger.remaining(caps, "chat", "smart") == pytest.approx(0.002)
    assert ledger.remaining(caps, "chat", "fast") == pytest.approx(0.002)  # the global's room
    assert [e["engine"] for e in ledger.entries()] == ["smart", "fast"]


def test_a_cap_is_per_policy_or_per_engine_not_both() -> None:
    with pytest.raises(ConfigError):
        Cap("chat", "day", 1.0, engine="smart")
    with pytest.raises(ConfigError):  # a user's cap is a stock: per day or month
        Cap(None, "request", 1.0, per_user=True)
    with pytest.raises(ConfigError):
        Cap(None, "day", 1.0, engine="smart", per_user=True)


def test_per_user_caps_hold_each_user_over_every_policy_and_keep_ids_hashed(
    make_ledger: MakeLedger,
) -> None:
    ledger = make_ledger()
    caps = [Cap(None, "day", 0.012), Cap("chat", "day", 0.003, per_user=True)]
    first = reserve(ledger, caps, user="alice@example.com")  # alice: 0.002 held
    with pytest.raises(BudgetExceededError) as info:
        reserve(ledger, caps, user="alice@example.com")  # alice would hold 0.004 > 0.003
    err = info.value
    assert err.per_user and err.limit_usd == 0.003 and err.reserved_usd == pytest.approx(0.002)
    assert err.tenant is None
    reserve(ledger, caps, user="bob")  # another user: books of his own
    reserve(ledger, caps, scope="batch", user="alice@example.com")  # the chat cap: not here
    reserve(ledger, caps)  # no user: no user's cap
    # alice's spend counts over every policy: 0.004 now, past the chat cap's 0.003
    assert ledger.spend("day", user="alice@example.com") == Spend(0.0, 0.004)
    assert ledger.remaining(caps, "chat", user="alice@example.com") == 0.0
    assert ledger.remaining(caps, "chat", user="bob") == pytest.approx(0.001)
    alice_next = ledger.check(
        price=PRICE,
        prompt_tokens=1000,
        max_tokens=500,
        scope="chat",
        caps=caps,
        user="alice@example.com",
    )
    assert alice_next is not None and alice_next.per_user
    ledger.settle(first, TokenUsage(800, 100))  # 0.001 billed: alice's totals move too
    assert ledger.spend("day", user="alice@example.com") == Spend(0.001, 0.002)
    assert ledger.spend("day") == Spend(0.001, 0.006)
    tags = {str(e["user"]) for e in ledger.entries()}
    assert len(tags) == 3 and "" in tags  # alice, bob, and no user
    assert not any("alice" in t or "bob" in t for t in tags)  # hashed where stored
    assert user_tag("alice@example.com") in tags


def test_a_tenants_caps_hold_its_requests_and_its_users_are_its_own(
    make_ledger: MakeLedger,
) -> None:
    ledger = make_ledger()
    team_a = tenant_caps(Tenant("team-a", day_usd=0.005))
    caps = [Cap(None, "day", 0.05), Cap(None, "day", 0.003, per_user=True), *team_a]
    assert team_a == (Cap(None, "day", 0.005, tenant="team-a"),)
    reserve(ledger, caps, user="u1", tenant="team-a")  # 0.002 for team-a's u1
    reserve(ledger, caps, user="u1", tenant="team-b")  # team-b's u1: another user
    with pytest.raises(BudgetExceededError) as info:  # team-a's u1 would hold 0.004 > 0.003
        reserve(ledger, caps, user="u1", tenant="team-a")
    assert info.value.per_user and info.value.tenant is None
    reserve(ledger, caps, user="u2", tenant="team-a")  # team-a: 0.004 held
    with pytest.raises(BudgetExceededError) as info:  # team-a would hold 0.006 > 0.005
        reserve(ledger, caps, user="u3", tenant="team-a")
    assert info.value.tenant == "team-a" and not info.value.per_user
    assert info.value.limit_usd == 0.005 and info.value.reserved_usd == pytest.approx(0.004)
    reserve(ledger, caps, user="u3", tenant="team-b")  # team-b has no cap of its own here
    assert ledger.spend("day", tenant="team-a") == Spend(0.0, 0.004)
    assert ledger.spend("day", tenant="team-b") == Spend(0.0, 0.004)
    assert ledger.spend("day", user="u1", tenant="team-a") == Spend(0.0, 0.002)
    assert ledger.spend("day", user="u1") == Spend(0.0, 0.0)  # no tenant: a third u1
    assert ledger.remaining(caps, "chat", user="u9", tenant="team-a") == pytest.approx(0.001)
    assert {e["tenant"] for e in ledger.entries()} == {"team-a", "team-b"}


def test_a_tenant_cap_is_over_all_its_requests() -> None:
    with pytest.raises(ConfigError):
        Cap("chat", "day", 1.0, tenant="t")
    with pytest.raises(ConfigError):
        Cap(None, "day", 1.0, engine="smart", tenant="t")
    with pytest.raises(ConfigError):
        Cap(None, "day", 1.0, per_user=True, tenant="t")
    for name in ("", "a b", "x" * 65, "-lead"):
        with pytest.raises(InvalidArgumentError):
            Tenant(name)
    with pytest.raises(InvalidArgumentError):
        Tenant("t", day_usd=-1.0)


def test_utc_day_and_month_roll_over(make_ledger: MakeLedger) -> None:
    clock = Clock("2026-01-31T23:59:00")
    ledger = make_ledger(clock=clock)
    caps = [Cap(None, "day", 0.003), Cap(None, "month", 0.005)]
    ledger.settle(reserve(ledger, caps), TokenUsage(1000, 500))  # 0.002 on Jan 31
    with pytest.raises(BudgetExceededError, match="daily"):
        reserve(ledger, caps)
    clock.t += 120  # 00:01 UTC, Feb 1: a new day and a new month
    r = reserve(ledger, caps)
    assert r.day == "2026-02-01" and r.month == "2026-02"
    ledger.settle(r, TokenUsage(1000, 500))
    clock.t += 86400  # Feb 2: new day, same month (0.002 spent of 0.005)
    ledger.settle(reserve(ledger, caps), TokenUsage(1000, 500))
    clock.t += 86400  # Feb 3: the day is fresh, the month (0.004 of 0.005) is not
    with pytest.raises(BudgetExceededError, match="global monthly"):
        reserve(ledger, caps)
    assert ledger.spend("month", at=Clock("2026-01-15T00:00:00").t).settled_usd == 0.002


def test_stale_reservations_expire_at_their_worst_case(make_ledger: MakeLedger) -> None:
    clock = Clock("2026-06-01T12:00:00")
    ledger = make_ledger(clock=clock, ttl_s=60)
    caps = [Cap(None, "day", 0.004)]
    crashed = reserve(ledger, caps)  # its process dies: never settled
    late = reserve(ledger, caps)
    with pytest.raises(BudgetExceededError):
        reserve(ledger, caps)
    clock.t += 61
    assert ledger.expire() == 2
    spend = ledger.spend("day")
    assert spend.reserved_usd == 0 and spend.settled_usd == pytest.approx(0.004)
    # the slow one reports after all: its real cost replaces the worst case
    assert ledger.settle(late, TokenUsage(100, 0)) == pytest.approx(0.0001)
    ledger.release(crashed)  # it was never sent after all
    assert ledger.spend("day").settled_usd == pytest.approx(0.0001)
    reserve(ledger, caps)


def test_the_books_outlive_the_ledger_object(make_ledger: MakeLedger) -> None:
    a = make_ledger()
    a.settle(reserve(a, []), TokenUsage(1000, 0))
    open_ = reserve(a, [])
    a.close()
    b = make_ledger()  # another object (another process) on the same file or server and prefix
    assert b.spend("day").settled_usd == pytest.approx(0.001)
    assert b.spend("day").reserved_usd == pytest.approx(0.002)
    b.settle(open_, TokenUsage(1000, 0))  # a reservation made through one, settled by another
    assert [e["state"] for e in b.entries()] == ["settled", "settled"]


def test_a_file_ledger_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with SQLiteLedger(path) as a:
        a.settle(reserve(a, []), TokenUsage(1000, 0))
    with SQLiteLedger(path) as b:
        mode = b._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


CAP_USD = 0.05  # 25 requests of 0.002 each
N_WORKERS, TRIES = 4, 20


def _hammer(url: str, results: multiprocessing.Queue[int]) -> None:
    """A worker process: reserve and settle at the full worst case as long as the cap allows."""
    ledger = ledger_from_url(url)
    ok = 0
    for _ in range(TRIES):
        try:
            r = reserve(ledger, [Cap(None, "day", CAP_USD)])
        except BudgetExceededError:
            continue
        ledger.settle(r, TokenUsage(1000, 500))
        ok += 1
    ledger.close()
    results.put(ok)


def test_processes_sharing_the_ledger_never_overspend(make_ledger: MakeLedger) -> None:
    make_ledger().close()  # created (and migrated) once; the workers race on reserve only
    path = make_ledger.url
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(path, results)) for _ in range(N_WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    succeeded = sum(results.get(timeout=5) for _ in procs)
    ledger = make_ledger()
    spent = ledger.spend("day").settled_usd
    states = [e["state"] for e in ledger.entries()]
    assert succeeded == 25 == states.count("settled") == len(states)
    assert spent == pytest.approx(CAP_USD) and spent <= CAP_USD


def test_threads_sharing_one_ledger_never_overspend(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    ok: list[int] = []

    def work() -> None:
        for _ in range(10):
            try:
                r = reserve(ledger, [Cap(None, "day", CAP_USD)])
            except BudgetExceededError:
                continue
            ledger.settle(r, TokenUsage(1000, 500))
            ok.append(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 25
    assert ledger.spend("day").settled_usd <= CAP_USD


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["reserve", "settle", "release", "wait"]),
            st.integers(0, 20),
            st.sampled_from(["chat", "batch"]),
            st.sampled_from([None, "fast", "smart"]),
            st.sampled_from([None, "alice", "bob"]),
            st.sampled_from([None, "team-a", "team-b"]),
        ),
        max_size=40,
    )
)
def test_running_totals_always_match_the_entries(
    make_ledger: MakeLedger, ops: list[tuple[str, int, str, str | None, str | None, str | None]]
) -> None:
    """Any sequence of reserve / settle / release / clock moves (expiry, day and month roll):
    the running totals a reservation reads (`spend`) equal sums recomputed from the entries.
    (The fixture is function-scoped, but each example renews the books it opens.)"""
    make_ledger.renew()
    clock = Clock("2026-01-31T23:00:00")
    ledger = make_ledger(clock=clock, ttl_s=1800)
    open_: list[Reservation] = []
    caps = [
        Cap(None, "day", 0.01),
        Cap(None, "day", 0.006, engine="smart"),
        Cap(None, "month", 0.004, per_user=True),
        Cap(None, "day", 0.005, tenant="team-a"),
    ]
    for op, n, scope, engine, user, tenant in ops:
        if op == "reserve":
            try:
                who = {"engine": engine, "user": user, "tenant": tenant}
                r = reserve(ledger, caps, prompt=100 * n, scope=scope, **who)
                open_.append(r)
            except BudgetExceededError:
                pass
        elif op == "settle" and open_:
            ledger.settle(open_[n % len(open_)], TokenUsage(10 * n, n))
        elif op == "release" and open_:
            ledger.release(open_.pop(n % len(open_)))
        elif op == "wait":
            clock.t += 600 * n
            ledger.expire()
    ledger.expire()
    entries = ledger.entries()
    whos: list[tuple[str | None, ...]] = [(None, None, None, None), ("chat", None, None, None)]
    whos += [(None, "smart", None, None), (None, "fast", None, None)]
    whos += [
        (None, None, "alice", None),
        (None, None, "bob", "team-a"),
        (None, None, None, "team-b"),
    ]
    for period in ("day", "month"):
        for scope, engine, user, tenant in whos:
            for key in {str(e[period]) for e in entries}:
                mine = [
                    e
                    for e in entries
                    if e[period] == key
                    and scope in (None, e["scope"])
                    and engine in (None, e["engine"])
                    and (user is None or e["user"] == user_tag(user, tenant))
                    and (user is not None or tenant in (None, e["tenant"]))
                ]
                spent = sum(int(e["cost_nano"]) for e in mine if e["state"] in SPENT)
                held = sum(int(e["reserved_nano"]) for e in mine if e["state"] == "reserved")
                over = sum(int(e["overrun_nano"]) for e in mine)
                at = _inside(key)
                total = ledger.spend(period, scope, at, engine=engine, user=user, tenant=tenant)
                want = Spend(spent / NANO, held / NANO, over / NANO)
                assert total == want, (period, scope, engine, user, tenant, key)


SPENT = ("settled", "expired")


def _inside(key: str) -> float:
    """A time inside the UTC day ("2026-01-31") or month ("2026-02") `key`."""
    day = key if len(key) == 10 else f"{key}-15"
    return datetime.fromisoformat(f"{day}T12:00:00").replace(tzinfo=UTC).timestamp()


def test_budget_refusal_prints_tiny_amounts_so_they_differ() -> None:
    err = BudgetExceededError(
        cap="per-request", limit_usd=2e-8, spent_usd=0.0, reserved_usd=0.0, needed_usd=3.4e-8
    )
    assert "cap of $0.0000000200" in str(err) and "needs up to $0.0000000340" in str(err)


def test_a_settle_above_the_reservation_is_recorded_and_closes_its_caps(
    make_ledger: MakeLedger,
) -> None:
    """The reservation is the request's bound. A provider that bills past it: the ledger records
    what was billed, with the overrun, and the caps that applied to that request refuse from
    then on (until their period ends), so the ledger cannot run further past them."""
    clock = Clock("2026-03-10T12:00:00")
    ledger = make_ledger(clock=clock)
    day_cap, other = Cap(None, "day", 1.0), Cap("other", "month", 1.0)
    r = reserve(ledger, [day_cap], prompt=1000, out=500)  # $0.002 held
    assert ledger.settle(r, TokenUsage(1000, 9500)) == pytest.approx(0.02)  # billed $0.020
    spend = ledger.spend("day")
    assert spend.settled_usd == pytest.approx(0.02) and spend.overrun_usd == pytest.approx(0.018)
    assert ledger.entries()[0]["overrun_nano"] == 18_000_000
    with pytest.raises(BudgetExceededError, match="closed for this UTC day") as info:
        reserve(ledger, [day_cap], prompt=1, out=1)  # far under $1 left, still refused
    assert info.value.spent_usd == pytest.approx(0.02) and ledger.remaining([day_cap]) == 0
    assert ledger.check(price=PRICE, prompt_tokens=1, max_tokens=1, caps=[day_cap]) is not None
    with pytest.raises(BudgetExceededError):  # a per-request cap of the overrun's scope too
        reserve(ledger, [Cap("chat", "request", 1.0)], prompt=1, out=1)
    reserve(ledger, [other], prompt=1, out=1, scope="other")  # another scope's own cap holds
    clock.t += 86_400  # the next UTC day: the daily cap opens again
    reserve(ledger, [day_cap], prompt=1, out=1)


def test_a_settle_within_the_reservation_is_no_overrun(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    caps = [Cap(None, "day", 1.0)]
    ledger.settle(reserve(ledger, caps), TokenUsage(1000, 500))  # exactly the bound
    assert ledger.spend("day").overrun_usd == 0 and ledger.entries()[0]["overrun_nano"] == 0
    reserve(ledger, caps)


def test_ledger_from_url_reads_paths_and_sqlite_urls(tmp_path: Path) -> None:
    from hybridllm import HybridClient
    from hybridllm.guard.ledgers import as_ledger
    from hybridllm.testing import ScriptedEngine

    for spec in (tmp_path / "a.db", str(tmp_path / "b.db"), f"sqlite://{tmp_path}/c.db"):
        ledger = ledger_from_url(spec)
        assert isinstance(ledger, SQLiteLedger) and isinstance(ledger, Ledger)
        ledger.close()
    assert {p.name for p in tmp_path.iterdir()} >= {"a.db", "b.db", "c.db"}
    assert ledger_from_url("sqlite://:memory:").path == ":memory:"  # type: ignore[attr-defined]
    for bad in ("", "sqlite://", "postgres://db/budget", "https://:pw@example.com/x"):
        with pytest.raises(InvalidArgumentError) as info:
            ledger_from_url(bad, argument="--ledger")
        assert info.value.argument == "--ledger" and "pw" not in str(info.value)
    with pytest.raises(InvalidArgumentError, match="^ledger must be a Ledger, or a file path"):
        as_ledger(42)
    cloud = ScriptedEngine("cloud")
    client = HybridClient(cloud=cloud, ledger=f"sqlite://{tmp_path}/d.db", prices=PRICES)
    assert isinstance(client.cloud.ledger, SQLiteLedger)  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError, match="^ledger must be"):
        HybridClient(cloud=cloud, ledger="mysql://x/y", prices=PRICES)


PRICES = Prices(models={"scripted": PRICE})


def test_redis_py_loads_only_when_a_redis_ledger_is_made() -> None:
    """`hybridllm[redis]` is optional: only hybridllm/stores/redis_urls.py imports redis-py, inside
    the function that connects (for the Redis ledger and the Redis decision log), so opening
    the guard, an SQLite ledger or an SQLite decision log never loads it."""
    import ast
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    importers = set()
    for path in (root / "hybridllm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "redis" for n in names):
                importers.add(path.relative_to(root).as_posix())
    assert importers == {"hybridllm/stores/redis_urls.py"}
    probe = (
        "import sys, tempfile, hybridllm.guard.ledgers as g, hybridllm.routing.logs as d; "
        "g.ledger_from_url(':memory:'); d.decision_log_from_url(tempfile.mktemp()).close(); "
        "print('redis' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
