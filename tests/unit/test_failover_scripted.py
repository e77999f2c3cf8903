"""Mid-stream failover with `ScriptedEngine` doubles: the answer continues on the other engine
from the delivered text (timing and bookkeeping only; the real engines are in the integration
tests)."""

from __future__ import annotations

import anyio
import pytest

from hybridllm import EngineError, Fallback, HybridClient, Policy, Switch, Token
from hybridllm.errors import AllEnginesFailedError, CloudConnectionError, StallError
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

CLOUDY = Policy(name="cloudy", routing={"prefer": "cloud"})


def reset() -> CloudConnectionError:
    return CloudConnectionError("connection reset", received_content=True)


async def test_reset_mid_stream_continues_on_the_local_engine() -> None:
    cloud = ScriptedEngine("cloud", script=["Hel", 0.01, "lo", reset()])
    local = ScriptedEngine("local", tokens=["!", " Bye"])
    async with HybridClient(local=local, cloud=cloud, policy=CLOUDY) as client:
        async with client.stream("greet me") as s:
            events = [e async for e in s.events()]
    text = "".join(e.text for e in events if isinstance(e, Token))
    assert text == "Hello! Bye"
    assert [e.engine for e in events if isinstance(e, Token)] == ["cloud"] * 2 + ["local"] * 2
    assert local.requests[0].assistant_prefix == "Hello"
    assert list(local.requests[0].messages) == list(cloud.requests[0].messages)
    fb = [e for e in events if isinstance(e, Fallback)]
    assert len(fb) == 1 and (fb[0].from_engine, fb[0].to_engine) == ("cloud", "local")
    assert fb[0].cause == "mid_stream"
    tr = s.trace
    assert tr.engine == "local" and tr.started == ("cloud", "local")
    (switch,) = tr.switches
    assert isinstance(switch, Switch) and (switch.from_engine, switch.to_engine) == (
        "cloud",
        "local",
    )
    assert switch.delivered_chars == len("Hello") and tr.n_tokens == 4
    assert switch.error_type is CloudConnectionError and switch.reason == "connection reset"


async def test_the_continuation_asks_only_for_what_is_left_of_max_tokens() -> None:
    cloud = ScriptedEngine("cloud", script=["a", "b", "c", reset()])
    local = ScriptedEngine("local", tokens=["d"] * 20)
    async with HybridClient(local=local, cloud=cloud, policy=CLOUDY) as client:
        res = await client.complete("q", max_tokens=10)
    assert cloud.requests[0].max_tokens == 10 and local.requests[0].max_tokens == 7
    assert res.text.startswith("abc")


async def test_stall_past_the_limit_moves_the_answer() -> None:
    cloud = ScriptedEngine("cloud", script=["a", 5.0, "never"])
    local = ScriptedEngine("local", tokens=["b"])
    policy = Policy(name="s", routing={"prefer": "cloud", "stall_ms": 100})
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        res = await client.complete("q")
        assert cloud.active == 0  # the stalled stream was closed
    # no token for 100 ms after "a" (at 0 ms): the answer moved at 100 ms
    assert res.text == "ab" and res.trace.token_times[0] == pytest.approx(res.trace.t_start)
    assert res.trace.switches[0].at - res.trace.t_start == pytest.approx(0.1)
    assert res.trace.switches[0].error_type is StallError
    itl = res.trace.itl_ms
    assert len(itl) == 1 and 95 <= itl[0] < 400


async def test_without_a_backup_the_error_keeps_what_was_delivered() -> None:
    cloud = ScriptedEngine("cloud", script=["par", "tial", reset()])
    local = ScriptedEngine("local", tokens=["x"])
    private_ish = Policy(name="p", routing={"prefer": "cloud", "ttft_deadline_ms": None})
    got: list[str] = []
    async with HybridClient(cloud=cloud, policy=private_ish) as client:
        with pytest.raises(CloudConnectionError):
            async for tok in client.stream("q"):
                got.append(tok)
    assert "".join(got) == "partial" and not local.requests


async def test_failover_happens_once() -> None:
    cloud = ScriptedEngine("cloud", script=["one ", reset()])
    local = ScriptedEngine("local", script=["two ", 0.01, StallError("x", engine="local")])
    async with HybridClient(local=local, cloud=cloud, policy=CLOUDY) as client:
        got: list[str] = []
        with pytest.raises(AllEnginesFailedError) as info:
            async for tok in client.stream("q"):
                got.append(tok)
    assert "".join(got) == "one two "
    assert [a[0] for a in info.value.attempts] == ["cloud", "local"]
    assert info.value.received_content


async def test_a_stall_is_a_typed_engine_error_in_the_tree() -> None:
    """Both engines stall: the app gets every attempt, each a `StallError` (an `EngineError`
    that had delivered content, so not retryable)."""
    cloud = ScriptedEngine("cloud", script=["a", 5.0, "never"])
    local = ScriptedEngine("local", script=["b", 5.0, "never"])
    policy = Policy(name="s", routing={"prefer": "cloud", "stall_ms": 50})
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        with pytest.raises(AllEnginesFailedError) as info:
            await client.complete("q")
    stalls = [exc for _, exc, _ in info.value.attempts]
    assert [type(e) for e in stalls] == [StallError, StallError]
    assert all(isinstance(e, EngineError) and e.received_content for e in stalls)
    assert not any(e.retryable for e in stalls if isinstance(e, StallError))
    assert [e.engine for e in stalls if isinstance(e, StallError)] == ["cloud", "local"]
    assert StallError("quiet", engine="local").retryable  # nothing delivered yet


async def test_a_single_engine_that_stalls_ends_with_a_stall_error_keeping_its_text() -> None:
    """No other engine to move to (the single plan): the silence past `stall_ms` is a typed
    StallError after the text already delivered, not a wait bounded only by HTTP timeouts."""
    cloud = ScriptedEngine("cloud", script=["a", 5.0, "never"])
    policy = Policy(name="s", routing={"prefer": "cloud", "stall_ms": 100})
    got: list[str] = []
    async with HybridClient(cloud=cloud, policy=policy) as client:
        t0 = anyio.current_time()
        with pytest.raises(StallError) as info:
            async for token in client.stream("q"):
                got.append(token)
        waited = anyio.current_time() - t0
        assert cloud.active == 0  # the stalled stream was closed
    assert got == ["a"] and info.value.received_content and not info.value.retryable
    assert waited == pytest.approx(0.1) and "no token for 100 ms" in str(info.value)
