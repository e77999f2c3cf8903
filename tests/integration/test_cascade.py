"""The cascade plan and `router_score` through the real engines (issue 14).

Local: Qwen2.5-Coder-0.5B through the real llama-cpp-python engine (the model router stage 2 was
trained on: its signals mean something only for it). Cloud: the stand-in OpenAI-compatible
server on loopback (`cloud_server`: hybridllm serve-model, SmolLM2). Router: the shipped artifact
with its stage 2.
Each test judges one generation on its own, never two against each other.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from hybridllm import Fallback, HybridClient, LlamaCppEngine, OpenAIEngine, Policy, Token
from hybridllm.errors import InvalidArgumentError, LocalEngineError
from hybridllm.events import Chunk, Delta
from hybridllm.routing import DecisionLog, Router
from hybridllm.testing import FaultProxy, HybridServer, LlamaServer
from tests.integration.servers import ALIAS, API_KEY, TEST_MODEL

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

LOCAL = "qwen2.5-coder-0.5b-instruct"
PROMPT = "What is 2 + 2? Answer with the number only."
MC = (
    "Which gas do plants absorb?\n\nA. oxygen\nB. carbon dioxide\nC. helium\n\n"
    "Answer with the letter of the correct option only."
)


def engines(server: LlamaServer) -> tuple[LlamaCppEngine, OpenAIEngine]:
    local = LlamaCppEngine(LOCAL, n_ctx=1024, pull=True)
    cloud = OpenAIEngine(base_url=server.url + "/v1", api_key=API_KEY, model=ALIAS)
    return local, cloud


def cascade_policy(threshold: float) -> Policy:
    return Policy(
        name="cascade-test",
        plans=("single", "hedge", "cascade"),
        routing={"router_threshold": threshold},
        sampling={"max_tokens": 16, "temperature": 0.0},
    )


@pytest.fixture(scope="module")
def router() -> Router:
    r = Router.load()
    kinds = {"combined", "signals", "combined_plain", "signals_plain", "combined_answer",
             "signals_answer"}  # fmt: skip
    assert set(r.stage2) == kinds, "the shipped router has a stage 2"
    return r


async def test_router_score_reads_the_local_model(
    cloud_server: HybridServer, router: Router
) -> None:
    local, cloud = engines(cloud_server)
    question = [{"role": "user", "content": MC}]
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        score = await client.router_score(PROMPT)
        mc = await client.router_score(MC)
        # the rotations ran first: the prompt as asked is what stays in the KV cache
        session = local._session
        assert session is not None
        tokens = session.tokenize(session.render(question))
        assert session.cached_prefix(tokens) == len(tokens) - 1
        # no time for the rotations (a short cascade hold): none is used, the rest is measured
        hurried = await local.signals(question, rotations_within_s=0.0)
        # a bound on what they may add: priced past it (any price passes 0 ms), not read
        plain = await client.router_score(MC, rotations_ms=0.0)
        with pytest.raises(InvalidArgumentError):
            await client.router_score(MC, rotations_ms=-1.0)
    assert mc.extra_ms > 0.0 and mc.model == "combined"  # the rotations: not the answer's work
    assert score.extra_ms == 0.0  # no options, nothing but the answer's own prefill and tokens
    assert plain.extra_ms == 0.0 and plain.model == "combined_plain"
    assert all(math.isnan(plain.signals[k]) for k in ("perm_agree", "perm_p", "perm_margin"))
    assert score.text == pytest.approx(router.score(PROMPT))
    assert score.local is not None and 0.0 < score.local < 1.0
    assert 0.0 < score.value < 1.0 and score.cost_ms > 0
    s = score.signals
    assert 0.0 < s["first_p"] <= 1.0 and s["first_entropy"] >= 0.0
    assert s["lp_min"] <= s["lp_mean"] <= 0.0 and s["is_choice"] == 0.0
    assert math.isnan(s["option_p"])  # not a multiple-choice prompt
    # a multiple-choice prompt: the option letters' probability, normalised over A-C
    assert mc.signals["is_choice"] == 1.0 and 1 / 3 <= mc.signals["option_p"] <= 1.0
    # and with its options rotated through every letter (two rotations of three options)
    agree, p, margin = (mc.signals[k] for k in ("perm_agree", "perm_p", "perm_margin"))
    assert agree in (0.0, 0.5, 1.0) and 0.0 < p < 1.0 and -1.0 < margin < 1.0
    if agree == 1.0:  # first in every order: first on average too
        assert margin >= 0.0 and p >= 1 / 3
    assert all(math.isnan(s[k]) for k in ("perm_agree", "perm_p", "perm_margin"))
    h = hurried.values
    assert all(math.isnan(h[k]) for k in ("perm_agree", "perm_p", "perm_margin"))
    assert h["is_choice"] == 1.0 and h["option_p"] == pytest.approx(
        mc.signals["option_p"], abs=0.02
    )


async def test_cascade_releases_the_local_answer(
    cloud_server: HybridServer, router: Router, tmp_path: Path
) -> None:
    local, cloud = engines(cloud_server)
    log = DecisionLog(tmp_path / "d.db", store_prompts=True)
    async with HybridClient(local=local, cloud=cloud, router=router, decision_log=log) as c:
        s = c.stream(PROMPT, policy=cascade_policy(1.0), plan="cascade")
        tokens = [e async for e in s.events() if isinstance(e, Token)]
        c.feedback(s.trace, good=True)
    trace = s.trace
    assert tokens and {t.engine for t in tokens} == {"local"}
    assert "4" in "".join(t.text for t in tokens)
    assert trace.started == ("local",) and trace.cascade is not None
    assert trace.cascade.decision == "local" and trace.cascade.held_ms > 0
    assert trace.cascade.signals["first_p"] > 0.0
    # the decision log keeps the signals: `router train --from-log` learns stage 2 from them
    with log:
        learned = log.training_signals()
    assert learned[f"log/{trace.request_id}"]["first_p"] == pytest.approx(
        trace.cascade.signals["first_p"]
    )


async def test_cascade_defers_to_the_cloud_before_anything_is_shown(
    cloud_server: HybridServer, router: Router
) -> None:
    local, cloud = engines(cloud_server)
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        s = client.stream(PROMPT, policy=cascade_policy(0.0), plan="cascade")
        tokens = [e async for e in s.events() if isinstance(e, Token)]
    trace = s.trace
    assert tokens and {t.engine for t in tokens} == {"cloud"}  # no local token was shown
    assert trace.engine == "cloud" and trace.cascade is not None
    assert trace.cascade.decision == "cloud"
    assert not local.busy  # the local work stopped with the hold


async def test_complete_judges_the_whole_local_answer_then_keeps_or_defers_it(
    cloud_server: HybridServer, router: Router, tmp_path: Path
) -> None:
    # SmolLM2 as the local model: its quality does not matter, the thresholds force each outcome
    local = LlamaCppEngine(TEST_MODEL, n_ctx=1024, pull=True)
    cloud = OpenAIEngine(base_url=cloud_server.url + "/v1", api_key=API_KEY, model=ALIAS)
    log = DecisionLog(tmp_path / "d.db", store_prompts=True)
    prompt = "Write two sentences about the sea."

    def judged(threshold: float) -> Policy:
        return cascade_policy(threshold).with_(
            cascade={"judge": "answer"}, sampling={"max_tokens": 32}
        )

    async with HybridClient(local=local, cloud=cloud, router=router, decision_log=log) as c:
        kept = await c.complete(prompt, policy=judged(1.0), plan="cascade")
        deferred = await c.complete(prompt, policy=judged(0.0), plan="cascade")
    k, d = kept.trace.cascade, deferred.trace.cascade
    assert k is not None and d is not None
    # kept: the whole local answer, written once (nothing continued after the judgement)
    assert k.judge == "answer" and k.decision == "local"
    assert kept.trace.engine == "local" and kept.trace.started == ("local",) and kept.text.strip()
    assert k.local_tokens > 8 and kept.trace.completion_tokens == k.local_tokens
    assert k.answer_signals["answer_tokens"] == k.local_tokens
    assert k.signals["answer_tokens"] == 8  # the logged figures: stage 2's training form
    assert k.answer_signals["lp_min"] <= k.signals["lp_min"] <= 0.0
    assert k.model == d.model == "combined_answer"  # stage 2's whole-answer models
    # the figures only a whole answer has, from the real engine's token ids
    a = k.answer_signals
    text_tokens = k.local_tokens - int(a["answer_ended"])
    assert a["answer_ended"] in (0.0, 1.0) and (a["answer_ended"] == 0.0) == (text_tokens == 32)
    assert a["answer_len"] == pytest.approx(math.log1p(text_tokens), abs=1e-6)
    assert 0.0 <= a["repeat_share"] <= 1.0 and a["tail_lp_min"] <= a["tail_lp_mean"] <= 0.0
    # deferred: the cloud answers; the local answer it judged is on the trace
    assert d.judge == "answer" and d.decision == "cloud"
    assert deferred.trace.engine == "cloud" and deferred.text.strip()
    assert d.local_tokens > 8 and d.held_ms > 0 and d.cost_ms > 0
    assert "judging the whole local answer" in deferred.trace.route_reason
    assert not local.busy
    with log:
        logged = [json.loads(r["cascade"]) for r in log.rows()]
    assert [x["judge"] for x in logged] == ["answer", "answer"]
    assert [x["decision"] for x in logged] == ["local", "cloud"]


class FailsMidAnswer(LlamaCppEngine):
    """The real local engine, made to fail after `after` text chunks of an answer it streams
    (the cascade's continuation after the release): a scripted fault, the model real."""

    def __init__(self, *args: Any, after: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.after = after

    async def stream(self, request: Any) -> AsyncGenerator[Chunk, None]:
        n = 0
        async with aclosing(super().stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk
                if isinstance(chunk, Delta) and chunk.text:
                    n += 1
                    if n >= self.after:
                        raise LocalEngineError("injected decode failure", engine="local")


async def test_a_released_local_answer_that_fails_goes_on_in_the_cloud(
    router: Router, proxy: FaultProxy
) -> None:
    local = FailsMidAnswer(TEST_MODEL, n_ctx=1024, pull=True, after=3)
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    proxy.record = True
    pol = cascade_policy(1.0).with_(sampling={"max_tokens": 24}, cascade={"hold_tokens": 4})
    async with HybridClient(local=local, cloud=cloud, router=router) as client:
        s = client.stream("Write two sentences about the sea.", policy=pol, plan="cascade")
        events = [e async for e in s.events()]
    tokens = [e for e in events if isinstance(e, Token)]
    engines = [t.engine for t in tokens]
    # held tokens, then three continued local chunks, then the cloud from where local stopped
    assert engines[: engines.index("cloud")] == ["local"] * 4 and set(engines[4:]) == {"cloud"}
    delivered_by_local = "".join(t.text for t in tokens if t.engine == "local")
    assert [(f.from_engine, f.to_engine) for f in events if isinstance(f, Fallback)] == [
        ("local", "cloud")
    ]
    trace = s.trace
    assert trace.cascade is not None and trace.cascade.decision == "local"
    assert "injected decode failure" in trace.cascade.failover
    assert trace.engine == "cloud" and trace.started == ("local", "cloud")
    assert [w.delivered_chars for w in trace.switches] == [len(delivered_by_local)]
    # what reached the network: the delivered text as the start of the assistant turn
    body = json.loads(proxy.requests()[-1][1])
    assert {"role": "assistant", "content": delivered_by_local} in body["messages"]
    assert trace.finish_reason in ("stop", "length")
