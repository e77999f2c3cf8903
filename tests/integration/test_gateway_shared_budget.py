"""Two `hybridllm serve` gateway processes share one budget on a Redis ledger (issue 29, part 2),
with per-user caps and virtual keys (issue 46: OpenAI's `user` field is the end user within the
request's key; each key a tenant with its own daily cap).

Each gateway is the real command in its own process (`--ledger redis://...`, `--prices`), over
the real local engine (SmolLM2, one thread) and the stand-in cloud on loopback; three keys made
with `hybridllm keys create` in the same Redis before they start. 200 streams at once, 100
through each, from 20 users of each of the 3 keys, under small daily caps (global, per key, per
user) of a cloud-first policy: no cap is passed, with no overrun and nothing left reserved, what
was settled equals what the cloud billed (its reported usage at its price), and every stream is
answered (by the cloud while the caps cover it, then by the local engine: the policy's
`on_exceeded = "local"`). A key revoked afterwards is refused at once by both gateways. What
the two gateways settle is read back from Redis, not from either gateway. Both also write
one decision log on the same server (`--decision-log redis://...`): it holds every stream's
row, whichever gateway served it, and `hybridllm stats --log` counts them all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from hybridllm.cli.main import main
from hybridllm.guard.budget import ModelPrice
from hybridllm.guard.budget_redis import RedisLedger
from hybridllm.guard.prices import NANO
from hybridllm.routing.log_redis import RedisDecisionLog
from hybridllm.testing import HybridServer
from hybridllm.testing.server import free_port
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CAP_USD = 0.08
# each end user's day (issue 46): one worst case fits, a second does not
PER_USER_USD = 0.015
USERS = 20
# the keys (tenants) and their daily caps: together more than the global cap
KEYS = {"team-a": 0.03, "team-b": 0.035, "team-c": 0.045}
# the stand-in's price: a worst case (a prompt bound of about 100 tokens and max_tokens 4) is
# about $0.014, a settled answer about $0.008,
# so the caps cover a few cloud answers of the 200
PRICE = ModelPrice(input_per_million=100.0, output_per_million=1000.0)
PRICES = f'[models."{ALIAS}"]\ninput_per_million = 100.0\noutput_per_million = 1000.0\n'
POLICY = (
    '[sampling]\ntemperature = 0.0\nmax_tokens = 4\n[routing]\nprefer = "cloud"\n'
    f'ttft_deadline_ms = 60000\n[budget]\nper_day_usd = {CAP_USD}\non_exceeded = "local"\n'
    f"per_user_day_usd = {PER_USER_USD}\n"
)
STREAMS = 200


def _gateway(
    model: Path, cloud: HybridServer, ledger: str, dlog: str, tmp: Path
) -> tuple[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "hybridllm.cli.main", "serve", "--port", str(port)]
    argv += ["--local", str(model), "--cloud-url", cloud.base_url, "--cloud-model", ALIAS]
    argv += ["--ledger", ledger, "--prices", str(tmp / "prices.toml"), "--n-threads", "1"]
    argv += ["--max-concurrency", str(STREAMS), "--log-level", "warning", "--decision-log", dlog]
    env = {**os.environ, "OPENAI_API_KEY": API_KEY, "HYBRIDLLM_POLICY_PATH": str(tmp)}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    return f"http://127.0.0.1:{port}", proc


def _wait_ready(url: str, proc: Any) -> None:
    deadline = time.monotonic() + 120.0  # the local model loads at start
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:  # a keyed gateway answers 401 once it serves
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code in (200, 401):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the gateway at {url} did not start")


def _create_keys(ledger: str, tmp: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """The keys, made with the command line; name -> the secret it printed once."""
    secrets = {}
    for name, usd in KEYS.items():
        argv = ["keys", "create", "--ledger", ledger, "--name", name, "--budget-day", str(usd)]
        argv += ["--policies", "shared", "--policy-dir", str(tmp)]
        assert main(argv) == 0, capsys.readouterr().err
        secrets[name] = capsys.readouterr().out.strip()
    return secrets


@pytest.fixture
def gateways(
    model_path: Path,
    cloud_server: HybridServer,
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[tuple[list[str], str, str, dict[str, str]]]:
    (tmp_path / "prices.toml").write_text(PRICES)
    (tmp_path / "shared.toml").write_text(POLICY)
    run = uuid.uuid4().hex[:8]
    ledger = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix=gw-{run}"
    dlog = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix=gw-log-{run}"
    keys = _create_keys(ledger, tmp_path, capsys)
    started = [_gateway(model_path, cloud_server, ledger, dlog, tmp_path) for _ in range(2)]
    try:
        for url, proc in started:
            _wait_ready(url, proc)
        yield [url for url, _ in started], ledger, dlog, keys
    finally:
        for _, proc in started:
            proc.terminate()
            proc.wait(timeout=30)


class Streamed:
    def __init__(self, status: int, engine: str | None, usage: dict[str, int] | None) -> None:
        self.status, self.engine, self.usage = status, engine, usage


async def _stream(http: httpx.AsyncClient, url: str, i: int, key: str) -> Streamed:
    """One streamed request with key `key`: its status, the engine the finish chunk names and
    the usage chunk's counts."""
    body = {
        "model": "hybridllm/shared",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"Say the number {i} in words."}],
        "user": f"user-{i % USERS}",
    }
    engine, usage = None, None
    headers = {"authorization": f"Bearer {key}"}
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                extra = chunk.get("hybridllm") or {}
                engine = extra.get("engine", engine) if "plan" in extra else engine
                usage = chunk.get("usage") or usage
    return Streamed(r.status_code, engine, usage)


