"""The gateway's virtual keys, kept in its budget ledger (SQLite or Redis), hashed at rest.

    store = key_store(ledger_from_url("redis://ledger:6379/0"))
    secret = store.create(KeySpec("team-a", day_usd=5.0, policies=("chat",), rpm=60))
    store.find(secret)        # the live key's spec (None: unknown or revoked)
    store.revoke("team-a")    # refused from the next request on, by every gateway on the ledger

A key is a tenant (`hybridllm.policy.Tenant`): its name is what its requests are billed as, its
`day_usd` / `month_usd` cap them over every policy, `policies` are the only ones it may use
(None: all), `rpm` its requests per minute (`hybridllm.guard.rates`). The secret is shown once,
at creation (`sk-hl-` and 43 URL-safe characters: 256 random bits), and stored as its SHA-256
(a key this long needs no slow hash); a name, once used, is never given to another key, so a
tenant's books are its own. `hybridllm keys create / list / revoke` is the command line.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from hybridllm.errors import ConfigError, InvalidArgumentError
from hybridllm.guard.budget import Ledger, SQLiteLedger
from hybridllm.guard.budget_redis import RedisLedger
from hybridllm.policy import Tenant

__all__ = ["KeyRecord", "KeySpec", "KeyStore", "key_hash", "key_store"]

PREFIX = "sk-hl-"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class KeySpec:
    """What one key may do: its name (the tenant), its caps in USD per UTC day and month
    (None: none), the policies it may use (None: every one), its requests per minute (None: no
    limit). Checked when made (`InvalidArgumentError` naming the field)."""

    name: str
    day_usd: float | None = None
    month_usd: float | None = None
    policies: tuple[str, ...] | None = None
    rpm: int | None = None

    def __post_init__(self) -> None:
        Tenant(self.name, self.day_usd, self.month_usd)  # the name and the amounts
        if self.rpm is not None and (
            isinstance(self.rpm, bool) or not isinstance(self.rpm, int) or self.rpm < 1
        ):
            raise InvalidArgumentError("rpm", self.rpm, "an integer >= 1, or None")
        if self.policies is not None:
            if not self.policies or not all(isinstance(p, str) and p for p in self.policies):
                raise InvalidArgumentError("policies", self.policies, "policy names, or None")

    @property
    def tenant(self) -> Tenant:
        return Tenant(self.name, self.day_usd, self.month_usd)

    def allows(self, policy: str) -> bool:
        return self.policies is None or policy in self.policies

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> KeySpec:
        data = json.loads(text)
        policies = data.get("policies")
        data["policies"] = None if policies is None else tuple(policies)
        return cls(**data)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as `KeyStore.records()` lists it (never its secret)."""

    spec: KeySpec
    created_at: float
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


class KeyStore(Protocol):
    def create(self, spec: KeySpec) -> str:
        """Store a new key and return its secret (shown once); a name already used (revoked
        too) is an `InvalidArgumentError` on "name"."""
        ...

    def find(self, secret: str) -> KeySpec | None:
        """The live key whose secret this is (None: unknown or revoked)."""
        ...

    def records(self) -> list[KeyRecord]:
        """Every key, by name."""
        ...

    def revoke(self, name: str) -> bool:
        """Revoke the key `name` now (False: no such live key)."""
        ...

    def holds_keys(self) -> bool:
        """Has a key ever been made here (revoked ones count: a gateway stays keyed)?"""
        ...


def key_store(ledger: Ledger) -> KeyStore:
    """The keys kept in `ledger` (an `SQLiteLedger` or a `RedisLedger`)."""
    if isinstance(ledger, SQLiteLedger):
        return _SQLiteKeys(ledger)
    if isinstance(ledger, RedisLedger):
        return _RedisKeys(ledger)
    raise ConfigError(f"keys need an SQLite or Redis ledger, not {type(ledger).__name__}")


def _taken(name: str) -> InvalidArgumentError:
    return InvalidArgumentError("name", name, "a name no key of this ledger has had")


