"""The speculative plan against real parts through dialect (a), echo + logprobs, on a real
`llama_cpp.server` started with `--logits_all true`, reached through a FaultProxy: the local
SmolLM2 engine drafts; Qwen2.5-Coder 0.5B verifies (another model, without a BOS token, so the
server's echo rows are shifted and the generated token has no entry of its own), and SmolLM2
itself verifies for the tests of failover, cancellation and money.

The echo path of llama-cpp-python's server is slow (it sorts the whole vocabulary in Python for
every prompt position), so prompts and answers are short. Losslessness is judged on one answer
at a time: the server itself is asked, by one more echo request over the prompt and the
committed answer, whether each committed token is its greedy choice at that position, or a
near-tie (top two within 0.05 nats).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from hybridllm import HybridClient, LlamaCppEngine, ModelPrice, OpenAIEngine, Prices, SQLiteLedger
from hybridllm.events import Done, Draft, Fallback, Token
from hybridllm.local.resolve import resolve_model
from hybridllm.policy import Policy
from hybridllm.runtime.plans.speculative.dialect_llama import echo_shift
from hybridllm.runtime.plans.speculative.verifier import greedy_and_gap
from hybridllm.testing import FaultProxy, Faults, LlamaServer
from tests.integration.drafts import drafts_add_up
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

NEAR_TIE = 0.05
PROMPTS = {
    "code": "Write a Python function that adds two numbers.",
    "list": "List three colors.",
}
VERIFIER = "qwen2.5-coder-0.5b-instruct"  # another model than the drafter, and no BOS token


@pytest.fixture(scope="module")
def verify_server(model_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(
        model_path, alias=ALIAS, api_key=API_KEY, n_ctx=1024, extra_args=["--logits_all", "true"]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def qwen_server() -> Iterator[LlamaServer]:
    path = resolve_model(VERIFIER, pull=True)
    with LlamaServer(
        path, alias="qwen", api_key=API_KEY, n_ctx=1024, extra_args=["--logits_all", "true"]
    ) as server:
        yield server


@pytest.fixture
def vproxy(verify_server: LlamaServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", verify_server.port), faults=Faults()) as p:
        yield p


def client_for(url: str, model_path: Path, alias: str = ALIAS, **kwargs: object) -> HybridClient:
    local = LlamaCppEngine(model_path, warm_up=False)
    # the echo path takes seconds per request on busy cores: verification has the cloud
    # engine's own timeout, so it is the engine's that is long here
    cloud = OpenAIEngine(base_url=url + "/v1", api_key=API_KEY, model=alias, timeout=300.0)
    return HybridClient(local, cloud, router=None, **kwargs)  # type: ignore[arg-type]


def greedy_or_tie(server: LlamaServer, prompt_text: str, answer: str, upto: int) -> list[str]:
    """The committed tokens (of the first `upto` characters: the verified ones) that are
    neither the server's greedy choice nor a near-tie. A greedy token that reads as "" (a piece
    of a character split over tokens) cannot be judged from strings and is skipped."""
    body = {"model": server.model, "prompt": prompt_text + answer, "echo": True, "logprobs": 2,
            "max_tokens": 1, "temperature": 0.0}  # fmt: skip
    r = httpx2.post(server.base_url + "/completions", json=body, timeout=300,
                    headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    data = r.json()
    shift = echo_shift(data)
    assert shift is not None
    lp = data["choices"][0]["logprobs"]
    # the generated token has an entry of its own only where the rows are not shifted
    generated = data["usage"]["completion_tokens"] >= 1
    n = len(lp["tokens"]) - (1 if shift == 0 and generated else 0)
    tokens, top = lp["tokens"][:n], lp["top_logprobs"]
    starts, pos = [], 0
    for t in tokens:
        starts.append(pos)
        pos += len(t)
    boundary = pos - len(answer)
    bad = []
    for i, tok in enumerate(tokens):
        if starts[i] < boundary or starts[i] - boundary >= upto:
            continue
        want, gap = greedy_and_gap(top[i - shift])
        if want != tok and want != "" and not (gap is not None and gap < NEAR_TIE):
            bad.append(f"{tok!r} at {starts[i] - boundary}: greedy {want!r} (gap {gap})")
    return bad


async def test_committed_text_is_the_verifiers_greedy_text(
    qwen_server: LlamaServer, model_path: Path
) -> None:
    """Every round is judged (the plan never streams plainly), and what it commits is Qwen's
    greedy text: two Latin-script prompts, kept short (a one-line system prompt, 6 tokens, a
    fixed k), one probe."""
    fixed = Policy(name="fixed-k", speculative={"k": 8})  # never steps aside for pay
    async with client_for(qwen_server.url, model_path, alias="qwen") as client:
        for kind, prompt in PROMPTS.items():
            messages = [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": prompt},
            ]
            async with client.stream(
                messages,
                policy=fixed,
                plan="speculative",
                show_drafts=True,
                max_tokens=6,
                temperature=0,
            ) as s:
                events = [e async for e in s.events()]
            spec = s.trace.speculation
            assert spec is not None and spec.verifier.startswith("echo-logprobs"), spec
            assert spec.rounds >= 1 and spec.switched is None, (kind, spec)  # all judged
            assert spec.drafted >= spec.accepted
            assert len(spec.k) == len(spec.verify_ms) == spec.rounds
            text = "".join(e.text for e in events if isinstance(e, Token))
            assert text and isinstance(events[-1], Done)
            assert s.trace.engine == "cloud"
            assert {"speculative", "speculative_asked"} & set(s.trace.reason_codes)
            drafts_add_up(events)
            local = client.local
            assert isinstance(local, LlamaCppEngine) and local._session is not None
            rendered = local._session.render(messages)
            upto = len(text) if spec.switched_at is None else spec.switched_at
            bad = await anyio.to_thread.run_sync(greedy_or_tie, qwen_server, rendered, text, upto)
            assert not bad, (kind, text, bad)


async def test_a_server_without_verification_streams_plainly_and_says_why(
    model_path: Path,
) -> None:
    """llama_cpp.server with --logits_all false (its default is true): probed, no dialect,
    plain streaming, the reason in the trace."""
    with LlamaServer(model_path, alias=ALIAS, api_key=API_KEY, n_ctx=1024,
                     extra_args=["--logits_all", "false"]) as plain:  # fmt: skip
        await _plain_server(plain.url, model_path)


async def _plain_server(url: str, model_path: Path) -> None:
    async with client_for(url, model_path) as client:
        async with client.stream("Say hello.", plan="speculative", max_tokens=12,
                                 temperature=0) as s:  # fmt: skip
            text = "".join([t async for t in s])
    spec = s.trace.speculation
    assert text
    assert spec is not None and spec.unverified == "no_dialect", spec
    assert spec.rounds == 0 and "logits_all" in spec.verifier


async def test_a_verification_failing_mid_answer_fails_over_locally_with_nothing_lost(
    vproxy: FaultProxy, model_path: Path
) -> None:
    async with client_for(vproxy.url, model_path) as client:
        async with client.stream(PROMPTS["list"], plan="speculative", max_tokens=30,
                                 temperature=0) as s:  # fmt: skip
            events = []
            async for e in s.events():
                events.append(e)
                if isinstance(e, Token) and len(events) < 10:
                    vproxy.faults = Faults(reset_after_bytes=0)  # every later call is reset
    tokens = [e for e in events if isinstance(e, Token)]
    before = "".join(e.text for e in tokens if e.engine == "cloud")
    after = "".join(e.text for e in tokens if e.engine == "local")
    fell = [e for e in events if isinstance(e, Fallback)]
    spec = s.trace.speculation
    assert fell and fell[0].to_engine == "local" and "verification failed" in fell[0].reason
    assert fell[0].cause == s.trace.fallback_cause == "mid_stream"
    assert spec is not None and spec.switched_at == len(before) and before
    assert s.trace.switches[0].delivered_chars == len(before)
    assert after and isinstance(events[-1], Done)  # the local engine went on from there
    assert s.trace.error is None


async def test_cancelling_during_a_verification_call_closes_it_and_stops_drafting(
    vproxy: FaultProxy, model_path: Path
) -> None:
    async with client_for(vproxy.url, model_path) as client:
        # probe first (unstalled), so the stall below hits a verification round
        async with client.stream("Hi.", plan="speculative", max_tokens=2, temperature=0) as s0:
            _ = [t async for t in s0]
        vproxy.faults = Faults(first_byte_stall_ms=60_000)
        n_conn = len(vproxy.connections)
        s = client.stream(PROMPTS["list"], plan="speculative", show_drafts=True, max_tokens=30,
                          temperature=0)  # fmt: skip
        async for e in s.events():
            if isinstance(e, Draft):
                break  # the verification call of this draft is in flight now
        await anyio.sleep(0.3)
        t0 = time.perf_counter()
        await s.aclose()
        closed_in = time.perf_counter() - t0
        local = client.local
        assert isinstance(local, LlamaCppEngine)
        holder = local._queue.holder  # drafting let go of the local model: a warm-up (idle,
        assert holder is None or holder.idle  # any request cuts it) may have the turn since
    assert closed_in < 2.0
    conns = vproxy.connections[n_conn:] or vproxy.connections
    assert vproxy.wait_client_closed(conns[-1].id, timeout=5.0) is not None


async def test_verification_calls_are_settled_in_the_budget(
    vproxy: FaultProxy, model_path: Path
) -> None:
    prices = Prices(models={ALIAS: ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    ledger = SQLiteLedger()
    async with client_for(vproxy.url, model_path, prices=prices, ledger=ledger) as client:
        r = await client.complete(PROMPTS["code"], plan="speculative", max_tokens=16,
                                  temperature=0)  # fmt: skip
    spec = r.trace.speculation
    assert spec is not None and spec.rounds >= 1
    verif = [x for x in r.trace.spent if x.role == "verification"]
    assert len(verif) == spec.rounds
    # the endpoint was probed by this first request: its fixed requests are billed too
    probes = [x for x in r.trace.spent if x.role == "probe"]
    assert probes and all(p.prompt_tokens > 0 and not p.estimated for p in probes), probes
    # each round bills the whole context again: the prompt tokens grow round by round
    assert all(v.prompt_tokens > 0 and not v.estimated for v in verif)
    assert [v.prompt_tokens for v in verif] == sorted(v.prompt_tokens for v in verif)
    assert r.trace.cost_usd == pytest.approx(sum(v.usd for v in [*verif, *probes]))
    assert r.trace.cost_usd and r.trace.cost_usd > 0


async def test_token_level_rounds_commit_exactly_the_verifiers_tokens(model_path: Path) -> None:
    """Dialect (b)'s bookkeeping with the real local drafter: a MockTransport stands in for a
    vLLM server (documented `prompt_logprobs` shape, named as such) whose greedy answer is a
    fixed token sequence; the committed text must be exactly that sequence's text."""
    import json as _json

    import openai

    from hybridllm.runtime.plans.speculative.dialect_vllm import PromptLogprobsVerifier
    from hybridllm.runtime.plans.speculative.verifier import Probed

    local = LlamaCppEngine(model_path, warm_up=False)
    await local.start()
    assert local._session is not None
    sess = local._session
    prompt_ids = sess.tokenize(sess.render([{"role": "user", "content": "Say a fact."}]))
    target = sess.tokenize("The sky is blue because air scatters blue light more than red.")
    calls: list[int] = []
    eos = sess.llm.token_eos()

    def piece(tok: int) -> str:
        return bytes(sess.llm.detokenize([tok])).decode("utf-8", "ignore")

    def handler(request: httpx2.Request) -> httpx2.Response:
        ids = _json.loads(request.content)["prompt"]
        calls.append(len(ids))
        assert ids[: len(prompt_ids)] == prompt_ids
        plp: list[object] = [None] * len(ids)
        for p in range(len(prompt_ids), len(ids)):
            # past the fixed answer, the greedy token is the end of the answer (EOS)
            want = target[p - len(prompt_ids)] if p - len(prompt_ids) < len(target) else eos
            e = {str(want): {"logprob": -0.1, "rank": 1, "decoded_token": piece(want)}}
            if ids[p] != want:
                e[str(ids[p])] = {"logprob": -3.0, "rank": 5, "decoded_token": piece(ids[p])}
            plp[p] = e
        nxt = len(ids) - len(prompt_ids)
        gen = ({"text": piece(target[nxt]), "finish_reason": "length",
                "logprobs": {"tokens": [f"token_id:{target[nxt]}"], "top_logprobs": [{}]}}
               if nxt < len(target) else {"text": "", "finish_reason": "stop"})  # fmt: skip
        body = {"choices": [{"index": 0, "prompt_logprobs": plp, **gen}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": 1}}  # fmt: skip
        return httpx2.Response(200, json=body)

    want_text = "".join(piece(t) for t in target)
    mock = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    cloud = OpenAIEngine(base_url="http://m/v1", api_key="x", model="vllm-mock")
    # the engine's own client on the mock: verification goes through it
    cloud._client = openai.AsyncOpenAI(
        base_url="http://m/v1", api_key="x", max_retries=0, http_client=mock
    )
    client = HybridClient(local, cloud, router=None)
    client.routing.speculation.verifiers[("http://m/v1", "vllm-mock")] = Probed(
        PromptLogprobsVerifier(), "prompt-logprobs (MockTransport)"
    )
    async with client:
        # a fixed k: the plan never steps aside to plain streaming (the mock cannot stream)
        fixed = Policy(name="fixed-k", speculative={"k": 4})
        r = await client.complete(
            "Say a fact.", policy=fixed, plan="speculative", max_tokens=64, temperature=0
        )
    await mock.aclose()
    spec = r.trace.speculation
    assert spec is not None and spec.verifier == "prompt-logprobs (MockTransport)"
    assert r.text == want_text, (r.text, want_text)
    assert spec.rounds == len(calls) <= len(target) + 1 and spec.switched is None
    assert r.trace.finish_reason == "stop"
