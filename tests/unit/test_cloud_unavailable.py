"""A missing or refused API key is configuration, not a passing fault: the cloud engine sends
nothing, says so once (a warning, a `CloudUnavailable` event, the route's reason), routing serves
locally, and a new key (`set_api_key`) brings the cloud back. The endpoint is a fake openai client
(no network); the local engine a `ScriptedEngine`."""

from __future__ import annotations

import logging
import warnings
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import httpx2
import openai
import pytest

from hybridllm import CloudUnavailable, ConfigError, HybridClient, OpenAIEngine, Policy, Route
from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import AuthenticationError, CloudError, CloudUnavailableError
from hybridllm.routing import LiveState, RequestFacts, decide
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py
MSGS = [{"role": "user", "content": "hi"}]
AUTH = "authentication failed (401): check OPENAI_API_KEY or api_key="


class _Stream:
    async def _chunks(self) -> AsyncGenerator[Any, None]:
        delta = SimpleNamespace(content="cloud")
        first = SimpleNamespace(delta=delta, finish_reason=None)
        yield SimpleNamespace(usage=None, choices=[first])
        done = SimpleNamespace(delta=None, finish_reason="stop")
        usage = SimpleNamespace(prompt_tokens=3, completion_tokens=1)
        yield SimpleNamespace(usage=usage, choices=[done])

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        return self._chunks()

    async def close(self) -> None:
        pass


class FakeEndpoint:
    """Stands for `openai.AsyncOpenAI`: accepts only `good_key`, counts what was sent."""

    def __init__(self, api_key: str, good_key: str = "good", status: int = 401) -> None:
        self.api_key = api_key
        self.good_key = good_key
        self.status = status
        self.sent: list[str] = []  # the key of every request that reached the endpoint
        self.chat = SimpleNamespace(
            completions=SimpleNamespace(with_raw_response=SimpleNamespace(create=self.create))
        )

    def with_options(self, *, api_key: str) -> FakeEndpoint:
        self.api_key = api_key  # the same endpoint (and its record), a new key
        return self

    async def create(self, **kwargs: Any) -> Any:
        self.sent.append(self.api_key)
        if self.api_key != self.good_key:
            req = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
            body = {"error": {"message": "Invalid API key"}}
            resp = httpx2.Response(self.status, request=req, json=body)
            raise openai.APIStatusError("Invalid API key", response=resp, body=body)
        return SimpleNamespace(parse=_Stream)

    async def close(self) -> None:
        pass


def cloud_engine(key: str | None, status: int = 401) -> tuple[OpenAIEngine, FakeEndpoint]:
    engine = OpenAIEngine(base_url="http://127.0.0.1:9/v1", api_key=key, model="m")
    fake = FakeEndpoint(key or "", status=status)
    engine._client = fake  # type: ignore[assignment]
    return engine, fake


async def drain(engine: OpenAIEngine) -> list[Any]:
    return [c async for c in engine.stream(GenerationRequest(MSGS))]


# ---- the engine ------------------------------------------------------------------------------


