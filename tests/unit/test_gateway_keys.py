"""The gateway's virtual keys over `ScriptedEngine` doubles (orchestration only; two real
gateway processes on a real Redis are in tests/integration/test_gateway_shared_budget.py): who
may call (the admin key, a live key, nobody once a key exists; a revoked key refused at the
next request), a key's policies (403), its requests per minute (429 with Retry-After), its
budget (the tenant's caps), `GET /v1/usage`, and the key store and rate counter themselves on
both ledgers (SQLite here, Redis on a real loopback redis-server: integration)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hybridllm import HybridClient
from hybridllm.cli.main import main
from hybridllm.errors import InvalidArgumentError
from hybridllm.gateway.app import create_app
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.guard.budget import Ledger, ModelPrice, Prices, SQLiteLedger
from hybridllm.guard.budget_redis import RedisLedger
from hybridllm.guard.keys import KeySpec, key_hash, key_store
from hybridllm.guard.rates import rate_counter
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

POLICIES = {
    "gw-rpm": (
        '[routing]\nprefer = "cloud"\n[limits]\nper_user_rpm = 1\n[budget]\non_exceeded = "fail"\n'
    ),
    "gw-cloud": '[routing]\nprefer = "cloud"\n',
    "gw-local": '[routing]\nprefer = "local"\nallow_cloud = false\nfallback_order = ["local"]\n',
}
ADMIN = "sk-admin"
PRICES = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
T0 = 1_780_000_020.0  # a fixed time: the start of a UTC minute


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    for name, text in POLICIES.items():
        (tmp_path / f"{name}.toml").write_text(text)
    return tmp_path


@pytest.fixture
def clock() -> Clock:
    """The ledger's clock (the window of a rate limit moves with it)."""
    return Clock()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
def ledger(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Ledger]:
    if request.param == "sqlite":
        made: Ledger = SQLiteLedger(tmp_path / "ledger.db", clock=clock)
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisLedger(f"{url}?prefix=keys-{tmp_path.name}", clock=clock)
    yield made
    made.close()


def body(model: str, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


async def gateway(
    policy_dir: Path,
    ledger: Ledger,
    *,
    admin: str | None = ADMIN,
    cloud_tokens: int = 1,
    **client: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, ScriptedEngine]]:
    local = ScriptedEngine("local", tokens=["l"])
    cloud = ScriptedEngine("cloud", tokens=["c"] * cloud_tokens)
    client.setdefault("prices", PRICES)  # a ledger costs the cloud's requests
    hybrid = HybridClient(
        local=local, cloud=cloud, router=None, policy_dirs=[policy_dir], ledger=ledger, **client
    )
    app = create_app(
        hybrid, GatewayLimits(), api_key=admin, keys=key_store(ledger), rates=rate_counter(ledger)
    )
    async with hybrid:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            yield http, cloud


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_keys_are_hashed_at_rest_shown_once_and_revoked_by_name(ledger: Ledger) -> None:
    store = key_store(ledger)
    assert not store.holds_keys() and store.records() == []
    spec = KeySpec("team-a", day_usd=5.0, policies=("chat",), rpm=60)
    secret = store.create(spec)
    assert secret.startswith("sk-hl-") and len(secret) > 40
    assert store.find(secret) == spec and store.find(secret + "x") is None
    assert store.holds_keys()
    with pytest.raises(InvalidArgumentError) as info:
        store.create(KeySpec("team-a"))
    assert info.value.argument == "name"
    stored = json.dumps(ledger.entries()) + repr(store.records())
    if isinstance(ledger, SQLiteLedger):
        with ledger.transaction() as db:
            stored += repr(db.execute("SELECT * FROM keys").fetchall())
        assert key_hash(secret) in stored
    assert secret not in stored
    assert store.revoke("team-a") and not store.revoke("team-a") and not store.revoke("nobody")
    assert store.find(secret) is None
    (record,) = store.records()
    assert record.revoked and record.spec == spec
    with pytest.raises(InvalidArgumentError):  # a used name is never given again
        store.create(KeySpec("team-a"))


