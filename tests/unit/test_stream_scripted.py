"""Unit tests of the client/stream orchestration with `ScriptedEngine` (a scripted test double).

These check timing logic, event order and cleanup; the real engines are covered by the
integration tests.
"""

from __future__ import annotations

import anyio
import pytest

from hybridllm import (
    ClientStateError,
    CloudConnectionError,
    ConfigError,
    Done,
    HybridClient,
    Policy,
    PolicyError,
    Route,
    ScriptedEngine,
    Token,
    Usage,
)

pytestmark = pytest.mark.anyio


def scripted_local(**kw: object) -> ScriptedEngine:
    return ScriptedEngine("local", **kw)  # type: ignore[arg-type]


async def test_ttft_tpot_and_gaps_follow_the_script() -> None:
    engine = scripted_local(tokens=["a", "b", "c", "d"], ttft_s=0.1, tpot_s=0.03)
    async with HybridClient(local=engine) as client:
        s = client.stream("hi")
        assert [t async for t in s] == ["a", "b", "c", "d"]
    tr = s.trace
    assert tr.ttft_ms is not None and 95 <= tr.ttft_ms < 200
    assert len(tr.itl_ms) == 3 and all(25 <= g < 120 for g in tr.itl_ms)
    assert tr.tpot_ms is not None and 25 <= tr.tpot_ms < 120
    assert tr.engine == "local" and tr.finish_reason == "stop"
    assert tr.completion_tokens == 4


async def test_events_in_order() -> None:
    engine = scripted_local(tokens=["x", "y"])
    async with HybridClient(local=engine) as client, client.stream("hi") as s:
        kinds = [type(e) async for e in s.events()]
    assert kinds == [Route, Token, Token, Usage, Done]


async def test_empty_deltas_are_not_tokens() -> None:
    engine = scripted_local(script=[0.05, "", 0.05, "real"])
    async with HybridClient(local=engine) as client:
        s = client.stream("hi")
        assert [t async for t in s] == ["real"]
    assert s.trace.ttft_ms is not None and s.trace.ttft_ms >= 95


async def test_ttft_counts_from_the_stream_call() -> None:
    engine = scripted_local(tokens=["a"], ttft_s=0.05)
    async with HybridClient(local=engine) as client:
        s = client.stream("hi")
        await anyio.sleep(0.2)  # the app is slow to start iterating: the request already ran
        assert [t async for t in s] == ["a"]
    assert s.trace.ttft_ms is not None and s.trace.ttft_ms < 150


async def test_break_closes_the_engine_stream() -> None:
    engine = scripted_local(tokens=["t"] * 100, tpot_s=0.01)
    async with HybridClient(local=engine) as client:
        async for _ in client.stream("hi"):
            break
        await anyio.sleep(0.02)
        assert engine.closed_streams == 1 and engine.active == 0
        assert engine.emitted < 10


async def test_cancelled_consumer_closes_the_engine_stream() -> None:
    engine = scripted_local(tokens=["t"] * 100, tpot_s=0.01)
    async with HybridClient(local=engine) as client:
        with anyio.move_on_after(0.05):
            async for _ in client.stream("hi"):
                pass
        await anyio.sleep(0.02)
        assert engine.active == 0 and engine.emitted < 20


async def test_async_with_waits_for_the_engine_to_let_go() -> None:
    engine = scripted_local(tokens=["t"] * 100, tpot_s=0.01)
    async with HybridClient(local=engine) as client:
        async with client.stream("hi") as s:
            await s.__anext__()
        assert engine.active == 0


async def test_closing_the_client_stops_open_streams() -> None:
    engine = scripted_local(tokens=["t"] * 100, tpot_s=0.01)
    async with HybridClient(local=engine) as client:
        s = client.stream("hi")
        await s.__anext__()
    assert engine.active == 0
    assert engine.started is False


async def test_engine_error_reaches_the_app_after_delivered_tokens() -> None:
    boom = CloudConnectionError("reset by peer", received_content=True)
    engine = ScriptedEngine("cloud", script=["one", 0.01, "two", boom])
    got: list[str] = []
    async with HybridClient(cloud=engine) as client:
        s = client.stream("hi")
        with pytest.raises(CloudConnectionError):
            async for tok in s:
                got.append(tok)
    assert got == ["one", "two"]
    assert s.trace.error_type is CloudConnectionError
    assert s.trace.error == "CloudConnectionError: reset by peer"


async def test_not_open_client_is_a_typed_error() -> None:
    client = HybridClient(local=scripted_local(tokens=["a"]))
    with pytest.raises(ClientStateError, match="async with"):
        client.stream("hi")


async def test_events_only_once() -> None:
    async with HybridClient(local=scripted_local(tokens=["a"])) as client:
        async with client.stream("hi") as s:
            s.events()
            with pytest.raises(ClientStateError):
                s.events()


@pytest.mark.parametrize(
    "messages",
    [[], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 3}], ["hello"]],
)
async def test_malformed_messages_are_config_errors(messages: object) -> None:
    async with HybridClient(local=scripted_local(tokens=["a"])) as client:
        with pytest.raises(ConfigError):
            client.stream(messages)  # type: ignore[arg-type]


async def test_bad_generation_parameters_are_config_errors() -> None:
    async with HybridClient(local=scripted_local(tokens=["a"])) as client:
        with pytest.raises(ConfigError):
            client.stream("hi", max_tokens=0)
        with pytest.raises(ConfigError):
            client.stream("hi", engine="gpu")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="no cloud engine"):
            client.stream("hi", engine="cloud")


async def test_request_parameters_reach_the_engine() -> None:
    engine = scripted_local(tokens=["a"])
    async with HybridClient(local=engine) as client:
        await client.complete("hi", max_tokens=7, temperature=0.0, top_p=0.5, stop="END", seed=3)
    req = engine.requests[0]
    assert (req.max_tokens, req.temperature, req.top_p, req.stop, req.seed) == (
        7,
        0.0,
        0.5,
        ("END",),
        3,
    )
    assert list(req.messages) == [{"role": "user", "content": "hi"}]


async def test_policy_preference_and_private_mode() -> None:
    local, cloud = scripted_local(tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    async with HybridClient(local=local, cloud=cloud) as client:
        assert (await client.complete("hi", policy="long-writing")).trace.engine == "cloud"
        assert (await client.complete("hi", policy="code-completion")).trace.engine == "local"
        assert (
            await client.complete("hi", policy=Policy(routing={"prefer": "cloud"}))
        ).trace.engine == "cloud"
        with pytest.raises(PolicyError, match="device"):
            client.stream("hi", policy="private", engine="cloud")
    async with HybridClient(cloud=ScriptedEngine("cloud", tokens=["c"])) as client:
        with pytest.raises(PolicyError):
            client.stream("hi", policy="private")


async def test_policy_defaults_apply_and_arguments_override() -> None:
    engine = scripted_local(tokens=["a"])
    async with HybridClient(local=engine, policy="code-completion") as client:
        await client.complete("hi")
        await client.complete("hi", max_tokens=5)
    assert engine.requests[0].max_tokens == 64
    assert engine.requests[1].max_tokens == 5


async def test_unexpected_engine_bug_reaches_the_app_and_the_client_survives() -> None:
    broken = ScriptedEngine("cloud", script=["one", ValueError("engine bug")])
    local = scripted_local(tokens=["fine"])
    async with HybridClient(local=local, cloud=broken) as client:
        with pytest.raises(ValueError, match="engine bug"):
            await client.complete("hi", engine="cloud")
        assert (await client.complete("hi", engine="local")).text == "fine"
