""" "keep-local" keeps names local (issue 42, item 7): with `[privacy] ner` unset (the default)
the NER layer runs wherever the mode looks at all and the privacy extra is installed, so a
person's name with their street address stays on the device; `ner = false` is the explicit way
out (the patterns alone); where the extra is missing, a client says so once at start (WARNING).
Scripted engines (routing only); the privacy scan is the real one (Presidio and spaCy)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.errors import AllEnginesFailedError, LocalEngineError, PrivacyBlockedError
from hybridllm.guard import privacy_ner
from hybridllm.guard.privacy_ner import PrivacyScanner, ner_wanted, say_ner_missing
from hybridllm.testing import ScriptedEngine
from tests.parts import HAS_NER, needs

pytestmark = pytest.mark.anyio

# no email, phone, card or ID number: only the NER layer and its address rule see it
PRIVATE = "Write a short note to Margaret Holloway at 14 Ashdown Road about her late parcel."
CLOUD_FIRST = Policy(name="c", routing={"prefer": "cloud", "ttft_deadline_ms": 2000})


def test_ner_is_wanted_by_default_only_where_the_mode_looks_and_it_is_not_turned_off() -> None:
    installed = privacy_ner.default_scanner().deep
    assert ner_wanted(Policy().privacy) is installed
    assert not ner_wanted(Policy(privacy={"ner": False}).privacy)
    assert not ner_wanted(Policy(privacy={"mode": "off"}).privacy)
    assert ner_wanted(Policy(privacy={"ner": True}).privacy)


@needs(HAS_NER, "the privacy extra (hybridllm[privacy]) is not installed")
async def test_a_name_with_a_street_address_stays_local_by_default() -> None:
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        kept = client.decide(PRIVATE)
        opted_out = client.decide(PRIVATE, policy=CLOUD_FIRST.with_(privacy={"ner": False}))
    assert kept.decision.primary == "local" and "privacy_local" in kept.decision.codes
    assert {"person", "address"} <= set(kept.facts.privacy_kinds or ())
    assert opted_out.decision.primary == "cloud"  # the patterns alone find nothing here


def test_a_missing_extra_is_said_once_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(privacy_ner, "_default", PrivacyScanner(ner="off"))  # as if missing
    monkeypatch.setattr(privacy_ner, "_said_missing", False)
    with caplog.at_level(logging.WARNING, logger="hybridllm.guard.privacy_ner"):
        assert not say_ner_missing(Policy(privacy={"ner": False}).privacy)  # meant: silent
        assert not caplog.records
        local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
        HybridClient(local=local, cloud=cloud, router=None)  # the default policy: keep-local
        HybridClient(local=local, cloud=cloud, router=None)
    said = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and said[0].args and said[0].args[0] == "keep-local"


@pytest.fixture(scope="module")
def warm_ner() -> None:
    """The NER pipelines loaded before the test (spaCy's load waits on the real clock)."""
    privacy_ner.default_scanner().warm()


@needs(HAS_NER, "the privacy extra (hybridllm[privacy]) is not installed")
@pytest.mark.usefixtures("warm_ner")
async def test_a_local_first_policy_reads_names_at_the_cloud_seam_not_before_the_local_start() -> (
    None
):
    """Local first: routing reads the patterns alone (the local first token never waits for the
    NER layer), and the cloud, started as the rescue of a failed local engine, is refused at
    the seam where the NER layer finds the name: nothing reaches it."""
    failing = LocalEngineError("llama.cpp failed", engine="local")
    local = ScriptedEngine("local", script=[0.01, failing])
    cloud = ScriptedEngine("cloud", tokens=["c"])
    local_first = Policy(name="l", routing={"prefer": "local", "ttft_deadline_ms": 2000})
    async with HybridClient(local=local, cloud=cloud, router=None, policy=local_first) as client:
        preview = client.decide(PRIVATE)
        s = client.stream(PRIVATE)
        with pytest.raises(AllEnginesFailedError):
            async with s:
                async for _ in s:
                    pass
    assert preview.decision.primary == "local" and preview.decision.fallback == "cloud"
    assert "person" not in (preview.facts.privacy_kinds or ())  # the patterns alone
    assert cloud.requests == [] and s.trace.error_type is AllEnginesFailedError
    assert [(a.engine, a.error_type) for a in s.trace.attempts] == [
        ("local", LocalEngineError),
        ("cloud", PrivacyBlockedError),
    ]


@needs(HAS_NER, "the privacy extra (hybridllm[privacy]) is not installed")
@pytest.mark.usefixtures("warm_ner")
async def test_while_the_ner_pipelines_load_routing_leaves_names_to_the_cloud_seam() -> None:
    """Issue 45: a cloud-first request made while the NER pipelines still load (seconds after a
    client opens) does not wait for them in admission, where its first-token deadline already
    runs: routing reads the patterns alone and says so (`privacy_names_at_seam`), and the
    guard's scan reads the names before anything is sent, so the cloud gets nothing and the
    local engine answers. A preview (`decide()`, no deadline) still reads them."""
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=CLOUD_FIRST) as client:
        client.routing.ner_ready = lambda: False  # as while the preload runs
        asked: list[bool] = []
        scan = client.routing.privacy
        assert scan is not None

        def spy(messages: Any, *, deep: bool = True, extra: Any = ()) -> Any:
            asked.append(deep)
            return scan(messages, deep=deep, extra=extra)

        client.routing.privacy = spy
        preview = client.decide(PRIVATE)
        async with client.stream(PRIVATE) as s:
            text = "".join([t async for t in s])
    assert preview.decision.primary == "local" and "privacy_local" in preview.decision.codes
    assert asked == [True, False]  # the preview read names; the request did not wait for them
    decision = s.trace.decision
    assert decision is not None and decision.primary == "cloud"
    assert "privacy_names_at_seam" in decision.codes
    assert cloud.requests == [] and text == "l" and s.trace.engine == "local"
    assert ("cloud", PrivacyBlockedError) in [(a.engine, a.error_type) for a in s.trace.attempts]