def test_the_rate_counter_holds_a_key_to_its_limit_per_window(ledger: Ledger, clock: Clock) -> None:
    rates = rate_counter(ledger)
    assert [rates.hit("k:a", 2) for _ in range(2)] == [None, None]
    wait = rates.hit("k:a", 2)
    assert wait is not None and 0 < wait <= 60
    assert rates.hit("k:b", 2) is None  # another key: its own count
    assert rates.count("k:a") == 2  # the refused hit was not counted
    assert rates.hit("k:b", 2, count=False) is None and rates.count("k:b") == 1
    clock.t += wait  # the next window
    assert rates.count("k:a") == 0 and rates.hit("k:a", 2) is None


async def test_a_keyed_gateway_takes_only_its_keys_and_a_revoked_one_at_once(
    policy_dir: Path, ledger: Ledger
) -> None:
    store = key_store(ledger)
    async for http, _ in gateway(policy_dir, ledger, admin=None):
        open_ = await http.post("/v1/chat/completions", json=body("gw-local"))
        secret = store.create(KeySpec("team-a"))
        refused = await http.post("/v1/chat/completions", json=body("gw-local"))
        keyed = await http.post(
            "/v1/chat/completions", json=body("gw-local"), headers=bearer(secret)
        )
        store.revoke("team-a")
        revoked = await http.post(
            "/v1/chat/completions", json=body("gw-local"), headers=bearer(secret)
        )
    assert open_.status_code == 200  # no keys and no admin key: an open (loopback) gateway
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert keyed.status_code == 200
    assert revoked.status_code == 401
    async for http, _ in gateway(policy_dir, ledger):
        admin = await http.post(
            "/v1/chat/completions", json=body("gw-local"), headers=bearer(ADMIN)
        )
        nobody = await http.get("/v1/models")
    assert admin.status_code == 200 and nobody.status_code == 401


async def test_a_key_uses_only_its_policies(policy_dir: Path, ledger: Ledger) -> None:
    secret = key_store(ledger).create(KeySpec("team-a", policies=("gw-local",)))
    async for http, _ in gateway(policy_dir, ledger):
        ok = await http.post("/v1/chat/completions", json=body("gw-local"), headers=bearer(secret))
        no = await http.post("/v1/chat/completions", json=body("gw-cloud"), headers=bearer(secret))
        models = await http.get("/v1/models", headers=bearer(secret))
        every = await http.get("/v1/models", headers=bearer(ADMIN))
    assert ok.status_code == 200
    assert no.status_code == 403
    error = no.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "policy_not_allowed",
        "permission_error",
        "model",
    )
    assert [m["id"] for m in models.json()["data"]] == ["hybridllm/gw-local"]
    assert len(every.json()["data"]) > 1


async def test_a_key_past_its_rpm_gets_429_with_retry_after(
    policy_dir: Path, ledger: Ledger, clock: Clock
) -> None:
    secret = key_store(ledger).create(KeySpec("team-a", rpm=2))
    other = key_store(ledger).create(KeySpec("team-b", rpm=2))
    async for http, _ in gateway(policy_dir, ledger):
        statuses = []
        for _ in range(3):
            r = await http.post(
                "/v1/chat/completions", json=body("gw-local"), headers=bearer(secret)
            )
            statuses.append(r.status_code)
        b = await http.post("/v1/chat/completions", json=body("gw-local"), headers=bearer(other))
        clock.t += 60
        later = await http.post(
            "/v1/chat/completions", json=body("gw-local"), headers=bearer(secret)
        )
    assert statuses == [200, 200, 429] and b.status_code == 200 and later.status_code == 200
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 60


