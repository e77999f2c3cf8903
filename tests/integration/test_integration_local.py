"""The real llama-cpp-python engine on a real GGUF (SmolLM2-135M), through HybridClient."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from hybridllm import Done, HybridClient, LlamaCppEngine, Route, Token, Usage
from hybridllm.errors import ContextOverflowError, ModelCorruptError, ModelNotFoundError

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

LONG = "Count from 1 to 500, separated by commas."


def make_client(model_path: Path, **kw: object) -> tuple[HybridClient, LlamaCppEngine]:
    engine = LlamaCppEngine(model_path, n_ctx=1024, **kw)  # type: ignore[arg-type]
    return HybridClient(local=engine), engine


async def wait_stopped(engine: LlamaCppEngine) -> float:
    """Wait (2 s at most) until the engine's worker has stopped; return when it stopped."""
    with anyio.fail_after(2.0):
        while engine.busy:  # noqa: ASYNC110 - observing the engine from outside
            await anyio.sleep(0.002)
    assert engine.stopped_at is not None
    return engine.stopped_at


async def test_stream_tokens_and_trace(model_path: Path) -> None:
    client, engine = make_client(model_path)
    async with client:
        assert engine.prefill_tps and engine.tpot_s  # warm-up measured the engine
        s = client.stream("Name three colours.", engine="local", max_tokens=24, temperature=0)
        tokens = [t async for t in s]
    trace = s.trace
    assert tokens and all(tokens)
    assert trace.engine == "local"
    assert trace.n_tokens == len(tokens)
    assert trace.ttft_ms is not None and trace.ttft_ms > 0
    assert trace.tpot_ms is not None and trace.tpot_ms > 0
    assert len(trace.itl_ms) == len(tokens) - 1
    assert trace.prompt_tokens and trace.prompt_tokens > 5
    assert trace.completion_tokens and trace.completion_tokens >= len(tokens)
    assert trace.finish_reason in ("stop", "length")
    seg = trace.segments_ms
    assert list(seg)[:3] == ["queued", "started", "prefill_done"]
    assert seg["first_token"] <= seg["done"]


async def test_events_form(model_path: Path) -> None:
    """Each stream's events agree with themselves and its trace; two streams' texts are never
    compared (greedy text is not reproducible across KV-cache states, DESIGN.md)."""
    client, _ = make_client(model_path)
    async with client:
        for _ in range(2):  # the second request runs with the prompt in the KV cache
            async with client.stream(
                "What is 2+2?", engine="local", max_tokens=16, temperature=0
            ) as s:
                events = [e async for e in s.events()]
            assert isinstance(events[0], Route) and events[0].engine == "local"
            usage, done = events[-2], events[-1]
            assert isinstance(usage, Usage) and isinstance(done, Done)
            assert done.trace is s.trace
            tokens = [e for e in events if isinstance(e, Token)]
            assert "".join(t.text for t in tokens) and {t.engine for t in tokens} == {"local"}
            assert (
                s.trace.n_tokens == len(tokens)
                and tuple(t.t for t in tokens) == s.trace.token_times
            )
            assert usage.completion_tokens == s.trace.completion_tokens >= len(tokens)


async def test_the_seed_reaches_llama_cpp(model_path: Path) -> None:
    """A request's seed is the sampler's seed; without one, each request draws its own. Judged
    on what llama.cpp is given, never by comparing two generations (DESIGN.md)."""
    client, engine = make_client(model_path)
    async with client:
        await client.complete("Hi", engine="local", max_tokens=1)  # loads the model
        llm = engine._session.llm  # type: ignore[union-attr]
        seeds: list[int] = []
        real = llm.set_seed
        llm.set_seed = lambda seed: (seeds.append(seed), real(seed))[1]
        try:
            for seed in (7, 7, None, None):
                res = await client.complete("Tell me a word.", engine="local", max_tokens=4,
                                            seed=seed)  # fmt: skip
                assert res.text  # each request still answers
        finally:
            llm.set_seed = real
    assert seeds[:2] == [7, 7] and len(seeds) == 4 and seeds[2] != seeds[3]


