"""Two `hybridllm serve` gateway processes share one budget on a Redis ledger (issue 29, part 2).

Each gateway is the real command in its own process (`--ledger redis://...`, `--prices`), over
the real local engine (SmolLM2, one thread) and the stand-in cloud on loopback. 100 streams at
once, 50 through each, under one small daily cap of a cloud-first policy: the two settle at most
the cap together with no overrun and nothing left reserved, and every stream is answered (by the
cloud while the cap covers it, then by the local engine: the policy's `on_exceeded = "local"`).
What the two gateways settle is read back from Redis, not from either gateway. Both also write
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
from hybridllm.guard.budget_redis import RedisLedger
from hybridllm.routing.log_redis import RedisDecisionLog
from hybridllm.testing import HybridServer
from hybridllm.testing.server import free_port
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CAP_USD = 0.05
# the stand-in's price: a worst case (about 40 prompt tokens and max_tokens 4) is about $0.008,
# so the cap covers about six cloud answers of the 100
PRICES = f'[models."{ALIAS}"]\ninput_per_million = 100.0\noutput_per_million = 1000.0\n'
POLICY = (
    '[sampling]\ntemperature = 0.0\nmax_tokens = 4\n[routing]\nprefer = "cloud"\n'
    f'ttft_deadline_ms = 60000\n[budget]\nper_day_usd = {CAP_USD}\non_exceeded = "local"\n'
)
STREAMS = 100


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
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the gateway at {url} did not start")


@pytest.fixture
def gateways(
    model_path: Path, cloud_server: HybridServer, redis_url: str, tmp_path: Path
) -> Iterator[tuple[list[str], str, str]]:
    (tmp_path / "prices.toml").write_text(PRICES)
    (tmp_path / "shared.toml").write_text(POLICY)
    run = uuid.uuid4().hex[:8]
    ledger = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix=gw-{run}"
    dlog = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix=gw-log-{run}"
    started = [_gateway(model_path, cloud_server, ledger, dlog, tmp_path) for _ in range(2)]
    try:
        for url, proc in started:
            _wait_ready(url, proc)
        yield [url for url, _ in started], ledger, dlog
    finally:
        for _, proc in started:
            proc.terminate()
            proc.wait(timeout=30)


async def _stream(http: httpx.AsyncClient, url: str, i: int) -> tuple[int, str | None]:
    """One streamed request: its status and the engine the finish chunk names."""
    body = {
        "model": "hybridllm/shared",
        "stream": True,
        "messages": [{"role": "user", "content": f"Say the number {i} in words."}],
    }
    engine = None
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                extra = json.loads(line[6:]).get("hybridllm") or {}
                engine = extra.get("engine", engine) if "plan" in extra else engine
    return r.status_code, engine


async def test_two_gateways_never_overspend_one_shared_cap(
    gateways: tuple[list[str], str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    urls, ledger_url, log_url = gateways
    results: list[tuple[int, str | None]] = []

    async def one(i: int) -> None:
        results.append(await _stream(http, urls[i % 2], i))

    async with httpx.AsyncClient(timeout=300.0) as http:
        async with anyio.create_task_group() as tg:
            for i in range(STREAMS):
                tg.start_soon(one, i)
    assert [status for status, _ in results] == [200] * STREAMS  # none lost, none refused
    engines = [engine for _, engine in results]
    assert None not in engines, engines  # each stream ended with its decision
    assert 0 < engines.count("cloud") < STREAMS, engines  # the cap cut the cloud off
    with RedisLedger(ledger_url) as ledger:
        day = ledger.spend("day")
    assert day.settled_usd <= CAP_USD and day.overrun_usd == 0.0, day
    assert day.reserved_usd == 0.0, day  # every reservation settled or released
    assert day.settled_usd > 0.0
    rows = _logged_rows(log_url)
    assert sorted(r["engine"] for r in rows) == sorted(engines)  # both gateways' requests
    assert main(["stats", "--log", log_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overall"]["counts"]["requests"] == STREAMS
    print(f"cloud answers {engines.count('cloud')}/{STREAMS}; settled ${day.settled_usd:.4f}")


def _logged_rows(url: str) -> list[dict[str, Any]]:
    """The shared decision log's rows once it holds every stream's (each gateway writes a row
    just after its stream ends; waited for, up to a minute)."""
    deadline = time.monotonic() + 60.0
    with RedisDecisionLog(url) as log:
        while len(rows := log.rows()) < STREAMS and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(rows) == STREAMS, len(rows)
    return rows
