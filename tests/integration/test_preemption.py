"""Preemption on the device, on the real engine (SmolLM2-135M): an interactive request arriving
while a background one decodes is served at once; the background answer pauses within a decode
step and goes on from its own tokens (nothing repeated, nothing lost), or, in a race whose
policy allows the cloud, moves to the real stand-in cloud mid-answer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from hybridllm import Fallback, HybridClient, LlamaCppEngine, OpenAIEngine, Paused, Policy, Token
from hybridllm.errors import PreemptedError
from hybridllm.runtime.stream import Stream
from hybridllm.testing import FaultProxy
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

COUNT = "Count from 1 to 500, separated by commas."


def counted(text: str) -> list[int]:
    """The numbers the answer counts, in order (SmolLM2 writes "1. 1\\n2. 2\\n..." here)."""
    return [int(n) for n in re.findall(r"\d+", text)]


class Background:
    """A background request: its events as they come, `ready` once it has `n_tokens` tokens,
    and its stream once it has ended."""

    def __init__(self, client: HybridClient, n_tokens: int, **kw: Any) -> None:
        self.client, self.n_tokens, self.kw = client, n_tokens, kw
        self.events: list[object] = []
        self.ready = anyio.Event()
        self.stream: Stream | None = None

    async def run(self) -> None:
        kw = self.kw
        async with self.client.stream(COUNT, priority="background", temperature=0.0, **kw) as s:
            async for e in s.events():
                self.events.append(e)
                if sum(isinstance(x, Token) for x in self.events) >= self.n_tokens:
                    self.ready.set()
        self.stream = s


async def test_an_interactive_request_preempts_a_background_one_which_resumes(
    model_path: Path,
) -> None:
    engine = LlamaCppEngine(model_path, n_ctx=1024)
    async with HybridClient(local=engine) as client:
        back = Background(client, 12, engine="local", max_tokens=120)
        async with anyio.create_task_group() as tg:
            tg.start_soon(back.run)
            with anyio.fail_after(30):
                await back.ready.wait()
            async with client.stream(
                "Say hi.", engine="local", priority="interactive", max_tokens=12
            ) as fg:
                answer = "".join([t async for t in fg])
        bg, events = back.stream, back.events
        assert bg is not None
    assert answer
    tokens = [e.text for e in events if isinstance(e, Token)]
    text = "".join(tokens)
    # the interactive request was served first: it started within a few decode steps of its
    # call, and finished while the background request was paused
    step_s = engine.tpot_s or 0.05
    assert fg.trace.marks["started"] - fg.trace.t_start < 0.3 + 3 * step_s
    assert fg.trace.marks["done"] < bg.trace.marks["done"]
    # the pause is in the trace and the events, once, after the tokens delivered by then
    (pause,) = bg.trace.pauses
    assert "interactive" in pause.reason
    assert (
        pause.paused_at <= fg.trace.marks["started"] <= fg.trace.marks["done"] <= pause.resumed_at
    )
    assert pause.delivered_tokens >= 12
    assert pause.prefill_tokens > 0  # the prompt and the delivered tokens, less the cached prefix
    paused = [e for e in events if isinstance(e, Paused)]
    assert len(paused) == 1 and paused[0].delivered_tokens == pause.delivered_tokens
    # the answer is one count, going on where it stopped: nothing repeated, nothing skipped
    nums = counted(text)[:-1]  # the last one may be cut by max_tokens
    assert len(nums) > 20
    assert nums == sorted(nums) and len(set(nums)) > len(nums) // 2
    values = sorted(set(nums))
    assert values == list(range(values[0], values[-1] + 1))
    # the engine counted every token once, across the pause
    assert bg.trace.completion_tokens == 120 or bg.trace.finish_reason == "stop"
    assert bg.trace.n_tokens <= bg.trace.completion_tokens
    assert not engine.busy and engine.info().queue_depth == 0


async def test_a_preempted_answer_moves_to_the_cloud_where_the_policy_allows(
    model_path: Path, proxy: FaultProxy
) -> None:
    local = LlamaCppEngine(model_path, n_ctx=1024)
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    policy = Policy(
        name="bg", priority="background", routing={"prefer": "local"}, sampling={"max_tokens": 80}
    )
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        back = Background(client, 10, policy=policy)
        async with anyio.create_task_group() as tg:
            tg.start_soon(back.run)
            with anyio.fail_after(30):
                await back.ready.wait()
            async with client.stream(
                "Say hi.", engine="local", priority="interactive", max_tokens=8
            ) as fg:
                assert "".join([t async for t in fg])
        bg, events = back.stream, back.events
        assert bg is not None
    assert bg.trace.started == ("local", "cloud")
    (switch,) = bg.trace.switches
    assert (switch.from_engine, switch.to_engine) == (
        "local",
        "cloud",
    ) and switch.delivered_chars > 0
    assert "preempted" in switch.reason and switch.error_type is PreemptedError
    moves = [e for e in events if isinstance(e, Fallback)]
    assert len(moves) == 1 and "preempted" in moves[0].reason
    tokens = [e for e in events if isinstance(e, Token)]
    assert {t.engine for t in tokens} == {"local", "cloud"}
    assert bg.trace.engine == "cloud" and bg.trace.finish_reason is not None
    assert not bg.trace.pauses  # it moved instead of pausing


async def test_an_interactive_request_waits_about_a_chunk_for_a_background_prefill(
    model_path: Path,
) -> None:
    """A background request with a long prompt is preempted during its prefill: the prefill
    gives the device up between chunks (`LlamaSession.prefill(yield_if=)`), the interactive
    request starts within a few chunks rather than after the whole prompt, and the background
    request then finishes its prefill from what was kept and answers from the start."""
    engine = LlamaCppEngine(model_path, n_ctx=2048, n_threads=1)
    filler = "The quick brown fox jumps over the lazy dog near the river bank. " * 60
    prompt = f"Read this, then ignore it: {filler}\n{COUNT}"
    async with HybridClient(local=engine) as client:
        await client.complete("Hi.", engine="local", max_tokens=2)  # loaded, warm
        bg_stream: list[Stream] = []

        async def background() -> None:
            async with client.stream(
                prompt, engine="local", priority="background", temperature=0.0, max_tokens=8
            ) as s:
                async for _ in s:
                    pass
            bg_stream.append(s)

        async with anyio.create_task_group() as tg:
            tg.start_soon(background)
            await anyio.sleep(0.15)  # the background prefill (~700 tokens) is under way
            async with client.stream(
                "Say hi.", engine="local", priority="interactive", max_tokens=4
            ) as fg:
                answer = "".join([t async for t in fg])
    (bg,) = bg_stream
    assert answer and bg.trace.error is None and bg.trace.completion_tokens
    fm, bm = fg.trace.marks, bg.trace.marks
    assert bm["started"] < fm["queued"] < bm["prefill_done"]  # it came during the prefill
    assert fm["done"] < bm["prefill_done"]  # and was served before the prefill went on
    # waited about a chunk (8 tokens), not the rest of a prefill of some 700 tokens
    assert fm["started"] - fm["queued"] < 0.25 < bm["prefill_done"] - bm["started"]