async def test_a_users_rpm_under_fail_is_a_429_with_retry_after(
    policy_dir: Path, ledger: Ledger
) -> None:
    """`[limits] per_user_rpm = 1` and `on_exceeded = "fail"`: the user's second cloud request
    this minute is refused with OpenAI's rate-limit shape and when to retry; another user is
    not held by it."""
    async for http, cloud in gateway(policy_dir, ledger):
        first = await http.post(
            "/v1/chat/completions", json=body("gw-rpm", user="u1"), headers=bearer(ADMIN)
        )
        second = await http.post(
            "/v1/chat/completions", json=body("gw-rpm", user="u1"), headers=bearer(ADMIN)
        )
        other = await http.post(
            "/v1/chat/completions", json=body("gw-rpm", user="u2"), headers=bearer(ADMIN)
        )
        sent = len(cloud.requests)
    assert (first.status_code, second.status_code, other.status_code) == (200, 429, 200)
    error = second.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "rate_limit_error")
    assert 1 <= int(second.headers["retry-after"]) <= 60
    assert sent == 2


async def test_a_keys_budget_bills_its_tenant_and_usage_shows_it(
    policy_dir: Path, ledger: Ledger
) -> None:
    """A key with $0.0008 a day: the scripted cloud's first request (a worst case of about
    $0.0005: a short prompt and 256 tokens out at $1 / $2 per million) fits, and bills about
    $0.0004 (200 tokens out); the next worst case no longer fits, so the rest go local
    (on_exceeded "local"); the usage endpoint shows the key its own spend and the admin every
    key's."""
    store = key_store(ledger)
    secret = store.create(KeySpec("team-a", day_usd=0.0008))
    store.create(KeySpec("team-b"))
    async for http, cloud in gateway(policy_dir, ledger, cloud_tokens=200):
        engines = []
        for _ in range(4):
            r = await http.post(
                "/v1/chat/completions",
                json=body("gw-cloud", max_tokens=256),
                headers=bearer(secret),
            )
            assert r.status_code == 200
            engines.append(r.headers["x-hybridllm-engine"])
        mine = (await http.get("/v1/usage", headers=bearer(secret))).json()
        every = (await http.get("/v1/usage", headers=bearer(ADMIN))).json()
        sent = len(cloud.requests)
    assert engines[0] == "cloud" and "local" in engines
    assert sent == engines.count("cloud")
    (usage,) = mine["data"]
    assert usage["key"] == "team-a" and usage["day"]["limit_usd"] == 0.0008
    assert 0 < usage["day"]["spent_usd"] <= 0.0008 and usage["day"]["reserved_usd"] == 0
    assert usage["day"]["left_usd"] == pytest.approx(0.0008 - usage["day"]["spent_usd"])
    assert ledger.spend("day", tenant="team-a").settled_usd == usage["day"]["spent_usd"]
    assert {u["key"] for u in every["data"]} == {"team-a", "team-b"}


def test_the_keys_command_creates_lists_and_revokes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    args = ["keys", "create", "--ledger", db, "--name", "team-a", "--budget-day", "5"]
    assert main([*args, "--policies", "chat,voice-assistant", "--rpm", "60"]) == 0
    secret = capsys.readouterr().out.strip()
    ledger = SQLiteLedger(db)
    spec = key_store(ledger).find(secret)
    assert spec == KeySpec("team-a", 5.0, None, ("chat", "voice-assistant"), 60)
    assert main(["keys", "create", "--ledger", db, "--name", "x", "--policies", "nope"]) == 2
    assert main(["keys", "list", "--ledger", db]) == 0
    listed = capsys.readouterr().out
    assert "team-a" in listed and secret not in listed
    assert main(["keys", "revoke", "--ledger", db, "--name", "team-a"]) == 0
    assert main(["keys", "revoke", "--ledger", db, "--name", "team-a"]) == 1
    assert key_store(ledger).find(secret) is None
    ledger.close()
