"""The privacy judge on the real local model (llama-cpp-python on the test GGUF), with the real
loopback cloud behind a recording FaultProxy: the verdict is always JSON of the schema (the
local engine's grammar), and a borderline prompt whose judge cannot answer before the request's
budget runs out stays on the device while a plain prompt goes to the cloud. (What the verdicts
are worth, per case, is measured by benchmarks/bench_privacy_judge.py, not asserted here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.events import Delta
from hybridllm.guard.privacy_judge import PrivacyJudge, parse
from hybridllm.testing import FaultProxy
from tests.integration.servers import ALIAS, API_KEY
from tests.integration.test_guarded_integration import leaked, on_the_wire

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

BORDERLINE = [
    ["Save my mobile, it starts 07911", "Go on.", "then 234567, thanks"],
    ["the email is from dmitri volkov, can you translate it?"],
    ["My address begins with t.okonkwo", "and the domain?", "it's @brightwave.co.uk"],
]


async def test_the_verdict_is_always_json_of_the_schema(model_path: Path) -> None:
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
    await local.start()
    try:
        judge = PrivacyJudge(local, budget_s=120)
        for texts in BORDERLINE:
            parts = [
                c.text async for c in local.stream(judge.request(texts)) if isinstance(c, Delta)
            ]
            data = json.loads("".join(parts))  # the grammar: parseable, whatever the model thinks
            assert set(data) == {"private", "span"} and isinstance(data["private"], bool)
            assert isinstance(data["span"], str) and parse("".join(parts))[0] is data["private"]
            verdict = await judge.verdict(texts)
            assert not verdict.missed_deadline and verdict.private is data["private"]
    finally:
        await local.aclose()


async def test_a_judge_out_of_time_keeps_the_request_local(
    proxy: FaultProxy, model_path: Path
) -> None:
    proxy.record = True
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    cloud_first = Policy(
        name="cloud-first",
        routing={"prefer": "cloud"},
        sampling={"max_tokens": 2, "temperature": 0},
    )
    async with HybridClient(
        local=local, cloud=cloud, policy=cloud_first, privacy="keep-local", privacy_judge=0.001
    ) as c:
        # borderline: a lower-case name no fast layer finds (a number in pieces is found now)
        lower = [{"role": "user", "content": "the email is from dmitri volkov, translate it"}]
        kept = await c.complete(lower)
        plain = await c.complete("Explain list comprehensions in one sentence.")
    assert kept.trace.engine == "local" and "judge" in (kept.trace.fallback_reason or "")
    assert kept.trace.fallback_cause == "refused"  # a guard refused the cloud: not a failure
    assert plain.trace.engine == "cloud"
    wire = on_the_wire(proxy)
    assert not leaked("volkov", wire)
    assert len(proxy.requests()) == 1
