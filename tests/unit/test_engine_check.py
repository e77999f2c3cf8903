"""A cloud that is not there says so (issue 42, item 2): `OpenAIEngine.check()` against a real
HTTP endpoint on loopback (its `/v1/models`), `HybridClient.check()` over every engine, the
gateway's /healthz from what the check found ("degraded" with the cause, 503 when no engine
can serve), and `hybridllm doctor --cloud-url --cloud-model`."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hybridllm import HybridClient, OpenAIEngine, Policy
from hybridllm.cli.main import build_parser
from hybridllm.engines.capabilities import EngineCheck
from hybridllm.errors import AuthenticationError, CloudConnectionError, InvalidArgumentError
from hybridllm.gateway.app import create_app
from hybridllm.gateway.command import checked_lines
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.testing import ScriptedEngine
from tests.unit.models_endpoint import Models

pytestmark = pytest.mark.anyio


DOWN = "http://127.0.0.1:9/v1"  # nothing listens on port 9 (discard)


async def test_an_endpoint_that_answers_with_the_model(endpoint: tuple[str, type[Models]]) -> None:
    url, _ = endpoint
    found = await OpenAIEngine(base_url=url, api_key="k", model="smol").check(2.0)
    assert (found.reachable, found.key_accepted, found.model_found) == (True, True, True)
    assert found.serves and found.error is None
    other = await OpenAIEngine(base_url=url, api_key="k", model="gpt-x").check(2.0)
    assert other.model_found is False and not other.serves


async def test_the_context_the_endpoint_lists_becomes_the_engines_context(
    endpoint: tuple[str, type[Models]],
) -> None:
    """vLLM's model list gives `max_model_len` (documented shape, not a real vLLM here): once
    checked, routing knows the cloud's context (issue 42 item 1), unless `max_context` says."""
    url, handler = endpoint
    handler.entry = {"max_model_len": 8192, "owned_by": "vllm"}
    engine = OpenAIEngine(base_url=url, api_key="k", model="smol")
    assert engine.info().n_ctx is None
    await engine.check(2.0)
    assert engine.info().n_ctx == 8192 and engine.context == 8192
    given = OpenAIEngine(base_url=url, api_key="k", model="smol", max_context=4096)
    await given.check(2.0)
    assert given.info().n_ctx == 4096


async def test_a_refused_key_stops_the_engine_as_a_refused_request_would(
    endpoint: tuple[str, type[Models]],
) -> None:
    url, handler = endpoint
    handler.status = 401
    engine = OpenAIEngine(base_url=url, api_key="wrong", model="smol")
    with pytest.warns(RuntimeWarning):
        found = await engine.check(2.0)
    assert (found.reachable, found.key_accepted, found.error) == (True, False, AuthenticationError)
    assert engine.info().unavailable is not None  # routing leaves it out, CloudUnavailable says so


async def test_an_endpoint_that_refuses_connections_is_unreachable() -> None:
    found = await OpenAIEngine(base_url=DOWN, api_key="k", model="m").check(2.0)
    assert found.reachable is False and found.error is CloudConnectionError and not found.serves


async def test_no_key_is_found_without_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    found = await OpenAIEngine(base_url=DOWN, model="m").check(2.0)
    assert found.key_accepted is False and found.reachable is None


async def test_the_client_checks_every_engine_with_its_circuit() -> None:
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    cloud.check_result = EngineCheck(False, None, None, "unreachable", CloudConnectionError)
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        with pytest.raises(InvalidArgumentError):
            await client.check(timeout_s=0)
        states = await client.check()
    assert states["local"].serves and states["local"].circuit == "closed"
    assert not states["cloud"].serves and states["cloud"].check.reachable is False
    assert client.last_check == states
    assert "NOT SERVING" in checked_lines(states)  # the wording is the subject (the banner)


@pytest.mark.parametrize(
    ("cloud_up", "status", "code"), [(True, "ok", 200), (False, "degraded", 200)]
)
async def test_healthz_says_what_the_check_found(cloud_up: bool, status: str, code: int) -> None:
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    if not cloud_up:
        cloud.check_result = EngineCheck(False, None, None, "unreachable", CloudConnectionError)
    got = await _healthz(HybridClient(local=local, cloud=cloud, router=None))
    assert (got.status_code, got.json()["status"]) == (code, status)
    engines = got.json()["engines"]
    assert engines["cloud"]["reachable"] is cloud_up and engines["local"]["cause"] is None
    assert (engines["cloud"]["cause"] is None) is cloud_up


async def test_healthz_is_503_when_no_engine_can_serve() -> None:
    cloud = ScriptedEngine("cloud", tokens=["c"])
    cloud.check_result = EngineCheck(True, False, None, "key refused", AuthenticationError)
    got = await _healthz(HybridClient(cloud=cloud, router=None))
    assert (got.status_code, got.json()["status"]) == (503, "unavailable")
    assert got.json()["engines"]["cloud"]["key_accepted"] is False


async def _healthz(client: HybridClient) -> httpx.Response:
    app = create_app(client, GatewayLimits())
    async with client:
        await client.check()  # what the gateway's lifespan does at start
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as h:
            return await h.get("/healthz")


def test_doctor_checks_the_model_at_the_cloud_url(
    endpoint: tuple[str, type[Models]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = endpoint
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    from hybridllm.cli.doctor import Doctor

    assert Doctor(base_url=url, model="smol").cloud().status == "ok"
    assert Doctor(base_url=url, model="gpt-x").cloud().status == "fail"
    args = build_parser().parse_args(["doctor", "--cloud-url", url, "--cloud-model", "gpt-x"])
    assert (args.base_url, args.cloud_model) == (url, "gpt-x")  # what cmd_doctor hands Doctor


@pytest.mark.virtual_clock
async def test_an_unreachable_cloud_is_said_once_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The local engine answers (a plain `async for` sees only its text); the log says once
    that the cloud could not be reached, and again only after the cloud has answered."""
    local = ScriptedEngine("local", tokens=["l"])
    cloud = ScriptedEngine("cloud", script=[CloudConnectionError("connection refused")] * 2)
    policy = Policy(name="c", routing={"prefer": "cloud", "retries": 0})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=policy) as client:
        texts = [await client.complete("q") for _ in range(2)]
    # the log line is for people: its words are the subject here
    said = [r for r in caplog.records if r.levelname == "WARNING" and "unreachable" in r.message]
    assert [t.text for t in texts] == ["l", "l"] and len(said) == 1
