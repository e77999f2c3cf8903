"""The seam check (issue 43, item 2): a continuation's first text is held until the seam can be
judged; an overlap with the delivered tail is cut, a whole restart is cut back to the seam, a
restart that leaves the delivered text or a stop at once mid-sentence is a failed continuation
(`ContinuationError`), and `Trace.seams` says what was cut. `judge` is pure; the client runs
scripted engines on the virtual clock (orchestration only)."""

from __future__ import annotations

import pytest

from hybridllm import HybridClient, Policy, Token
from hybridllm.errors import ContinuationError, LocalEngineError
from hybridllm.runtime.seam import decided, judge
from hybridllm.runtime.trace import Trace
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py


@pytest.mark.parametrize(
    ("delivered", "start", "verdict"),
    [
        ("Lighthouses were", " were painted in", ("overlap", 5)),
        ("Lighthouses were", "were painted in", ("overlap", 4)),
        ("The red and white", " and white stripes", ("overlap", 10)),
        ("1, 2,", "1, 2, 3, 4", ("restart", 5)),
        ("1, 2,", " 3, 4, 5", ("clean", 0)),
        ("A B C", " D E F", ("clean", 0)),
        ("1, 2, 3, 4,", "1, 2, 5, 6,", None),  # began again, then left it
    ],
)
def test_the_seam_is_judged_on_words(
    delivered: str, start: str, verdict: tuple[str, int] | None
) -> None:
    assert judge(delivered, start) == verdict


def test_a_start_is_held_only_while_it_could_still_repeat() -> None:
    assert decided("Lighthouses were", " painted ")  # no overlap possible: released
    assert not decided("Lighthouses were", " wer")  # a word not complete yet
    assert not decided("Lighthouses were", "Lighthouses")  # could be a restart
    assert decided("1, 2,", " 3, ")


ASK = "Why were lighthouses painted in stripes?"
LOCAL_FIRST = Policy(name="l", routing={"prefer": "local", "ttft_deadline_ms": 500})


async def failover(cloud_tokens: list[str]) -> tuple[str, Trace]:
    """Local writes "Lighthouses were" and fails; the cloud continues with `cloud_tokens`."""
    reset = LocalEngineError("llama.cpp failed", engine="local")
    local = ScriptedEngine("local", script=[0.01, "Lighthouses", 0.01, " were", 0.01, reset])
    cloud = ScriptedEngine("cloud", tokens=cloud_tokens)
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        async with client.stream(ASK) as s:
            text = "".join([e.text async for e in s.events() if isinstance(e, Token)])
    return text, s.trace


async def test_an_overlap_at_the_seam_is_cut_and_recorded() -> None:
    text, trace = await failover(["were", " painted", " in", " stripes."])
    assert text == "Lighthouses were painted in stripes."
    assert [(r.engine, r.kind, r.cut) for r in trace.seams] == [("cloud", "overlap", "were")]
    assert Trace.from_dict(trace.to_dict()).seams == trace.seams


async def test_a_restart_after_a_trailing_space_leaves_one_space() -> None:
    reset = LocalEngineError("llama.cpp failed", engine="local")
    local = ScriptedEngine("local", script=[0.01, "1,", 0.01, " ", 0.01, reset])
    cloud = ScriptedEngine("cloud", tokens=["1,", " 2,", " 3"])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        done = await client.complete(ASK)
    assert done.text == "1, 2, 3" and [s.kind for s in done.trace.seams] == ["restart"]


async def test_a_clean_continuation_is_delivered_as_it_comes() -> None:
    text, trace = await failover([" painted", " in", " stripes."])
    assert text == "Lighthouses were painted in stripes."
    assert [(r.kind, r.cut) for r in trace.seams] == [("clean", "")]


async def test_a_continuation_that_stops_at_once_mid_sentence_failed() -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 (the attempts say which)
        await failover([])
    attempts = getattr(caught.value, "attempts", [])
    assert any(isinstance(e, ContinuationError) and e.kind == "stopped" for _, e, _ in attempts)


async def test_the_cuts_are_counted_in_stats() -> None:
    reset = LocalEngineError("llama.cpp failed", engine="local")
    local = ScriptedEngine("local", script=[0.01, "Lighthouses", 0.01, " were", 0.01, reset])
    cloud = ScriptedEngine("cloud", tokens=["were", " painted."])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=LOCAL_FIRST) as client:
        await client.complete(ASK)
        counts = client.stats().overall.counts
    assert counts.seams_cut == 1