async def test_no_key_sends_nothing_and_says_so_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    engine, fake = cloud_engine(None)
    assert engine.api_key is None  # no placeholder
    assert "OPENAI_API_KEY" in (engine.info().unavailable or "")
    with pytest.warns(RuntimeWarning, match="no API key"):
        await engine.start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: no second warning
        await engine.start()
        with pytest.raises(CloudUnavailableError, match="no API key") as caught:
            await drain(engine)
    err = caught.value
    assert isinstance(err, CloudError) and not isinstance(err, ConfigError)  # one parent
    assert not err.retryable and err.status_code is None
    assert fake.sent == []
    engine.set_api_key("good")
    assert engine.info().unavailable is None
    assert [type(c).__name__ for c in await drain(engine)][-1] == "Finish"
    assert fake.sent == ["good"]


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_stops_the_engine_until_the_key_changes(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hybridllm")
    engine, fake = cloud_engine("wrong-key-3f9a", status=status)
    with pytest.warns(RuntimeWarning, match=rf"authentication failed \({status}\)"):
        with pytest.raises(AuthenticationError):
            await drain(engine)
    assert engine.info().unavailable == AUTH.replace("401", str(status))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # nothing is sent, nothing warned again
            with pytest.raises(CloudUnavailableError) as caught:
                await drain(engine)
    assert caught.value.status_code == status and fake.sent == ["wrong-key-3f9a"]
    said = [r.getMessage() for r in caplog.records if r.name == "hybridllm.engines.openai_engine"]
    assert len(said) == 1 and f"authentication failed ({status})" in said[0]  # logged once
    assert "wrong-key-3f9a" not in said[0]  # never the key
    with pytest.raises(ConfigError):
        engine.set_api_key("  ")
    engine.set_api_key("good")
    await drain(engine)
    assert fake.sent == ["wrong-key-3f9a", "good"] and engine.info().unavailable is None
    engine.set_api_key("bad again")  # a new refusal is said again
    with pytest.warns(RuntimeWarning), pytest.raises(AuthenticationError):
        await drain(engine)


async def test_a_refusal_of_a_replaced_key_does_not_stop_the_new_one() -> None:
    engine, fake = cloud_engine("wrong")
    gen = engine.stream(GenerationRequest(MSGS))
    await gen.__anext__()  # RequestSent: the request holds the old key
    engine.set_api_key("good")
    fake.api_key = "wrong"  # the request in flight was sent with the old key
    with pytest.raises(AuthenticationError):
        await gen.__anext__()
    assert engine.info().unavailable is None


# ---- routing ---------------------------------------------------------------------------------


def test_decide_leaves_an_unavailable_cloud_out_with_the_reason() -> None:
    state = LiveState(unavailable={"cloud": AUTH})
    pol = Policy(name="p", routing={"prefer": "cloud"})
    d = decide(RequestFacts(10, 10), pol, state)
    assert d.primary == "local" and d.fallback is None
    assert "unavailable" in d.codes and d.unavailable == (("cloud", AUTH),)
    forced = decide(RequestFacts(10, 10, forced="cloud"), pol, state)
    assert forced.primary == "cloud" and not forced.unavailable
    alone = decide(RequestFacts(10, 10), pol, LiveState(available=frozenset({"cloud"}),
                                                        unavailable={"cloud": AUTH}))  # fmt: skip
    assert alone.primary == "cloud" and "unavailable_only_engine" in alone.codes
    local_only = decide(
        RequestFacts(10, 10), Policy(name="l", routing={"allow_cloud": False}), state
    )
    assert local_only.primary == "local" and not local_only.unavailable  # no cloud to miss


async def test_the_client_serves_locally_and_says_why_until_the_key_changes() -> None:
    local = ScriptedEngine("local", tokens=["local"])
    cloud, fake = cloud_engine("wrong")
    pol = Policy(name="cloud-first", routing={"prefer": "cloud"})
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
        with pytest.warns(RuntimeWarning, match="authentication failed"):
            async with client.stream("q") as s:
                first = [e async for e in s.events()]
        # the refused request is answered locally (failure before the first token)
        assert s.trace.engine == "local" and fake.sent == ["wrong"]
        assert [e.reason for e in first if isinstance(e, CloudUnavailable)] == [AUTH]
        assert client.breakers["cloud"].state == "closed"  # configuration, not ill health
        for _ in range(2):
            async with client.stream("q") as s:
                events = [e async for e in s.events()]
            kinds = [type(e).__name__ for e in events]
            assert kinds[:2] == ["Route", "CloudUnavailable"], kinds
            route = events[0]
            assert isinstance(route, Route) and route.engine == "local"
            assert f"cloud: {AUTH} -> local" in route.reason
            assert s.trace.started == ("local",)
        assert fake.sent == ["wrong"]  # nothing more was sent
        cloud.set_api_key("good")
        done = await client.complete("q")
        assert done.text == "cloud" and done.trace.engine == "cloud"
        assert not {"unavailable", "unavailable_forced", "unavailable_only_engine"} & set(
            done.trace.reason_codes
        )


async def test_a_forced_cloud_without_a_key_fails_at_once_with_the_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    local = ScriptedEngine("local", tokens=["local"])
    cloud, fake = cloud_engine(None)
    with pytest.warns(RuntimeWarning, match="no API key"):
        client = HybridClient(local=local, cloud=cloud, router=None)
        await client.__aenter__()
    try:
        with pytest.raises(CloudUnavailableError, match="no API key"):
            await client.complete("q", engine="cloud")
        assert (await client.complete("q")).trace.engine == "local"
    finally:
        await client.__aexit__(None, None, None)
    assert fake.sent == []
    # a client with the cloud alone: the typed error, not a placeholder's "Invalid API key"
    lone, _ = cloud_engine(None)
    with pytest.warns(RuntimeWarning):
        async with HybridClient(cloud=lone, router=None) as client:
            with pytest.raises(CloudUnavailableError):
                await client.complete("q")


async def test_a_real_cloud_engine_without_a_key_lets_the_client_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No fake endpoint: the engine's own start() must not build an SDK client that refuses a
    missing key ("Missing credentials"); the client opens and serves locally (issue 24)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    local = ScriptedEngine("local", tokens=["local"])
    cloud = OpenAIEngine(base_url="http://127.0.0.1:9/v1", model="m")
    pol = Policy(name="cloud-first", routing={"prefer": "cloud"})
    with pytest.warns(RuntimeWarning, match="no API key"):
        async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
            async with client.stream("q") as s:
                events = [e async for e in s.events()]
            with pytest.raises(CloudUnavailableError, match="no API key"):
                await client.complete("q", engine="cloud")
    assert s.trace.engine == "local"
    unavailable = [e for e in events if isinstance(e, CloudUnavailable)]
    assert len(unavailable) == 1 and "OPENAI_API_KEY" in unavailable[0].reason
    assert cloud.info().unavailable is not None and len(local.requests) == 1