async def test_stop_strings_cut_the_text(model_path: Path) -> None:
    """One greedy answer with a stop string: it ends there ("stop", before max_tokens) and the
    app never sees the stop string."""
    client, _ = make_client(model_path)
    async with client:
        res = await client.complete(LONG, engine="local", max_tokens=40, temperature=0, stop="5")
    assert "5" not in res.text
    assert res.trace.finish_reason == "stop" and res.trace.completion_tokens < 40


async def test_break_stops_generation_within_a_step(model_path: Path) -> None:
    client, engine = make_client(model_path)
    async with client:
        n = 0
        async for _ in client.stream(LONG, engine="local", max_tokens=400):
            n += 1
            if n == 3:
                break
        t_left = time.perf_counter()
        stopped = await wait_stopped(engine)
        steps = engine.steps_total
        await anyio.sleep(0.2)
        assert engine.steps_total == steps  # nothing decodes any more
        assert stopped - t_left < 0.5
        assert steps < 20


async def test_exception_in_loop_stops_generation(model_path: Path) -> None:
    client, engine = make_client(model_path)
    async with client:
        with pytest.raises(KeyError):
            async for _ in client.stream(LONG, engine="local", max_tokens=400):
                raise KeyError("app failed")
        await wait_stopped(engine)
        assert engine.steps_total < 20


async def test_cancelled_consumer_stops_generation(model_path: Path) -> None:
    client, engine = make_client(model_path)
    async with client:
        got: list[str] = []
        # cancelled from outside once a few tokens arrived: a timer would race the model's own
        # end of answer, whose length differs between CPUs
        with anyio.CancelScope() as scope:
            async for token in client.stream(LONG, engine="local", max_tokens=400):
                got.append(token)
                if len(got) == 3:
                    scope.cancel()
        assert scope.cancelled_caught and len(got) == 3
        await wait_stopped(engine)
        steps = engine.steps_total
        await anyio.sleep(0.1)
        assert engine.steps_total == steps


async def test_cancel_during_long_prefill_aborts_llama_decode(model_path: Path) -> None:
    client, engine = make_client(model_path, n_batch=1024)
    prompt = "word " * 900
    async with client:
        t0 = time.perf_counter()
        full = await client.complete(prompt, engine="local", max_tokens=1)
        full_prefill = time.perf_counter() - t0
        async with client.stream("other " * 900, engine="local", max_tokens=4) as s:
            await anyio.sleep(full_prefill * 0.2)
        # `async with` waited for the worker: it must have stopped well before a full prefill
        assert time.perf_counter() - t0 - full_prefill < full_prefill * 0.8
        assert s.trace.n_tokens == 0
        assert full.trace.completion_tokens == 1


async def test_requests_queue_one_at_a_time(model_path: Path) -> None:
    client, engine = make_client(model_path)
    async with client:
        first = client.stream(LONG, engine="local", max_tokens=30)
        second = client.stream(LONG, engine="local", max_tokens=30)
        await anyio.sleep(0.05)
        info = engine.info()
        assert info.queue_depth == 2
        assert info.expected_wait_s > 0
        async with first, second:
            a = [t async for t in first]
            b = [t async for t in second]
        assert a and b
        # one at a time: the one the engine took second started only after the other finished.
        # Which goes first is not the order of the calls: each request's facts (the privacy
        # scan) are gathered on a worker thread, and under load the second's may end first.
        ran = sorted((first.trace, second.trace), key=lambda t: t.marks["started"])
        assert ran[1].marks["started"] >= ran[0].marks["done"] - 0.01
        assert engine.info().queue_depth == 0


