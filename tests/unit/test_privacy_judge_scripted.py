"""The privacy judge's orchestration, with scripted engines standing in for the local model
(the real model and its grammar: tests/integration/test_privacy_judge_integration.py): which
prompts are borderline, how a verdict is read, a budget that runs out sends the request local,
the guard asks the judge only about borderline cloud-bound requests, and the client's setting
is checked."""

from __future__ import annotations

import pytest

from hybridllm import HybridClient
from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import InvalidArgumentError, PrivacyBlockedError
from hybridllm.guard.guarded import GuardedEngine, RequestContext
from hybridllm.guard.privacy_judge import MAX_CHARS, PrivacyJudge, Verdict, borderline, parse
from hybridllm.guard.privacy_ner import PrivacyScanner
from hybridllm.testing import ScriptedEngine
from tests.parts import HAS_NER, needs

pytestmark = pytest.mark.anyio
PRIVATE = ['{"private": ', "true", ', "span": "07911 234567"}']
NOT_PRIVATE = ['{"private": ', "false", ', "span": ""}']


@pytest.mark.parametrize(
    ("texts", "found", "case"),
    [
        (["Save my mobile, it starts 07911", "Go on.", "then 234567"], [], "fragment"),
        (["and the domain is @brightwave.co.uk"], [], "fragment"),
        (["the email is from dmitri volkov, translate it"], [], "lower_name"),
        (["Who was Hedy Lamarr?"], ["person"], "name_alone"),
        (["Write to Hannah Lindqvist at 07400 123456"], ["person", "phone"], None),
        (["Explain list comprehensions in Python."], [], None),
        (["a letter from the council about the bins"], [], None),  # "the": not a name
        (["The meeting starts at 10:30 in room 4."], [], None),
    ],
)
def test_borderline_cases(texts: list[str], found: list[str], case: str | None) -> None:
    assert borderline(texts, found) == case


def test_a_verdict_is_read_and_a_cut_one_is_private() -> None:
    assert parse('{"private": false, "span": ""}') == (False, "")
    assert parse('{"private": true, "span": "jane"}') == (True, "jane")
    assert parse('{"private": false, "span": "cut her') == (False, "")  # max_tokens cut the span
    assert parse('{"priv') == (True, "")  # cut before the verdict: the safe side
    assert parse("[1, 2]") == (True, "")


def test_the_request_asks_for_a_constrained_verdict_on_the_newest_turns() -> None:
    judge = PrivacyJudge(ScriptedEngine("local"))
    request = judge.request(["x" * 5_000, "the last turn"])
    assert request.tools is not None and request.tools.response_format is not None
    assert request.temperature == 0.0 and request.priority == "interactive"
    user = str(request.messages[-1]["content"])
    assert "the last turn" in user and len(user) < MAX_CHARS + 100


async def test_a_verdict_within_the_budget() -> None:
    judge = PrivacyJudge(ScriptedEngine("local", tokens=PRIVATE), budget_s=5)
    verdict = await judge.verdict(["it starts 07911", "then 234567"])
    assert (verdict.private, verdict.span, verdict.missed_deadline) == (True, "07911 234567", False)


async def test_a_budget_that_runs_out_is_a_private_verdict() -> None:
    slow = ScriptedEngine("local", tokens=NOT_PRIVATE, ttft_s=5.0)
    verdict = await PrivacyJudge(slow, budget_s=0.05).verdict(["it starts 07911"])
    assert verdict.private and verdict.missed_deadline and verdict.seconds < 1.0
    # a deadline already passed: no time to ask at all
    gone = await PrivacyJudge(slow, budget_s=5).verdict(["it starts 07911"], budget_s=0.0)
    assert gone == Verdict(True, "", True, gone.seconds) and len(slow.requests) == 1


def bound(text: str) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], max_tokens=4)


async def drain(guard: GuardedEngine, request: GenerationRequest, context: RequestContext) -> str:
    return "".join([getattr(c, "text", "") async for c in guard.stream(request, context)])


async def test_the_guard_asks_only_about_borderline_requests() -> None:
    local = ScriptedEngine("local", tokens=PRIVATE)
    cloud = ScriptedEngine("cloud", tokens=["ok"])
    scanner = PrivacyScanner(ner="off")
    guard = GuardedEngine(cloud, judge=PrivacyJudge(local, budget_s=5), scanner=scanner)
    context = RequestContext(privacy="keep-local")
    assert await drain(guard, bound("Explain list comprehensions."), context) == "ok"
    assert local.requests == []  # not borderline: the judge is not asked
    with pytest.raises(PrivacyBlockedError) as refused:
        await drain(guard, bound("my mobile starts 07911 and then 234567"), context)
    assert refused.value.kinds == ("judge",) and len(local.requests) == 1
    assert len(cloud.requests) == 1  # only the benign one was sent
    off = RequestContext(privacy="off")  # privacy off: never judged
    assert await drain(guard, bound("my mobile starts 07911"), off) == "ok"
    assert len(local.requests) == 1


async def test_the_guard_sends_a_request_local_when_the_deadline_would_pass() -> None:
    from hybridllm import clock

    local = ScriptedEngine("local", tokens=NOT_PRIVATE, ttft_s=5.0)
    cloud = ScriptedEngine("cloud", tokens=["ok"])
    guard = GuardedEngine(
        cloud, judge=PrivacyJudge(local, budget_s=10), scanner=PrivacyScanner(ner="off")
    )
    context = RequestContext(privacy="keep-local", due=clock.now() + 0.05)
    with pytest.raises(PrivacyBlockedError, match="judge"):
        await drain(guard, bound("the rest is 234567"), context)
    assert cloud.requests == []


@needs(HAS_NER, "names need the NER layer (privacy extra)")
async def test_a_name_alone_is_cleared_only_by_a_judge_that_clears_names() -> None:
    scanner = PrivacyScanner(ner="on")
    cloud = ScriptedEngine("cloud", tokens=["ok"])
    context = RequestContext(privacy="keep-local")
    question = bound("Who was Zorblax Quintavius and what did he invent?")
    keeps = GuardedEngine(
        cloud, scanner=scanner, judge=PrivacyJudge(ScriptedEngine("local", tokens=NOT_PRIVATE))
    )
    with pytest.raises(PrivacyBlockedError) as refused:
        await drain(keeps, question, context)
    assert refused.value.kinds == ("person",)
    clears = GuardedEngine(
        cloud,
        scanner=scanner,
        judge=PrivacyJudge(ScriptedEngine("local", tokens=NOT_PRIVATE), clears_names=True),
    )
    assert await drain(clears, question, context) == "ok"


def test_the_client_checks_its_judge_setting() -> None:
    local, cloud = ScriptedEngine("local"), ScriptedEngine("cloud")
    with pytest.raises(InvalidArgumentError, match="privacy_judge must be None or seconds"):
        HybridClient(local=local, cloud=cloud, privacy_judge=0)
    with pytest.raises(InvalidArgumentError, match="without a local engine"):
        HybridClient(cloud=cloud, privacy_judge=1.0)
    with pytest.raises(InvalidArgumentError, match="budget_s"):
        PrivacyJudge(local, budget_s=-1)
    client = HybridClient(local=local, cloud=cloud, privacy="keep-local", privacy_judge=1.5)
    guard = client._guard
    assert guard is not None and guard.judge is not None and guard.judge.budget_s == 1.5
