"""Unit tests of the client/stream orchestration with `ScriptedEngine` (a scripted test double).

These check timing logic, event order and cleanup; the real engines are covered by the
integration tests. They run on the virtual clock (tests/unit/conftest.py): the trace's figures
are the script's own times, exactly.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from hybridllm import (
    ClientStateError,
    ConfigError,
    Done,
    HybridClient,
    Policy,
    RefusedError,
    Route,
    Token,
    Usage,
)
from hybridllm.errors import CloudConnectionError, InternalError
from hybridllm.events import DeadlineMissed
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]


def scripted_local(**kw: object) -> ScriptedEngine:
    return ScriptedEngine("local", **kw)  # type: ignore[arg-type]


async def test_ttft_tpot_and_gaps_follow_the_script() -> None:
    engine = scripted_local(tokens=["a", "b", "c", "d"], ttft_s=0.1, tpot_s=0.03)
    async with HybridClient(local=engine) as client:
        s = client.stream("hi")
        assert [t async for t in s] == ["a", "b", "c", "d"]
    tr = s.trace
    assert tr.ttft_ms == pytest.approx(100)
    assert tr.itl_ms == pytest.approx([30, 30, 30])
    assert tr.tpot_ms == pytest.approx(30) and tr.total_ms == pytest.approx(190)
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
    assert s.trace.ttft_ms == pytest.approx(100)  # the empty delta at 50 ms is no token


async def test_ttft_counts_from_the_stream_call() -> None:
    engine = scripted_local(tokens=["a"], ttft_s=0.05)
    async with HybridClient(local=engine) as client:
        s = client.stream("hi")
        await anyio.sleep(0.2)  # the app is slow to start iterating: the request already ran
        assert [t async for t in s] == ["a"]
    assert s.trace.ttft_ms == pytest.approx(50)  # when the token came, not when it was read


async def test_break_closes_the_engine_stream() -> None:
    engine = scripted_local(tokens=["t"] * 100, tpot_s=0.01)
    async with HybridClient(local=engine) as client:
        async for _ in client.stream("hi"):
            break
        await anyio.sleep(0.02)
        assert engine.closed_streams == 1 and engine.active == 0
        assert engine.emitted == 1  # stopped before its next token, due 10 ms later


async def test_cancelled_consumer_closes_the_engine_stream() -> None:
    engine = scripted_local(tokens=["t"] * 100, tpot_s=0.01)
    async with HybridClient(local=engine) as client:
        with anyio.move_on_after(0.055):  # tokens at 0, 10, ..., 50 ms; then the cancel
            async for _ in client.stream("hi"):
                pass
        await anyio.sleep(0.02)
        assert engine.active == 0 and engine.emitted == 6


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
        with pytest.raises(RefusedError, match="device"):  # a refusal, not a config error
            await client.complete("hi", policy="private", engine="cloud")
    async with HybridClient(cloud=ScriptedEngine("cloud", tokens=["c"])) as client:
        with pytest.raises(RefusedError):
            await client.complete("hi", policy="private")


async def test_policy_defaults_apply_and_arguments_override() -> None:
    engine = scripted_local(tokens=["a"])
    async with HybridClient(local=engine, policy="code-completion") as client:
        await client.complete("hi")
        await client.complete("hi", max_tokens=5)
    assert engine.requests[0].max_tokens == 64
    assert engine.requests[1].max_tokens == 5


async def test_unexpected_engine_bug_reaches_the_app_typed_and_the_client_survives() -> None:
    broken = ScriptedEngine("cloud", script=["one", ValueError("engine bug")])
    local = scripted_local(tokens=["fine"])
    async with HybridClient(local=local, cloud=broken) as client:
        with pytest.raises(InternalError) as caught:  # a HybridError, its cause the bug's
            await client.complete("hi", engine="cloud")
        assert isinstance(caught.value.__cause__, ValueError) and caught.value.received_content
        assert (await client.complete("hi", engine="local")).text == "fine"


# ---- a missed first-token deadline is said (issue 24) ---------------------------------------


def _late_pair() -> dict[str, ScriptedEngine]:
    return {
        "local": scripted_local(tokens=["a", "b"], ttft_s=0.05),
        "cloud": ScriptedEngine("cloud", tokens=["c", "d"], ttft_s=0.05),
    }


@pytest.mark.parametrize(
    ("engines", "plan"),
    [(("local",), None), (("local", "cloud"), None), (("local", "cloud"), "handoff")],
)
async def test_a_first_token_after_the_deadline_is_an_event_and_on_the_trace(
    engines: tuple[str, ...], plan: str | None
) -> None:
    pair = _late_pair()
    pol = Policy(
        name="late", routing={"prefer": "local", "ttft_deadline_ms": 1}, handoff={"after_tokens": 1}
    )
    chosen: dict[str, Any] = {k: pair[k] for k in engines}
    client = HybridClient(**chosen, policy=pol, router=None)
    async with client, client.stream("hi", plan=plan) as s:  # type: ignore[arg-type]
        events = [e async for e in s.events()]
    kinds = [type(e).__name__ for e in events]
    assert kinds.count("DeadlineMissed") == 1
    assert kinds.index("DeadlineMissed") == kinds.index("Token") - 1  # just before the first
    missed = events[kinds.index("DeadlineMissed")]
    assert isinstance(missed, DeadlineMissed) and missed.deadline_ms == 1
    assert missed.engine == events[kinds.index("Token")].engine  # type: ignore[attr-defined]
    assert s.trace.deadline_missed_ms == missed.late_ms and missed.late_ms > 0


@pytest.mark.parametrize("deadline_ms", [None, 60_000.0])
async def test_a_first_token_in_time_or_without_a_deadline_says_nothing(
    deadline_ms: float | None,
) -> None:
    pol = Policy(name="calm", routing={"ttft_deadline_ms": deadline_ms})
    async with HybridClient(local=scripted_local(tokens=["a"]), policy=pol) as client:
        async with client.stream("hi") as s:
            kinds = [type(e).__name__ for e in [e async for e in s.events()]]
    assert "Token" in kinds and "DeadlineMissed" not in kinds
    assert s.trace.deadline_missed_ms is None