async def test_shared_prefix_reuses_kv_cache(model_path: Path) -> None:
    system = {"role": "system", "content": "You are a terse assistant. " * 30}
    client, _ = make_client(model_path)
    async with client:
        a = await client.complete(
            [system, {"role": "user", "content": "Hi"}], engine="local", max_tokens=4
        )
        b = await client.complete(
            [system, {"role": "user", "content": "Bye now"}], engine="local", max_tokens=4
        )
    assert a.trace.prompt_tokens and b.trace.prompt_tokens
    assert b.trace.cached_prompt_tokens is not None
    assert b.trace.cached_prompt_tokens > a.trace.prompt_tokens * 0.8


async def test_prompt_longer_than_context_is_refused_before_work(model_path: Path) -> None:
    client, engine = make_client(model_path)
    async with client:
        steps = engine.steps_total
        with pytest.raises(ContextOverflowError) as info:
            async for _ in client.stream("hello " * 2000, engine="local"):
                pass
        assert info.value.n_ctx == 1024 and info.value.prompt_tokens > 1024
        assert info.value.engine == "local" and not info.value.received_content
        assert engine.steps_total == steps
        # the engine is still usable afterwards
        assert (await client.complete("Hi", engine="local", max_tokens=3)).text


async def test_missing_model_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        async with HybridClient(local=LlamaCppEngine(missing)):
            pass


async def test_corrupt_model_names_the_file(tmp_path: Path, model_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all" * 100)
    with pytest.raises(ModelCorruptError, match="bad.gguf"):
        async with HybridClient(local=LlamaCppEngine(bad)):
            pass
    truncated = tmp_path / "truncated.gguf"
    with model_path.open("rb") as fh:
        truncated.write_bytes(fh.read(1_000_000))
    with pytest.raises(ModelCorruptError, match="truncated.gguf"):
        async with HybridClient(local=LlamaCppEngine(truncated)):
            pass


def test_blocking_wrappers(model_path: Path) -> None:
    with HybridClient(local=LlamaCppEngine(model_path, n_ctx=1024)) as client:
        tokens = list(client.stream_sync("Say hello.", max_tokens=8, temperature=0))
        assert tokens and all(tokens)
        res = client.complete_sync("Say hello.", max_tokens=8, temperature=0)
        # its own figures only: a second greedy run need not repeat the first's text (DESIGN.md)
        assert res.text and res.trace.engine == "local" and res.trace.n_tokens > 0
        for i, _ in enumerate(client.stream_sync(LONG, max_tokens=300)):
            if i == 2:
                break
        assert client.local is not None and not client.local.busy  # type: ignore[attr-defined]


MIXED = [
    {"role": "system", "content": "Réponds en une phrase. 簡潔に答えてください。"},
    {
        "role": "user",
        "content": "请用一句话解释递归。Объясни рекурсию. شرح العودية 🙂\ndef f(n): return f(n-1)",
    },
]


async def test_routing_counts_prompt_tokens_with_the_real_tokenizer(model_path: Path) -> None:
    """With the local engine loaded, the prompt-token figure that routing, the latency model
    and the budget pre-check use is the tokenizer's own count: what the prefill evaluates."""
    from hybridllm.engines.base import count_prompt_tokens, estimate_prompt_tokens

    client, engine = make_client(model_path)
    assert engine.count_tokens(MIXED) is None  # not loaded: routing falls back to the estimate
    async with client:
        counted = engine.count_tokens(MIXED)
        assert counted is not None and engine.count_tokens(MIXED) == counted  # cached
        assert count_prompt_tokens(MIXED, client.engines.values()) == counted
        async with client.stream(MIXED, max_tokens=2, temperature=0) as s:
            usage = [e async for e in s.events() if isinstance(e, Usage)]
        facts = client.decide(MIXED).facts
    assert usage[0].prompt_tokens == counted == facts.prompt_tokens
    est = estimate_prompt_tokens(MIXED)
    print(f"\nmixed-script prompt: tokenizer {counted}, estimate {est}")
    assert 0.5 * counted <= est <= 1.5 * counted
