"""Admission off the event loop (issue 24 section 6): the router's score and the privacy scan
of a long prompt, or any scan with the NER layer, run on a worker thread; a short prompt's
patterns-only scan stays inline. A refusal decided there ends the stream with its error."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.client import INLINE_ADMISSION_CHARS
from hybridllm.errors import PrivacyBlockedError
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


class ThreadRecorder:
    """A privacy scan that notes the thread it ran on (the client's scan, with no findings)."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(
        self, messages: Sequence[Mapping[str, str]], *, deep: bool = True, extra: object = ()
    ) -> Collection[str]:
        self.threads.append(threading.get_ident())
        return ()


async def ran_on(policy: Policy, prompt: str) -> bool:
    """Did admitting `prompt` under `policy` scan on the event loop's own thread?"""
    scan = ThreadRecorder()
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    async with HybridClient(local=local, cloud=cloud, policy=policy, router=None) as client:
        client.routing.privacy = scan
        await client.complete(prompt)
    assert len(scan.threads) == 1
    return scan.threads[0] == threading.get_ident()


async def test_a_short_prompt_is_admitted_inline() -> None:
    assert await ran_on(Policy(name="p", privacy={"ner": False}), "What is 2+2?")


async def test_a_long_prompt_is_admitted_on_a_worker_thread() -> None:
    assert not await ran_on(Policy(name="p"), "word " * (INLINE_ADMISSION_CHARS // 4))


async def test_the_ner_layer_always_runs_on_a_worker_thread() -> None:
    assert not await ran_on(Policy(name="p", privacy={"ner": True}), "Hi, John here")


async def test_a_refusal_at_admission_ends_the_stream_with_its_error() -> None:
    block = Policy(name="b", routing={"prefer": "cloud"}, privacy={"mode": "block"})
    local, cloud = ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])
    async with HybridClient(local=local, cloud=cloud, policy=block) as client:
        s = client.stream("mail ada.lovelace@example.org " + "x" * INLINE_ADMISSION_CHARS)
        with pytest.raises(PrivacyBlockedError) as info:  # raised where the app reads
            async with s:
                async for _ in s:
                    pass
    assert info.value.kinds == ("email",) and s.trace.error_type is PrivacyBlockedError
    assert local.requests == [] and cloud.requests == []
