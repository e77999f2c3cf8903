"""Prompt-lookup drafting on the real SmolLM2 engine: same tokens as plain greedy decoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import errors
from hybridllm.engines import GenerationRequest, LlamaCppEngine, LlamaOptions
from hybridllm.events import Delta, Finish

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CODE = """def total_price(items, tax):
    x = 0
    for item in items:
        x += item.price * item.quantity
    x = x * (1 + tax)
    return round(x, 2)
"""

PROMPTS = [
    "Rename the variable x to subtotal in this function. Reply with the code only.\n\n" + CODE,
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river.",
    "Write a haiku about autumn.",  # little to copy: drafts are mostly rejected
]


async def run(
    engine: LlamaCppEngine, prompt: str, options: LlamaOptions | None = None
) -> tuple[str, Finish]:
    req = GenerationRequest(
        [{"role": "user", "content": prompt}],
        max_tokens=80,
        temperature=0.0,
        options=() if options is None else (options,),
    )
    text, finish = [], None
    async for chunk in engine.stream(req):
        if isinstance(chunk, Delta):
            text.append(chunk.text)
        elif isinstance(chunk, Finish):
            finish = chunk
    assert finish is not None
    return "".join(text), finish


async def test_prompt_lookup_output_equals_plain_greedy(model_path: Path) -> None:
    engine = LlamaCppEngine(model_path, n_ctx=1024)
    try:
        for prompt in PROMPTS:
            plain, f1 = await run(engine, prompt)
            drafted, f2 = await run(engine, prompt, LlamaOptions(draft="prompt-lookup"))
            assert drafted == plain
            assert (f2.reason, f2.completion_tokens) == (f1.reason, f1.completion_tokens)
            again, _ = await run(engine, prompt)  # the KV cache stayed consistent
            assert again == plain
        stats = engine.draft_stats
        assert stats is not None and stats.accepted > 0 and stats.batches > 0
    finally:
        await engine.aclose()


async def test_engine_level_draft_and_opt_out(model_path: Path) -> None:
    engine = LlamaCppEngine(model_path, n_ctx=1024, draft="prompt-lookup")
    try:
        drafted, _ = await run(engine, PROMPTS[1])
        stats = engine.draft_stats
        assert stats is not None and stats.batches > 0
        before = stats.batches
        plain, _ = await run(engine, PROMPTS[1], LlamaOptions(draft="off"))
        assert stats.batches == before  # opted out: plain decoding
        assert plain == drafted
        # sampled requests never draft
        req = GenerationRequest([{"role": "user", "content": PROMPTS[1]}], max_tokens=8)
        async for _ in engine.stream(req):
            pass
        assert stats.batches == before
    finally:
        await engine.aclose()


async def test_unknown_draft_mode_is_a_config_error(model_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="draft"):
        LlamaCppEngine(model_path, draft="medusa")  # type: ignore[arg-type]
