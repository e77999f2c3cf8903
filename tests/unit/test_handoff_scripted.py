"""The handoff plan with `ScriptedEngine` doubles: timing and bookkeeping only (the real engines
are in tests/integration/test_handoff.py). The local engine starts; after `handoff_after_tokens`
it stops and the cloud continues from exactly the text delivered, or, when it cannot, the local
engine resumes from that text with no seam. (The scripted double replays its whole script for a
continuation: what the tests judge is the prefix each continuation request carries.) They run on
the virtual clock (tests/unit/conftest.py): the trace's times are the scripts' own."""

from __future__ import annotations

import pytest

from hybridllm import Fallback, Handoff, HybridClient, Policy, Token
from hybridllm.errors import AllEnginesFailedError, CloudConnectionError, LocalEngineError
from hybridllm.events import Event
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

LOCAL = ["A", "B", "C", "D", "E", "F", "G"]
POLICY = Policy(
    name="h",
    routing={"prefer": "local", "stall_ms": 300, "retries": 0},
    handoff={"after_tokens": 2},
)


def reset() -> CloudConnectionError:
    return CloudConnectionError("connection reset", received_content=True)


async def run(local: ScriptedEngine, cloud: ScriptedEngine) -> tuple[list[Event], str, object]:
    async with HybridClient(local=local, cloud=cloud, policy=POLICY, router=None) as client:
        async with client.stream("write", plan="handoff") as s:
            events = [e async for e in s.events()]
        assert local.active == 0 and cloud.active == 0  # nothing left running
    text = "".join(e.text for e in events if isinstance(e, Token))
    return events, text, s.trace


async def test_scripted_timing_cloud_takes_over_at_the_seam() -> None:
    local = ScriptedEngine("local", tokens=LOCAL, ttft_s=0.02, tpot_s=0.03)
    cloud = ScriptedEngine("cloud", script=[0.06, "x", 0.001, "y", 0.001, "z"])
    events, text, trace = await run(local, cloud)
    assert text == "ABxyz"
    assert local.emitted == 2  # stopped at T0: it decoded nothing while the cloud was asked
    assert cloud.requests[0].assistant_prefix == "AB"
    assert cloud.requests[0].max_tokens == POLICY.sampling.max_tokens - 2
    who = [e.engine for e in events if isinstance(e, Token)]
    assert who == ["local", "local", "cloud", "cloud", "cloud"]
    hand = [e for e in events if isinstance(e, Handoff)]
    assert len(hand) == 1 and (hand[0].chars, hand[0].tokens) == (2, 2)
    rec = trace.handoff  # type: ignore[attr-defined]
    assert rec.outcome == "switched" and rec.local_chars == 2 and rec.switched_t > rec.asked_t
    assert trace.engine == "cloud"  # type: ignore[attr-defined]
    assert trace.ttft_ms == pytest.approx(20)  # type: ignore[attr-defined]
    assert "handoff_asked" in trace.reason_codes  # type: ignore[attr-defined]


async def test_scripted_timing_cloud_failure_before_its_token_local_continues() -> None:
    local = ScriptedEngine("local", tokens=LOCAL, ttft_s=0.01, tpot_s=0.02)
    cloud = ScriptedEngine("cloud", script=[0.02, CloudConnectionError("refused")])
    events, text, trace = await run(local, cloud)
    assert text == "ABCDEFG" and not any(isinstance(e, Handoff) for e in events)  # continued
    assert local.requests[1].assistant_prefix == "AB"  # resumed from T0
    assert {e.engine for e in events if isinstance(e, Token)} == {"local"}
    assert trace.handoff.outcome == "cloud_failed"  # type: ignore[attr-defined]
    assert trace.engine == "local"  # type: ignore[attr-defined]


async def test_scripted_timing_a_cloud_too_slow_is_given_up() -> None:
    local = ScriptedEngine("local", tokens=LOCAL, ttft_s=0.01, tpot_s=0.1)
    cloud = ScriptedEngine("cloud", script=[3.0, "late"])
    events, text, trace = await run(local, cloud)
    assert text == "ABCDEFG" and local.requests[1].assistant_prefix == "AB"
    assert trace.handoff.outcome == "cloud_too_slow"  # type: ignore[attr-defined]
    assert cloud.closed_streams == 1


async def test_scripted_timing_cloud_failing_mid_answer_moves_back_to_local() -> None:
    local = ScriptedEngine("local", tokens=LOCAL, ttft_s=0.01, tpot_s=0.03)
    cloud = ScriptedEngine("cloud", script=[0.02, "x", 0.01, reset()])
    events, text, trace = await run(local, cloud)
    # the scripted double replays its script for the continuation: what matters is the prefix
    assert text == "ABx" + "".join(LOCAL)
    assert local.requests[1].assistant_prefix == "ABx"
    assert any(isinstance(e, Handoff) for e in events)
    (fb, *_) = [e for e in events if isinstance(e, Fallback)]
    assert fb.from_engine == "cloud" and fb.cause == "mid_stream"
    assert trace.engine == "local" and trace.switches[0].delivered_chars == 3


