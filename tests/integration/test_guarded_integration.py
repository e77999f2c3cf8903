"""Privacy and budget guards against the real loopback server, through a recording FaultProxy:
what reached the network is read back from the proxy's log of request bodies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import anyio.to_thread
import openai
import pytest

from hybridllm import (
    Cap,
    HybridClient,
    LlamaCppEngine,
    ModelPrice,
    OpenAIEngine,
    Policy,
    Prices,
    SQLiteLedger,
)
from hybridllm.engines.base import GenerationRequest
from hybridllm.errors import AllEnginesFailedError, BudgetExceededError, LocalEngineError
from hybridllm.guard.guarded import request_token_bound
from hybridllm.testing import FaultProxy, LlamaServer, ScriptedEngine
from tests.integration.servers import ALIAS, API_KEY
from tests.privacy_corpus import BENIGN, SENSITIVE

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

PRICES = Prices(models={ALIAS: ModelPrice(input_per_million=1.0, output_per_million=2.0)})
SOME_BENIGN = BENIGN[::9]  # 5 prompts: enough to show benign ones do go out


def cloud(proxy: FaultProxy) -> OpenAIEngine:
    return OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)


def on_the_wire(proxy: FaultProxy) -> str:
    """Everything clients sent through the proxy: raw bytes and the decoded message texts."""
    parts: list[str] = []
    for head, body in proxy.requests():
        parts.append((head + body).decode("utf-8", "replace"))
        try:
            payload = json.loads(body)
        except ValueError:
            continue
        parts += [str(m.get("content", "")) for m in payload.get("messages", [])]
    return "\n".join(parts)


def leaked(secret: str, wire: str) -> bool:
    """The secret as written, JSON-escaped, or (long numbers) without its separators."""
    if secret in wire or json.dumps(secret)[1:-1] in wire:
        return True
    compact = re.sub(r"[\s-]", "", secret)
    return len(compact) >= 13 and compact in re.sub(r"[\s-]", "", wire)


async def test_flagged_prompts_never_reach_the_cloud_benign_ones_do(
    proxy: FaultProxy, model_path: Path
) -> None:
    proxy.record = True
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
    policy = Policy(
        name="cloud-first",
        routing={"prefer": "cloud"},
        sampling={"max_tokens": 2, "temperature": 0},
    )
    async with HybridClient(
        local=local, cloud=cloud(proxy), policy=policy, privacy="keep-local"
    ) as c:
        private = [await c.complete(prompt) for prompt, _, _ in SENSITIVE]
        benign = [await c.complete(prompt) for prompt in SOME_BENIGN]
    wire = on_the_wire(proxy)
    for (prompt, kind, secret), done in zip(SENSITIVE, private, strict=True):
        tr = done.trace
        # routing scanned the prompt first: local from the start, the reason names the kind
        assert tr.engine == "local" and tr.started == ("local",), prompt
        assert "privacy:" in tr.route_reason and kind in tr.route_reason, tr.route_reason
        assert not leaked(secret, wire), kind
        assert secret not in repr(tr) + str(tr.summary())
    assert all(done.trace.engine == "cloud" for done in benign)
    assert all(prompt in wire for prompt in SOME_BENIGN)
    assert len(proxy.requests()) == len(SOME_BENIGN)


async def test_nothing_flagged_leaves_when_the_local_engine_fails(proxy: FaultProxy) -> None:
    """The local side is a ScriptedEngine here (it must fail on cue); the cloud is real."""
    proxy.record = True
    local_first = Policy(
        name="local-first",
        routing={"prefer": "local"},
        sampling={"max_tokens": 2, "temperature": 0},
    )
    broken = LocalEngineError("out of memory", engine="local")
    async with HybridClient(
        local=ScriptedEngine("local", script=[broken]),
        cloud=cloud(proxy),
        policy=local_first,
        privacy="keep-local",
    ) as c:
        for prompt, _, secret in SENSITIVE:  # local only, so its failure is the answer
            with pytest.raises(LocalEngineError) as info:
                await c.complete(prompt)
            assert not leaked(secret, str(info.value))
        for prompt in SOME_BENIGN:
            assert (await c.complete(prompt)).trace.engine == "cloud"
    # mid-stream: the local engine said something flagged, then failed; the continuation
    # (the delivered text as the start of the assistant turn) must not go out either
    crash = LocalEngineError("decode failed", engine="local", received_content=True)
    secret = "4111 1111 1111 1111"
    talker = ScriptedEngine("local", script=["Your card ", f"{secret} is ", "noted", crash])
    async with HybridClient(
        local=talker, cloud=cloud(proxy), policy=local_first, privacy="keep-local"
    ) as c:
        with pytest.raises(AllEnginesFailedError, match="privacy"):
            await c.complete("Read my card back to me.")
    wire = on_the_wire(proxy)
    assert not any(leaked(s, wire) for _, _, s in SENSITIVE) and not leaked(secret, wire)
    assert all(prompt in wire for prompt in SOME_BENIGN)
    assert len(proxy.requests()) == len(SOME_BENIGN)


async def test_a_hedge_never_carries_a_flagged_prompt(proxy: FaultProxy, model_path: Path) -> None:
    proxy.record = True
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
    hedged = Policy(
        name="hedged",
        routing={"prefer": "local"},
        hedge={"after_ms": 1},
        sampling={"max_tokens": 2, "temperature": 0},
    )
    async with HybridClient(
        local=local, cloud=cloud(proxy), policy=hedged, privacy="keep-local"
    ) as c:
        private = [await c.complete(prompt) for prompt, _, _ in SENSITIVE]
        benign = [await c.complete(prompt) for prompt in SOME_BENIGN[:3]]
    wire = on_the_wire(proxy)
    for (_, _, secret), done in zip(SENSITIVE, private, strict=True):
        assert done.trace.engine == "local" and not done.trace.hedged  # no cloud to hedge with
        assert "privacy:" in done.trace.route_reason
        assert not leaked(secret, wire)
    assert all(done.trace.hedged and not done.trace.refusals for done in benign)


async def test_concurrent_streams_against_the_real_server_stay_under_the_cap(
    model_path: Path, tmp_path: Path
) -> None:
    # a server of its own that queues concurrent requests (the shared one interrupts a stream
    # when the next request arrives, as llama_cpp.server does by default)
    with (
        LlamaServer(
            model_path,
            alias=ALIAS,
            api_key=API_KEY,
            n_ctx=1024,
            extra_args=["--interrupt_requests", "false"],
        ) as server,
        FaultProxy(upstream=("127.0.0.1", server.port), record=True) as proxy,
    ):
        await _concurrent_streams(proxy, tmp_path)


async def _concurrent_streams(proxy: FaultProxy, tmp_path: Path) -> None:
    prompt = "Name a colour."
    req = GenerationRequest(messages=[{"role": "user", "content": prompt}], max_tokens=8)
    worst = PRICES.price(ALIAS).cost_usd(request_token_bound(req), 8)
    cap = 4.5 * worst
    ledger = SQLiteLedger(tmp_path / "spend.db")
    outcomes: list[str] = []

    async def one() -> None:
        try:
            done = await client.complete(prompt, max_tokens=8, temperature=0)
            outcomes.append(done.trace.engine or "?")
        except BudgetExceededError as exc:
            assert not exc.retryable
            outcomes.append("refused")

    client = HybridClient(
        cloud=cloud(proxy), ledger=ledger, prices=PRICES, budget_caps=[Cap(None, "day", cap)]
    )
    async with client, anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(one)
    settled = [e for e in ledger.entries() if e["state"] == "settled"]
    spent = ledger.spend("day")
    print(f"\ncap ${cap:.6f}; settled ${spent.settled_usd:.6f} over {len(settled)} requests")
    assert spent.settled_usd <= cap and spent.reserved_usd == 0
    assert len(settled) >= 4 and outcomes.count("cloud") == len(settled)
    assert outcomes.count("refused") == 12 - len(settled)
    assert len(proxy.requests()) == len(settled)  # a refused request sent no byte
    # llama_cpp.server sends no usage in a stream: settled from the prompt bound and the
    # deltas counted; the bound holds for the server's real tokenizer and chat template
    assert all(e["estimated"] and 1 <= e["completion_tokens"] <= 8 for e in settled)
    sync = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0)
    reply = await anyio.to_thread.run_sync(
        lambda: sync.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": prompt}], max_tokens=1
        )
    )
    assert reply.usage is not None and reply.usage.prompt_tokens <= request_token_bound(req)
    print(f"prompt tokens {reply.usage.prompt_tokens}, bound {request_token_bound(req)}")
