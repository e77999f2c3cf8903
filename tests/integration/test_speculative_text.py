"""Dialect (b) text-level: SmolLM2 drafts locally, Qwen2.5-Coder 0.5B verifies through
`hybridllm serve-model` (another tokenizer), reached through a FaultProxy. The server's own
tokenization of the drafted text decides; every committed token (in the server's tokenization
of prompt + answer) must be the server's greedy choice or a near-tie, asked of the same server
afterwards, one answer at a time (no two generations are compared)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
from hybridllm.events import Done, Draft, Token
from hybridllm.local.resolve import resolve_model
from hybridllm.testing import FaultProxy, Faults, HybridServer
from tests.integration.drafts import drafts_add_up
from tests.integration.servers import API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

NEAR_TIE = 0.05


@pytest.fixture(scope="module")
def qwen_server() -> Iterator[HybridServer]:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    with HybridServer(path, alias="qwen", api_key=API_KEY, n_ctx=1024) as server:
        yield server


@pytest.fixture
def qproxy(qwen_server: HybridServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", qwen_server.port), faults=Faults()) as p:
        yield p


def off_greedy(server: HybridServer, prompt: str, answer: str) -> list[tuple[int, str]]:
    """The server's tokens overlapping `answer` (after `prompt`), but the last one (a text
    tokenised whole can end differently), that are neither its top choice nor within
    NEAR_TIE nats of it, by one scoring request over prompt + answer."""
    body = {"model": "qwen", "prompt": prompt + answer, "prompt_logprobs": 2, "max_tokens": 0,
            "temperature": 0.0, "return_token_ids": True}  # fmt: skip
    r = httpx2.post(server.base_url + "/completions", json=body, timeout=300,
                    headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    ids, rows = choice["prompt_token_ids"], choice["prompt_logprobs"]
    names = [""] + [rows[i][str(ids[i])]["decoded_token"] for i in range(1, len(ids))]
    end = sum(len(n) for n in names)
    assert "".join(names).endswith(answer)
    start, pos, bad = end - len(answer), 0, []
    for i, name in enumerate(names[:-1]):
        pos += len(name)
        if i == 0 or pos <= start:
            continue
        row = {int(k): v["logprob"] for k, v in rows[i].items()}
        if max(row.values()) - row[ids[i]] > NEAR_TIE:
            bad.append((i, name))
    return bad


@pytest.mark.parametrize("prompt", ["Write a Python function that adds two numbers.",
                                    "List three colors."])  # fmt: skip
async def test_text_level_rounds_commit_the_other_tokenizers_greedy_text(
    prompt: str, qproxy: FaultProxy, qwen_server: HybridServer, model_path: Path
) -> None:
    local = LlamaCppEngine(model_path, warm_up=False)  # SmolLM2: another tokenizer
    cloud = OpenAIEngine(base_url=qproxy.url + "/v1", api_key=API_KEY, model="qwen")
    async with HybridClient(local, cloud, router=None) as client:
        async with client.stream(
            prompt, plan="speculative", show_drafts=True, max_tokens=32, temperature=0
        ) as s:
            events = [e async for e in s.events()]
        spec = s.trace.speculation
        assert spec is not None and "text-level" in spec.verifier, spec
        assert spec.rule.startswith("greedy")
        assert spec.rounds >= 1 and spec.drafted >= spec.accepted
        assert len(spec.k) == len(spec.verify_ms) == spec.rounds
        text = "".join(e.text for e in events if isinstance(e, Token))
        assert text and isinstance(events[-1], Done)
        assert any(isinstance(e, Draft) for e in events)
        drafts_add_up(events)
        sess = local._session
        assert sess is not None
        prompt_text = sess.render([{"role": "user", "content": prompt}])
        upto = text if spec.switched_at is None else text[: spec.switched_at]
    print(f"\n{prompt!r}: rounds {spec.rounds}, drafted {spec.drafted}, accepted "
          f"{spec.accepted}, switched {spec.switched!r}\n{text!r}")  # fmt: skip
    assert off_greedy(qwen_server, prompt_text, upto) == []