async def test_scripted_timing_local_failure_before_the_handoff_asks_the_cloud_at_once() -> None:
    local = ScriptedEngine("local", script=[0.01, "A", LocalEngineError("oops", engine="local")])
    cloud = ScriptedEngine("cloud", script=[0.01, "x", "y"])
    events, text, trace = await run(local, cloud)
    assert text == "Axy" and cloud.requests[0].assistant_prefix == "A"


async def test_scripted_timing_both_failing_is_all_engines_failed() -> None:
    local = ScriptedEngine(
        "local", script=[0.01, "A", 0.01, "B", 0.05, LocalEngineError("oops", engine="local")]
    )
    cloud = ScriptedEngine("cloud", script=[0.1, CloudConnectionError("refused")])
    async with HybridClient(local=local, cloud=cloud, policy=POLICY, router=None) as client:
        with pytest.raises(AllEnginesFailedError) as err:
            await client.complete("write", plan="handoff")
    assert err.value.received_content


async def test_scripted_timing_a_local_engine_past_the_deadline_hands_off_at_once() -> None:
    local = ScriptedEngine("local", tokens=LOCAL, ttft_s=0.5, tpot_s=0.01)
    cloud = ScriptedEngine("cloud", script=[0.02, "x", "y"])
    policy = POLICY.with_(routing={"ttft_deadline_ms": 100.0})
    async with HybridClient(local=local, cloud=cloud, policy=policy, router=None) as client:
        res = await client.complete("write", plan="handoff")
        assert local.active == 0 and local.emitted == 0
    assert res.text == "xy" and cloud.requests[0].assistant_prefix == ""
    assert res.trace.handoff is not None and res.trace.handoff.local_chars == 0
    assert res.trace.ttft_ms == pytest.approx(100 + 20)  # asked at the deadline


async def warm_run(warm_s: float) -> tuple[ScriptedEngine, ScriptedEngine, list[Event], str]:
    local = ScriptedEngine("local", tokens=LOCAL, ttft_s=0.05, tpot_s=0.1)
    cloud = ScriptedEngine("cloud", script=[warm_s, "x", 0.001, "y", 0.001, "z"])
    policy = Policy(
        name="h",
        routing={"prefer": "local", "stall_ms": 900},
        handoff={"after_tokens": 4, "warm_cloud": True},
    )
    async with HybridClient(local=local, cloud=cloud, policy=policy, router=None) as client:
        async with client.stream("write", plan="handoff") as s:
            events = [e async for e in s.events()]
        assert local.active == 0 and cloud.active == 0
    rec = s.trace.handoff
    assert s.trace.started == ("local", "cloud") and rec is not None and rec.outcome == "switched"
    return local, cloud, events, "".join(e.text for e in events if isinstance(e, Token))


async def test_scripted_timing_a_warm_cloud_is_asked_for_the_prompt_at_once() -> None:
    """`handoff_warm_cloud`: one token of the prompt is asked of the cloud at t=0 (its prefix
    cache then holds the prompt; its answer is dropped). It answers before the first local
    token, so the cloud continues from that token (not after `handoff_after_tokens`)."""
    local, cloud, events, text = await warm_run(warm_s=0.01)
    warm, cont = cloud.requests
    assert warm.max_tokens == 1 and warm.assistant_prefix == ""
    assert warm.messages[-1] == {"role": "user", "content": "write"}
    assert cont.assistant_prefix == "A" and text == "Axyz" and local.emitted == 1
    assert [e.engine for e in events if isinstance(e, Token)] == ["local"] + ["cloud"] * 3


async def test_scripted_timing_the_local_part_lasts_until_the_cloud_is_warm() -> None:
    """The warm-up answers between the second and the third local token: the cloud is asked at
    once, to continue from the two tokens out; one that never answers in time leaves the local
    part at `handoff_after_tokens`."""
    local, cloud, events, text = await warm_run(warm_s=0.2)
    assert cloud.requests[1].assistant_prefix == "AB" and text == "ABxyz" and local.emitted == 2
    _, slow_cloud, _, slow_text = await warm_run(warm_s=0.6)  # never ready in time
    assert slow_cloud.requests[1].assistant_prefix == "ABCD" and slow_text == "ABCDxyz"


def test_the_warm_cloud_flag_is_a_checked_bool() -> None:
    from hybridllm.errors import PolicyError

    with pytest.raises(PolicyError) as info:
        Policy(name="h", handoff={"warm_cloud": "yes"})  # type: ignore[arg-type]
    assert info.value.field == "handoff.warm_cloud"