class _SQLiteKeys:
    def __init__(self, ledger: SQLiteLedger) -> None:
        self.ledger = ledger

    def create(self, spec: KeySpec) -> str:
        secret = new_secret()
        with self.ledger.transaction() as db:
            if db.execute("SELECT 1 FROM keys WHERE name = ?", (spec.name,)).fetchone():
                raise _taken(spec.name)
            db.execute(
                "INSERT INTO keys (name, hash, spec, created_at) VALUES (?, ?, ?, ?)",
                (spec.name, key_hash(secret), spec.dumps(), self.ledger.now()),
            )
        return secret

    def find(self, secret: str) -> KeySpec | None:
        with self.ledger.transaction() as db:
            row = db.execute(
                "SELECT spec FROM keys WHERE hash = ? AND revoked_at IS NULL", (key_hash(secret),)
            ).fetchone()
        return None if row is None else KeySpec.loads(row[0])

    def records(self) -> list[KeyRecord]:
        with self.ledger.transaction() as db:
            rows = db.execute(
                "SELECT spec, created_at, revoked_at FROM keys ORDER BY name"
            ).fetchall()
        return [KeyRecord(KeySpec.loads(s), c, r) for s, c, r in rows]

    def revoke(self, name: str) -> bool:
        with self.ledger.transaction() as db:
            cur = db.execute(
                "UPDATE keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
                (self.ledger.now(), name),
            )
        return cur.rowcount > 0

    def holds_keys(self) -> bool:
        with self.ledger.transaction() as db:
            return db.execute("SELECT 1 FROM keys LIMIT 1").fetchone() is not None


# Under the ledger's prefix: `:keys` (a hash, name -> the record as JSON: spec, hash,
# created_at, revoked_at) and `:keyhash` (a hash, the secret's hash -> name).
# create: ARGV = name, hash, record. Answers 1, or 0 when the name is taken.
_CREATE = """
if redis.call('HEXISTS', KEYS[1] .. ':keys', ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1] .. ':keys', ARGV[1], ARGV[3])
redis.call('HSET', KEYS[1] .. ':keyhash', ARGV[2], ARGV[1])
return 1
"""
# find: ARGV = hash. Answers the record, or false.
_FIND = """
local name = redis.call('HGET', KEYS[1] .. ':keyhash', ARGV[1])
if not name then return false end
return redis.call('HGET', KEYS[1] .. ':keys', name)
"""
# revoke: ARGV = name, now. Answers 1, or 0 when there is no such live key.
_REVOKE = """
local raw = redis.call('HGET', KEYS[1] .. ':keys', ARGV[1])
if not raw then return 0 end
local record = cjson.decode(raw)
if record['revoked_at'] ~= cjson.null and record['revoked_at'] ~= nil then return 0 end
record['revoked_at'] = tonumber(ARGV[2])
redis.call('HSET', KEYS[1] .. ':keys', ARGV[1], cjson.encode(record))
return 1
"""
_ALL = "return redis.call('HVALS', KEYS[1] .. ':keys')\n"
_COUNT = "return redis.call('HLEN', KEYS[1] .. ':keys')\n"


class _RedisKeys:
    def __init__(self, ledger: RedisLedger) -> None:
        self.ledger = ledger
        run: Callable[[str], Callable[[Sequence[object]], Any]] = ledger.script
        self._create, self._find = run(_CREATE), run(_FIND)
        self._revoke, self._all, self._count = run(_REVOKE), run(_ALL), run(_COUNT)

    def create(self, spec: KeySpec) -> str:
        secret = new_secret()
        record = {"spec": spec.dumps(), "created_at": self.ledger.now(), "revoked_at": None}
        if not int(self._create((spec.name, key_hash(secret), json.dumps(record)))):
            raise _taken(spec.name)
        return secret

    def find(self, secret: str) -> KeySpec | None:
        raw = self._find((key_hash(secret),))
        if not raw:
            return None
        record = json.loads(raw)
        return None if record.get("revoked_at") is not None else KeySpec.loads(record["spec"])

    def records(self) -> list[KeyRecord]:
        out = []
        for raw in self._all(("all",)):
            r = json.loads(raw)
            out.append(KeyRecord(KeySpec.loads(r["spec"]), r["created_at"], r.get("revoked_at")))
        return sorted(out, key=lambda r: r.spec.name)

    def revoke(self, name: str) -> bool:
        return bool(int(self._revoke((name, self.ledger.now()))))

    def holds_keys(self) -> bool:
        return bool(int(self._count(("count",))))
