"""Cloud spend: caps, and a ledger that never lets requests overspend (prices per model are in
`hybridllm.guard.prices`, re-exported here).

    prices = Prices.from_toml("prices.toml")
    ledger = SQLiteLedger("~/.cache/hybridllm/ledger.db")   # or ledger_from_url("redis://...")
    r = ledger.reserve(model="gpt-4o-mini", price=prices.price("gpt-4o-mini"),
                       prompt_tokens=812, max_tokens=256, scope="chat",
                       caps=[Cap(None, "day", 5.0), Cap("chat", "request", 0.01)])
    ...                                   # send the request
    ledger.settle(r, TokenUsage(790, 120))  # or ledger.release(r) if it was never sent

`Ledger` is what the client asks of a ledger (a `typing.Protocol`); `SQLiteLedger` keeps it in
one SQLite file (one machine: the embedded default) and `RedisLedger`
(`hybridllm.guard.budget_redis`) on a Redis server (several gateways, processes or machines
sharing one budget); `ledger_from_url` (`hybridllm.guard.ledgers`) picks one from a URL. Both
keep the same books with the same rules, below.

A reservation holds the request's worst-case cost (prompt tokens plus `max_tokens`) against
every cap that applies until it is settled from the reported usage or released. Reserving checks
and records in one atomic step (SQLite: one `BEGIN IMMEDIATE` transaction on a file in WAL mode;
Redis: one Lua script), so processes sharing the ledger and many concurrent streams never
overspend a cap together. Amounts are stored
as integer nano-dollars (exact sums); days and months are UTC, taken at reservation time. A
reservation left open by a crashed process expires after its time to live and is then counted at
its worst case (what it may have cost) until, if ever, it is settled.

The reservation is the request's bound, and the promise is that the ledger never exceeds a cap.
A request settled above its reservation (a provider that billed past `max_tokens`, say) is an
overrun: the ledger records what was billed (the money is spent) with the overrun beside it
(`Spend.overrun_usd`, the entry's `overrun_nano`), and from then on every cap that applied to
that request refuses every reservation until its period ends (a per-request or daily cap: the
UTC day; a monthly cap: the UTC month), because the bound it relied on did not hold.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from hybridllm.errors import BudgetExceededError, ConfigError
from hybridllm.guard.prices import NANO, ModelPrice, Prices
from hybridllm.policy import Tenant
from hybridllm.sqlite_migrations import Steps, migrate

__all__ = [
    "Cap",
    "Ledger",
    "ModelPrice",
    "Period",
    "Prices",
    "Quota",
    "QuotaPeriod",
    "Reservation",
    "SQLiteLedger",
    "Spend",
    "TokenUsage",
    "tenant_caps",
    "utc_day_month",
]

Period = Literal["request", "day", "month"]

log = logging.getLogger(__name__)


# ---- caps and records --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cap:
    """At most `limit_usd` per request, per UTC day or per UTC month, for the requests of one
    scope (a policy name), for the requests one cloud serves (`engine`, its name in the client:
    `Cap(None, "day", 5.0, engine="smart")`), or, with neither, for all requests together.

    `per_user`: for each end user apart (the request's `user`): a user's spend over every
    policy is held to the limit, in the requests of the cap's scope (`Cap("chat", "day", 0.5,
    per_user=True)`: no user's day may pass $0.50 through a chat request). A request without a
    user is not held by it.

    `tenant`: for the requests billed to one tenant (a gateway key, by its name: `Cap(None,
    "day", 5.0, tenant="team-a")`), over every policy; its end users are its own (a user id
    under two tenants is two users)."""

    scope: str | None
    period: Period
    limit_usd: float
    engine: str | None = None
    per_user: bool = False
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.period not in ("request", "day", "month"):
            raise ConfigError(f"cap period must be request, day or month, not {self.period!r}")
        if not self.limit_usd >= 0:
            raise ConfigError(f"cap limit must be a non-negative amount, not {self.limit_usd!r}")
        if self.scope is not None and self.engine is not None:
            raise ConfigError("a cap is per policy (scope) or per engine, not both")
        if self.per_user and (self.engine is not None or self.period == "request"):
            raise ConfigError("a per-user cap is per day or month, and not per engine")
        if self.tenant is not None and (
            self.scope is not None or self.engine is not None or self.per_user
        ):
            raise ConfigError("a tenant's cap is over all its requests: no scope, engine or user")

    def applies(
        self,
        scope: str,
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> bool:
        """Does the cap hold a request of policy `scope` served by `engine` for `user` (a tag)
        billed to `tenant`?"""
        if self.per_user and user is None:
            return False
        if self.tenant is not None:
            return self.tenant == tenant
        if self.engine is not None:
            return self.engine == engine
        return self.scope is None or self.scope == scope

    @property
    def key(self) -> str:
        """Its running totals' key in a ledger: "*" (all), "p:<policy>", "e:<engine>",
        "k:<tenant>" (a per-user cap's is the user's: `key_for`)."""
        return totals_key(self.scope, self.engine, tenant=self.tenant)

    def key_for(self, user: str | None) -> str:
        """The totals it holds a request of `user` (a `user_tag`) to."""
        return f"u:{user}" if self.per_user and user is not None else self.key

    def describe(self) -> str:
        who = "global" if self.scope is None else f"policy {self.scope!r}"
        who = who if self.engine is None else f"engine {self.engine!r}"
        who = who if self.tenant is None else f"tenant {self.tenant!r}"
        per = {"request": "per-request", "day": "daily", "month": "monthly"}[self.period]
        return f"{who} per-user {per}" if self.per_user else f"{who} {per}"


def tenant_caps(tenant: Tenant | None) -> tuple[Cap, ...]:
    """A tenant's own caps (`Tenant.day_usd`, `month_usd`), over all its requests."""
    if tenant is None:
        return ()
    limits: tuple[tuple[Period, float | None], ...] = (
        ("day", tenant.day_usd),
        ("month", tenant.month_usd),
    )
    return tuple(Cap(None, p, usd, tenant=tenant.name) for p, usd in limits if usd is not None)


def user_tag(user: str | None, tenant: str | None = None) -> str | None:
    """How an end user's id is kept in a ledger: a hash (never the id in clear), of the user
    within its tenant (the same id under two tenants is two users)."""
    if user is None:
        return None
    within = "" if tenant is None else tenant
    return hashlib.sha256(f"hybridllm-user\0{within}\0{user}".encode()).hexdigest()[:32]


def totals_key(
    scope: str | None,
    engine: str | None = None,
    user: str | None = None,
    tenant: str | None = None,
) -> str:
    """The key of a ledger's running totals: every request's ("*"), a policy's ("p:<scope>"),
    one engine's ("e:<engine>"), one user's ("u:<user tag>") or one tenant's ("k:<tenant>")."""
    if user is not None:
        return f"u:{user}"
    if tenant is not None:
        return f"k:{tenant}"
    if engine is not None:
        return f"e:{engine}"
    return "*" if scope is None else f"p:{scope}"


def entry_keys(
    scope: str, engine: str | None, user: str | None = None, tenant: str | None = None
) -> tuple[str, ...]:
    """The totals an entry of policy `scope` on `engine` for `user` (a tag) billed to `tenant`
    counts in."""
    return (
        "*",
        f"p:{scope}",
        *(() if not engine else (f"e:{engine}",)),
        *(() if not user else (f"u:{user}",)),
        *(() if not tenant else (f"k:{tenant}",)),
    )


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int
    completion_tokens: int
    estimated: bool = False  # counted by the client, not reported by the server


@dataclass(frozen=True)
class Reservation:
    id: int
    scope: str
    model: str
    price: ModelPrice
    prompt_tokens: int
    max_tokens: int
    amount_usd: float  # the worst case held against the caps
    day: str  # UTC, "2026-11-30"
    month: str  # UTC, "2026-11"
    expires_at: float  # time.time()
    engine: str | None = None  # the cloud it was held for, by name (None: not said)
    user: str | None = None  # the end user's tag (`user_tag`; None: no user)
    tenant: str | None = None  # the tenant billed (a gateway key's name; None: none)


@dataclass(frozen=True)
class Spend:
    settled_usd: float  # settled requests, plus expired reservations at their worst case
    reserved_usd: float  # open reservations
    overrun_usd: float = 0.0  # billed above their reservations (the caps of those requests close)


@dataclass(frozen=True)
class QuotaPeriod:
    """One end user's UTC day or month: spent (settled, and expired at their worst case),
    reserved by requests in flight, the tightest per-user cap over it (None: none), what is
    left under it (None: no cap; 0 once spent or closed by an overrun)."""

    spent_usd: float
    reserved_usd: float
    limit_usd: float | None
    left_usd: float | None


@dataclass(frozen=True)
class Quota:
    """`HybridClient.quota(user)`: an end user's spend and room, this UTC day and month, under a
    policy's per-user caps (`[budget] per_user_day_usd`, `per_user_month_usd`), so an app can
    show it. `exhausted`: nothing is left under one of them (a request that needs more than
    `left_usd` is refused too: its worst case is what a cap holds)."""

    day: QuotaPeriod
    month: QuotaPeriod

    @property
    def exhausted(self) -> bool:
        return any(p.left_usd is not None and p.left_usd <= 0 for p in (self.day, self.month))


def user_quota(
    ledgers: Sequence[Ledger], caps: Iterable[Cap], user: str, tenant: str | None = None
) -> Quota:
    """`user`'s quota (within `tenant`) under the per-user caps of `caps`, summed over `ledgers`
    (each distinct ledger the clients' clouds book in)."""
    mine = [c for c in caps if c.per_user]
    return _quota(ledgers, mine, lambda ledger, p: ledger.spend(p, user=user, tenant=tenant))


def tenant_quota(ledgers: Sequence[Ledger], caps: Iterable[Cap], tenant: str) -> Quota:
    """A tenant's quota (a gateway key's: `GET /v1/usage`) under its caps in `caps`."""
    mine = [c for c in caps if c.tenant == tenant]
    return _quota(ledgers, mine, lambda ledger, p: ledger.spend(p, tenant=tenant))


def _quota(
    ledgers: Sequence[Ledger],
    caps: Sequence[Cap],
    spend_of: Callable[[Ledger, Literal["day", "month"]], Spend],
) -> Quota:
    periods: dict[str, QuotaPeriod] = {}
    for period in ("day", "month"):
        spends = [spend_of(ledger, period) for ledger in ledgers]
        spent = sum(s.settled_usd for s in spends)
        held = sum(s.reserved_usd for s in spends)
        closed = any(s.overrun_usd for s in spends)
        limits = [c.limit_usd for c in caps if c.period == period]
        limit = min(limits) if limits else None
        left = None if limit is None else (0.0 if closed else max(0.0, limit - spent - held))
        periods[period] = QuotaPeriod(spent, held, limit, left)
    return Quota(periods["day"], periods["month"])


def utc_day_month(t: float) -> tuple[str, str]:
    d = datetime.fromtimestamp(t, UTC)
    return d.strftime("%Y-%m-%d"), d.strftime("%Y-%m")


# ---- what a ledger is ----------------------------------------------------------------------


@runtime_checkable
class Ledger(Protocol):
    """What the client asks of a ledger: `reserve`, `check`, `settle`, `release` and
    `remaining` (the guard and routing), and what reports and tests read: `spend`, `expire`,
    `entries`, `close`. Implemented by `SQLiteLedger` (one machine) and `RedisLedger` (several
    gateways); both keep the rules of this module and raise the same errors."""

    def reserve(
        self,
        *,
        model: str,
        price: ModelPrice,
        prompt_tokens: int,
        max_tokens: int,
        scope: str = "default",
        caps: Iterable[Cap] = (),
        ttl_s: float | None = None,
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> Reservation:
        """Hold the worst-case cost against every cap of `scope` and `engine` (the cloud, by
        name), or raise `BudgetExceededError` naming the first cap it does not fit (nothing
        held then)."""
        ...

    def check(
        self,
        *,
        price: ModelPrice,
        prompt_tokens: int,
        max_tokens: int,
        scope: str = "default",
        caps: Iterable[Cap] = (),
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> BudgetExceededError | None:
        """What `reserve()` would refuse now, holding nothing."""
        ...

    def settle(self, reservation: Reservation, usage: TokenUsage) -> float:
        """Record the real cost (USD) of the usage; the hold ends."""
        ...

    def release(self, reservation: Reservation) -> None:
        """The request was never sent: drop the hold, record no spend."""
        ...

    def spend(
        self,
        period: Literal["day", "month"],
        scope: str | None = None,
        at: float | None = None,
        *,
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> Spend:
        """Spend and open reservations of the UTC day or month holding `at` (default now): of
        every request, of policy `scope`, of the cloud `engine`, of the end user `user` (an id
        in clear, hashed here, within `tenant`; over every policy), or of the tenant `tenant`
        alone."""
        ...

    def remaining(
        self,
        caps: Sequence[Cap],
        scope: str = "default",
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> float | None:
        """USD left under the tightest day/month cap of `scope` and `engine` (None: no such
        cap)."""
        ...

    def expire(self) -> int:
        """Expire reservations past their time to live now; how many."""
        ...

    def entries(self) -> list[dict[str, object]]:
        """Every entry, oldest first, as `SQLiteLedger`'s columns (for reports and tests)."""
        ...

    def close(self) -> None:
        """Let go of the file or the connections."""
        ...


def ordered_caps(
    caps: Iterable[Cap],
    scope: str,
    engine: str | None = None,
    user: str | None = None,
    tenant: str | None = None,
) -> list[Cap]:
    """The caps that apply to `scope` on `engine` for `user` (a tag) billed to `tenant`,
    per-request caps first: the order every ledger checks them in, so the first refusal names
    the same cap whichever ledger refuses."""
    applicable = [c for c in caps if c.applies(scope, engine, user, tenant)]
    applicable.sort(key=lambda c: c.period != "request")
    return applicable


def remaining_under(
    ledger: Ledger,
    caps: Sequence[Cap],
    scope: str,
    engine: str | None = None,
    user: str | None = None,
    tenant: str | None = None,
) -> float | None:
    """`Ledger.remaining` from `ledger.spend`: the room under the tightest day/month cap that
    applies (0 for a cap an overrun closed), None when no such cap applies. `user`: the end
    user's id, in clear (hashed here)."""
    left: float | None = None
    tag = user_tag(user, tenant)
    for cap in caps:
        if cap.period == "request" or not cap.applies(scope, engine, tag, tenant):
            continue
        if cap.per_user:
            s = ledger.spend(cap.period, user=user, tenant=tenant)
        else:
            s = ledger.spend(cap.period, cap.scope, engine=cap.engine, tenant=cap.tenant)
        room = 0.0 if s.overrun_usd else cap.limit_usd - s.settled_usd - s.reserved_usd
        room = max(0.0, room)  # a cap closed by an overrun has nothing left
        left = room if left is None else min(left, room)
    return left


# ---- the SQLite ledger -------------------------------------------------------------------------

# Append-only: a new schema change is a new step at the end (`hybridllm.sqlite_migrations`);
# the version is the file's `PRAGMA user_version`.
_MIGRATIONS: Steps = (
    # 1: entries and running totals
    """
    CREATE TABLE entries (
        id INTEGER PRIMARY KEY,
        scope TEXT NOT NULL,
        model TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('reserved', 'settled', 'released', 'expired')),
        reserved_nano INTEGER NOT NULL,
        cost_nano INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        estimated INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        closed_at REAL,
        day TEXT NOT NULL,
        month TEXT NOT NULL
    );
    CREATE INDEX entries_day ON entries (day, scope);
    CREATE INDEX entries_month ON entries (month, scope);
    CREATE INDEX entries_open ON entries (state, expires_at);
    CREATE TABLE totals (
        period TEXT NOT NULL,
        scope TEXT NOT NULL,
        spent_nano INTEGER NOT NULL DEFAULT 0,
        held_nano INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (period, scope)
    ) WITHOUT ROWID;
    """,
    # 2: what was billed above a reservation (an overrun closes the caps of its request)
    """
    ALTER TABLE entries ADD COLUMN overrun_nano INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE totals ADD COLUMN overrun_nano INTEGER NOT NULL DEFAULT 0
    """,
    # 3: the cloud an entry was held for, by its name in the client ('': not said); its totals
    # are kept under "e:<engine>" beside the global and the policy's
    """
    ALTER TABLE entries ADD COLUMN engine TEXT NOT NULL DEFAULT ''
    """,
    # 4: the end user an entry was held for (`user_tag`: a hash, never the id; '': none) and
    # the tenant it was billed to (a gateway key's name; '': none); their totals are kept
    # under "u:<tag>" and "k:<tenant>"; the gateway's keys (`hybridllm.guard.keys`) and the
    # request counts of rate limits (`hybridllm.guard.rates`) beside them
    """
    ALTER TABLE entries ADD COLUMN user TEXT NOT NULL DEFAULT '';
    ALTER TABLE entries ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
    CREATE TABLE keys (
        name TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        spec TEXT NOT NULL,
        created_at REAL NOT NULL,
        revoked_at REAL
    );
    CREATE TABLE rates (
        key TEXT NOT NULL,
        window INTEGER NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (key, window)
    ) WITHOUT ROWID
    """,
)
# `totals` keeps, per UTC day ("2026-11-30") and month ("2026-11") and per scope ("p:<policy>",
# "e:<engine>", "*" for all), the spend (settled and expired entries at their cost) and the
# amount held by open reservations, and what settled above its reservation (overruns),
# updated in the same transaction as `entries`: a reservation reads two rows per cap however
# many requests the day had.
_BUMP = """
    INSERT INTO totals (period, scope, spent_nano, held_nano, overrun_nano) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (period, scope) DO UPDATE SET
        spent_nano = spent_nano + excluded.spent_nano, held_nano = held_nano + excluded.held_nano,
        overrun_nano = overrun_nano + excluded.overrun_nano
"""


class SQLiteLedger:
    """Reservations and spend on one SQLite file (or ":memory:"), shared safely by threads and
    processes of one machine. `ttl_s`: how long a reservation may stay open before it
    expires."""

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        ttl_s: float = 900.0,
        busy_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path if path == ":memory:" else Path(path).expanduser()
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        if isinstance(self.path, Path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if isinstance(self.path, Path):
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    def _migrate(self) -> None:
        with self._lock:
            migrate(self._db, _MIGRATIONS)

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction on the ledger's file (what the gateway's keys and the rate
        limits, `hybridllm.guard.keys` and `rates`, keep beside the books use)."""
        return self._tx()

    def now(self) -> float:
        """The ledger's clock (seconds since the epoch)."""
        return self._clock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SQLiteLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reserve / settle / release ---------------------------------------------------------

    def reserve(
        self,
        *,
        model: str,
        price: ModelPrice,
        prompt_tokens: int,
        max_tokens: int,
        scope: str = "default",
        caps: Iterable[Cap] = (),
        ttl_s: float | None = None,
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> Reservation:
        """Hold the worst-case cost against every cap that applies to `scope`, `engine` and
        `user` (the end user's id, kept hashed), or raise `BudgetExceededError` naming the first
        cap it does not fit (nothing is held then)."""
        amount = price.cost_nano(prompt_tokens, max_tokens)
        tag = user_tag(user, tenant)
        rid: int | None = None
        with self._tx() as db:  # what expired meanwhile stays expired, refused or not
            now = self._clock()
            day, month = utc_day_month(now)
            self._expire(db, now)
            ordered = ordered_caps(caps, scope, engine, tag, tenant)
            refusal = self._shortfall(db, ordered, amount, day, month, tag)
            expires = now + (self.ttl_s if ttl_s is None else ttl_s)
            if refusal is None:
                cur = db.execute(
                    "INSERT INTO entries (scope, engine, user, tenant, model, state, "
                    "reserved_nano, prompt_tokens, created_at, expires_at, day, month) "
                    "VALUES (?, ?, ?, ?, ?, 'reserved', ?, ?, ?, ?, ?, ?)",
                    (scope, engine or "", tag or "", tenant or "", model, amount, prompt_tokens)
                    + (now, expires, day, month),
                )
                rid = cur.lastrowid
                keys = entry_keys(scope, engine, tag, tenant)
                _bump(db, keys, day, month, spent=0, held=amount)
        if refusal is not None:
            log.info("%s", refusal)  # the cap and the amounts, never the request
            raise refusal
        assert rid is not None
        held = (prompt_tokens, max_tokens, amount / NANO, day, month, expires)
        return Reservation(rid, scope, model, price, *held, engine=engine, user=tag, tenant=tenant)

    def settle(self, reservation: Reservation, usage: TokenUsage) -> float:
        """Record the real cost (USD) from the usage; the reservation's hold ends. Settling a
        reservation that already expired replaces its worst case by this cost. A cost above the
        reservation is recorded as it is, and as an overrun (see the module). A second settle
        or a settle after release changes nothing and returns the recorded cost."""
        cost = reservation.price.cost_nano(usage.prompt_tokens, usage.completion_tokens)
        with self._tx() as db:
            if not _close(db, reservation.id, cost):
                row = db.execute(
                    "SELECT cost_nano FROM entries WHERE id = ?", (reservation.id,)
                ).fetchone()
                return 0.0 if row is None else int(row[0]) / NANO
            db.execute(
                "UPDATE entries SET state = 'settled', prompt_tokens = ?, completion_tokens = ?, "
                "estimated = ?, closed_at = ? WHERE id = ?",
                (
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    int(usage.estimated),
                    self._clock(),
                    reservation.id,
                ),
            )
        return cost / NANO

    def check(
        self,
        *,
        price: ModelPrice,
        prompt_tokens: int,
        max_tokens: int,
        scope: str = "default",
        caps: Iterable[Cap] = (),
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> BudgetExceededError | None:
        """What `reserve()` would refuse now, holding nothing: the error naming the first cap
        the worst-case cost does not fit, or None when it fits every cap. (Routing asks this
        before it picks the cloud; the reservation stays the authority.)"""
        amount = price.cost_nano(prompt_tokens, max_tokens)
        tag = user_tag(user, tenant)
        with self._tx() as db:
            now = self._clock()
            day, month = utc_day_month(now)
            self._expire(db, now)
            ordered = ordered_caps(caps, scope, engine, tag, tenant)
            return self._shortfall(db, ordered, amount, day, month, tag)

    def _shortfall(
        self,
        db: sqlite3.Connection,
        caps: list[Cap],
        amount: int,
        day: str,
        month: str,
        user: str | None = None,
    ) -> BudgetExceededError | None:
        """THE cap check (`reserve` and `check`), over the caps that apply (`ordered_caps`):
        per-request caps first, then each day and month cap against its spend and open
        reservations, in nano-dollars; a cap closed by an overrun in its period (see the
        module) refuses whatever the amount."""
        for cap in caps:
            key = month if cap.period == "month" else day
            spent, held, overrun = self._sums(db, key, cap.key_for(user))
            if cap.period == "request":
                spent = held = 0
            if overrun:
                return exceeded(cap, spent, held, amount, overrun=overrun)
            if spent + held + amount > usd_nano(cap.limit_usd):
                return exceeded(cap, spent, held, amount)
        return None

    def release(self, reservation: Reservation) -> None:
        """The request was never sent: drop the hold, record no spend."""
        with self._tx() as db:
            if _close(db, reservation.id, 0):
                db.execute(
                    "UPDATE entries SET state = 'released', closed_at = ? WHERE id = ?",
                    (self._clock(), reservation.id),
                )

    # ---- queries ----------------------------------------------------------------------------

    def spend(
        self,
        period: Literal["day", "month"],
        scope: str | None = None,
        at: float | None = None,
        *,
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> Spend:
        """Spend and open reservations of the UTC day or month holding `at` (default now): of
        every request, of policy `scope`, of the cloud `engine`, of the end user `user` (an id
        in clear, hashed here, within `tenant`; over every policy), or of the tenant `tenant`
        alone."""
        with self._tx() as db:
            now = self._clock()
            self._expire(db, now)
            day, month = utc_day_month(now if at is None else at)
            key = day if period == "day" else month
            who = totals_key(scope, engine, user_tag(user, tenant), tenant)
            spent, held, overrun = self._sums(db, key, who)
        return Spend(spent / NANO, held / NANO, overrun / NANO)

    def remaining(
        self,
        caps: Sequence[Cap],
        scope: str = "default",
        engine: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
    ) -> float | None:
        """USD left under the tightest day/month cap that applies (None: no such cap; 0 for a cap
        an overrun closed). What a router reads as "budget left"; a per-request cap is a limit
        per request, not a stock."""
        return remaining_under(self, caps, scope, engine, user, tenant)

    def expire(self) -> int:
        """Expire reservations past their time to live now; how many."""
        with self._tx() as db:
            return self._expire(db, self._clock())

    def entries(self) -> list[dict[str, object]]:
        """Every entry, oldest first (for reports and tests)."""
        with self._tx() as db:
            cur = db.execute("SELECT * FROM entries ORDER BY id")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    @staticmethod
    def _expire(db: sqlite3.Connection, now: float) -> int:
        stale = db.execute(
            "SELECT id, scope, engine, user, tenant, day, month, reserved_nano FROM entries "
            "WHERE state = 'reserved' AND expires_at <= ?",
            (now,),
        ).fetchall()
        for rid, scope, engine, user, tenant, day, month, amount in stale:
            db.execute(
                "UPDATE entries SET state = 'expired', cost_nano = reserved_nano, closed_at = ? "
                "WHERE id = ?",
                (now, rid),
            )
            keys = entry_keys(scope, engine, user, tenant)
            _bump(db, keys, day, month, spent=amount, held=-amount)
        return len(stale)

    @staticmethod
    def _sums(db: sqlite3.Connection, period: str, key: str) -> tuple[int, int, int]:
        """Spent, held and overrun nano-dollars of one UTC day or month (`period`) under one
        totals key (`totals_key`)."""
        row = db.execute(
            "SELECT spent_nano, held_nano, overrun_nano FROM totals WHERE period = ? AND scope = ?",
            (period, key),
        ).fetchone()
        return (0, 0, 0) if row is None else (int(row[0]), int(row[1]), int(row[2]))


def _bump(
    db: sqlite3.Connection,
    keys: tuple[str, ...],
    day: str,
    month: str,
    *,
    spent: int,
    held: int,
    overrun: int = 0,
) -> None:
    for period in (day, month):
        for key in keys:
            db.execute(_BUMP, (period, key, spent, held, overrun))


def _close(db: sqlite3.Connection, rid: int, cost: int) -> bool:
    """End an open (reserved or expired) entry at `cost` and move the totals (a cost above the
    reservation is an overrun too); False if it was already closed (settled or released) or is
    unknown."""
    row = db.execute(
        "SELECT state, scope, engine, user, tenant, day, month, reserved_nano FROM entries "
        "WHERE id = ?",
        (rid,),
    ).fetchone()
    if row is None or row[0] not in ("reserved", "expired"):
        return False
    state, scope, engine, user, tenant, day, month, amount = row
    keys, over = entry_keys(scope, engine, user, tenant), max(0, cost - amount)
    if state == "reserved":
        _bump(db, keys, day, month, spent=cost, held=-amount, overrun=over)
    else:  # expired: it was counted as spent at its worst case
        _bump(db, keys, day, month, spent=cost - amount, held=0, overrun=over)
    db.execute("UPDATE entries SET cost_nano = ?, overrun_nano = ? WHERE id = ?", (cost, over, rid))
    return True


class _Transaction:
    """`with` block: the process-local lock, then BEGIN IMMEDIATE (the file's write lock, so no
    other process reads-then-writes in between); COMMIT on success, ROLLBACK on error."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db = db
        self._lock = lock

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        return self._db

    def __exit__(self, et: type[BaseException] | None, *rest: object) -> None:
        try:
            self._db.execute("ROLLBACK" if et is not None else "COMMIT")
        finally:
            self._lock.release()


def usd_nano(usd: float) -> int:
    """An amount in USD as exact integer nano-dollars (what the ledgers compare)."""
    return round(Decimal(str(usd)) * NANO)


def exceeded(
    cap: Cap, spent: int, held: int, amount: int, *, overrun: int = 0
) -> BudgetExceededError:
    """The refusal of `cap` (amounts in nano-dollars), the same from every ledger."""
    name = cap.describe()
    if overrun:
        per = "month" if cap.period == "month" else "day"
        billed = f"{overrun / NANO:.9f}".rstrip("0")
        name += f" (closed for this UTC {per}: a request was billed ${billed} over its bound)"
    return BudgetExceededError(
        cap=name,
        per_user=cap.per_user,
        tenant=cap.tenant,
        limit_usd=cap.limit_usd,
        spent_usd=spent / NANO,
        reserved_usd=held / NANO,
        needed_usd=amount / NANO,
    )