async def test_two_gateways_never_overspend_one_shared_cap(
    gateways: tuple[list[str], str, str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    urls, ledger_url, log_url, keys = gateways
    names = list(keys)
    results: list[Streamed] = []

    async def one(i: int) -> None:
        results.append(await _stream(http, urls[i % 2], i, keys[names[i % len(names)]]))

    started = time.time()
    async with httpx.AsyncClient(timeout=300.0) as http:
        async with anyio.create_task_group() as tg:
            for i in range(STREAMS):
                tg.start_soon(one, i)
    if time.gmtime(started).tm_yday != time.gmtime().tm_yday:  # CI run 21 met one at 00:00
        pytest.skip("the streams crossed a UTC midnight: the daily caps rolled over mid-test")
    assert [r.status for r in results] == [200] * STREAMS  # none lost, none refused
    engines = [r.engine for r in results]
    assert None not in engines, engines  # each stream ended with its decision
    assert 0 < engines.count("cloud") < STREAMS, engines  # the caps cut the cloud off
    billed = sum(
        PRICE.cost_nano(r.usage["prompt_tokens"], r.usage["completion_tokens"])
        for r in results
        if r.engine == "cloud" and r.usage is not None
    )
    assert all(r.usage is not None for r in results if r.engine == "cloud")
    with RedisLedger(ledger_url) as ledger:
        day = ledger.spend("day")
        tenants = {k: ledger.spend("day", tenant=k) for k in names}
        users = [
            ledger.spend("day", user=f"user-{u}", tenant=k) for u in range(USERS) for k in names
        ]
    assert day.settled_usd <= CAP_USD and day.overrun_usd == 0.0, day
    assert day.settled_usd == pytest.approx(billed / NANO)  # what the cloud billed, settled
    # no key and no user over its cap, and their spends are the whole spend
    assert all(tenants[k].settled_usd <= KEYS[k] for k in names), tenants
    assert sum(t.settled_usd for t in tenants.values()) == pytest.approx(day.settled_usd)
    assert all(u.settled_usd <= PER_USER_USD and u.reserved_usd == 0.0 for u in users), users
    assert sum(u.settled_usd for u in users) == pytest.approx(day.settled_usd)
    assert day.reserved_usd == 0.0, day  # every reservation settled or released
    assert day.settled_usd > 0.0
    # a revoked key is refused from the next request on, by both gateways
    assert main(["keys", "revoke", "--ledger", ledger_url, "--name", names[0]]) == 0
    async with httpx.AsyncClient(timeout=30.0) as http:
        refused = [await http.get(f"{u}/v1/usage", headers=_bearer(keys[names[0]])) for u in urls]
        kept = [await http.get(f"{u}/v1/usage", headers=_bearer(keys[names[1]])) for u in urls]
    assert [r.status_code for r in refused] == [401, 401]
    assert [r.status_code for r in kept] == [200, 200]
    shown = kept[0].json()["data"][0]
    assert shown["key"] == names[1] and shown["day"]["spent_usd"] == tenants[names[1]].settled_usd
    rows = _logged_rows(log_url)
    assert sorted(r["engine"] for r in rows) == sorted(engines)  # both gateways' requests
    assert main(["stats", "--log", log_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overall"]["counts"]["requests"] == STREAMS
    print(f"cloud answers {engines.count('cloud')}/{STREAMS}; settled ${day.settled_usd:.4f}")


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _logged_rows(url: str) -> list[dict[str, Any]]:
    """The shared decision log's rows once it holds every stream's (each gateway writes a row
    just after its stream ends; waited for, up to a minute)."""
    deadline = time.monotonic() + 60.0
    with RedisDecisionLog(url) as log:
        while len(rows := log.rows()) < STREAMS and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(rows) == STREAMS, len(rows)
    return rows
