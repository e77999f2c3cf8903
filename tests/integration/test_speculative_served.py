"""The speculative plan through dialect (b), vLLM's `prompt_logprobs`, against the project's own
server (`hybridllm serve-model`, SmolLM2, the `cloud_server` fixture behind a FaultProxy): the probe
finds the dialect, rounds verify token by token, and every committed token is the server's own
greedy choice at its position or a near-tie (asked of the same server afterwards, one answer at
a time: no two generations are compared)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
from hybridllm.events import Done, Draft, Token
from hybridllm.testing import FaultProxy, HybridServer
from tests.integration.drafts import drafts_add_up
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

NEAR_TIE = 0.05


def off_greedy(server: HybridServer, ids: list[int], start: int) -> list[int]:
    """Positions at or after `start` whose token is neither the server's top choice nor within
    NEAR_TIE nats of it, by one scoring request over the whole sequence."""
    body = {"model": ALIAS, "prompt": ids, "prompt_logprobs": 2, "max_tokens": 0,
            "temperature": 0.0}  # fmt: skip
    r = httpx2.post(server.base_url + "/completions", json=body, timeout=300,
                    headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    assert r.status_code == 200, r.text
    rows = r.json()["choices"][0]["prompt_logprobs"]
    bad = []
    for p in range(start, len(ids)):
        row = {int(k): v["logprob"] for k, v in rows[p].items()}
        best = max(row.values())
        got = row.get(ids[p])
        if got is None or best - got > NEAR_TIE:
            bad.append(p)
    return bad


@pytest.mark.parametrize("prompt", ["Write a Python function that adds two numbers.",
                                    "List three colors."])  # fmt: skip
async def test_vllm_dialect_against_hybridllm_serve_commits_the_servers_greedy_tokens(
    prompt: str, proxy: FaultProxy, cloud_server: HybridServer, model_path: Path
) -> None:
    local = LlamaCppEngine(model_path, warm_up=False)
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    async with HybridClient(local, cloud, router=None) as client:
        async with client.stream(
            prompt, plan="speculative", show_drafts=True, max_tokens=24, temperature=0
        ) as s:
            events = [e async for e in s.events()]
        spec = s.trace.speculation
        assert spec is not None and spec.verifier.startswith("prompt-logprobs"), spec
        assert spec.rounds >= 1 and spec.accepted >= 1 and spec.drafted >= spec.accepted
        assert len(spec.k) == len(spec.verify_ms) == spec.rounds
        # the same model on both sides agrees at almost every position: after a wholly
        # accepted round, the next round's draft was made while it was being verified
        assert spec.rounds == 1 or spec.ahead_used >= 1, spec
        text = "".join(e.text for e in events if isinstance(e, Token))
        assert text and isinstance(events[-1], Done)
        assert any(isinstance(e, Draft) for e in events)
        drafts_add_up(events)
        sess = local._session
        assert sess is not None
        prompt_ids = sess.tokenize(sess.render([{"role": "user", "content": prompt}]))
        upto = text if spec.switched_at is None else text[: spec.switched_at]
        answer_ids = sess.tokenize(upto)
    ids = prompt_ids + answer_ids
    bad = off_greedy(cloud_server, ids, len(prompt_ids))
    # re-tokenising the committed text can split its last token differently: judge all but it
    assert [p for p in bad if p < len(ids) - 1] == [], (bad, len(prompt_ids), len(ids))


@pytest.fixture(scope="module")
def wide_server(model_path: Path) -> Iterator[HybridServer]:
    """hybridllm serve-model allowing 64 log-probabilities per position (`--max-logprobs 64`)."""
    with HybridServer(model_path, alias=ALIAS, api_key=API_KEY, n_ctx=1024,
                      extra_args=["--max-logprobs", "64"]) as server:  # fmt: skip
        yield server


@pytest.mark.parametrize(("wide", "top_p", "seed"), [
    (False, 0.8, 1), (False, 0.8, 2), (False, 0.8, 3), (True, 0.9, 1), (True, 0.9, 2),
])  # fmt: skip
async def test_sampled_speculation_against_hybridllm_serve_speculates_and_answers(
    wide: bool, top_p: float, seed: int, request: pytest.FixtureRequest, model_path: Path
) -> None:
    """Temperature 0.8: the rounds run speculative sampling (the trace says so), accept
    drafted tokens, and the answer is the asked length of coherent text. With 20
    log-probabilities per position (vLLM's default) top_p is 0.8: at 0.9 the first answer
    position of this 135M model often has a nucleus wider than 20 tokens; such positions
    become cloud steps, and rounds mostly made of them end in plain streaming. A server that
    allows 64 (`--max-logprobs 64`) speculates at top_p 0.9."""
    if wide:
        server = request.getfixturevalue("wide_server")
        url = server.base_url
    else:
        url = request.getfixturevalue("proxy").url + "/v1"
    local = LlamaCppEngine(model_path, warm_up=False)
    # where the plan steps aside (it stops paying, or rounds cannot decide), the rest streams
    # as a continuation of the committed text (vLLM's continue_final_message)
    cloud = OpenAIEngine(base_url=url, api_key=API_KEY, model=ALIAS,
                         continuation="continue_final_message")  # fmt: skip
    async with HybridClient(local, cloud, router=None) as client:
        async with client.stream(
            "Write the numbers from 1 to 40, separated by commas.", plan="speculative",
            show_drafts=True, max_tokens=48, temperature=0.8, top_p=top_p, seed=seed,
        ) as s:  # fmt: skip
            events = [e async for e in s.events()]
        sess = local._session
        assert sess is not None
        spec = s.trace.speculation
        assert spec is not None and spec.verifier.startswith("prompt-logprobs"), spec
        assert spec.verifier.endswith(f"top {64 if wide else 20})"), spec.verifier
        text = "".join(e.text for e in events if isinstance(e, Token))
        assert spec.rule.startswith(f"speculative sampling (temperature 0.8, top_p {top_p:g})")
        assert spec.rounds > 0 and spec.accepted > 0, (spec, text, s.trace.fallback_reason)
        assert spec.drafted >= spec.accepted
        drafts_add_up(events)
        assert isinstance(events[-1], Done)
        n = len(sess.tokenize(text))
    if wide:  # at top_p 0.9 this model sometimes answers in words and ends: judge the rounds
        # where it stopped speculating, the trace says why
        why = spec.switched or ""
        assert not why or "cannot decide" in why or "stopped paying" in why, spec
        assert s.trace.finish_reason == "stop" or abs(n - 48) <= 3, (n, text, spec)
        # words or numbers, not noise (separated by spaces, commas or new lines: a sampled
        # answer's layout differs between CPUs)
        assert re.search(r"\w+[,\s]+\w+", text), text
        return
    assert s.trace.finish_reason == "length" and abs(n - 48) <= 3, (n, text, spec)
    # coherent: a comma-separated run of numbers (a sampled answer need not start at 1)
    assert len(re.findall(r"(?<=\d), (?=\d)", text)) >= 8, text
