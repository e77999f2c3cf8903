"""Prompt-lookup drafting on the real SmolLM2 engine, judged token by token.

Two generations are never compared with each other (see DESIGN.md, "Greedy is not reproducible
across cache states"): each answer's exact token ids (as the engine formatted the prompt and
emitted the answer) are evaluated once more in ONE separate llama.cpp evaluation with logits at
every position, and every emitted token must be the model's greedy choice there, or within a
near-tie (`TIE_MARGIN` logits) of it. The end of the answer must agree with its finish reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm import errors
from hybridllm.engines import GenerationRequest, LlamaCppEngine, LlamaOptions
from hybridllm.engines.llama.prompt_lookup import TIE_MARGIN, PromptLookup
from hybridllm.engines.llama.session import Generation
from hybridllm.events import Delta, Finish
from hybridllm.local import loader

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

MAX_TOKENS = 80

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


@dataclass
class Answer:
    """One stream: its text and finish event, and the exact tokens the engine used."""

    text: str
    finish: Finish
    prompt: list[int]  # the prompt as the engine templated and tokenized it
    tokens: list[int]  # the emitted tokens, without the end-of-generation token


async def run(engine: LlamaCppEngine, prompt: str, options: LlamaOptions | None = None) -> Answer:
    req = GenerationRequest(
        [{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        options=() if options is None else (options,),
    )
    await engine.start()
    session: Any = engine._session
    seen: list[Generation] = []
    prefill = session.prefill

    def recording_prefill(*args: Any, **kwargs: Any) -> Generation:
        gen: Generation = prefill(*args, **kwargs)
        seen.append(gen)
        return gen

    session.prefill = recording_prefill  # the generation keeps its prompt and emitted tokens
    text, finish = [], None
    try:
        async for chunk in engine.stream(req):
            if isinstance(chunk, Delta):
                text.append(chunk.text)
            elif isinstance(chunk, Finish):
                finish = chunk
    finally:
        del session.prefill
    assert finish is not None and len(seen) == 1
    gen = seen[0]
    return Answer("".join(text), finish, list(gen.prepared.tokens), list(gen.tokens_out))


class GreedyChecker:
    """Re-evaluates prompt + answer in one llama.cpp batch with logits at every position."""

    def __init__(self, model_path: Path) -> None:
        llama_cpp = loader.llama_cpp()
        self.llm: Any = llama_cpp.Llama(
            model_path=str(model_path), n_ctx=1024, n_batch=1024, logits_all=True, verbose=False
        )
        vocab = self.llm._model.vocab
        is_eog = llama_cpp.llama_vocab_is_eog
        self.eog = np.array([t for t in range(self.llm.n_vocab()) if is_eog(vocab, t)])

    def violations(self, answer: Answer, margin: float = TIE_MARGIN) -> list[str]:
        """Positions where the answer left the model's greedy choice by more than `margin`
        logits, or where its end disagrees with the finish reason; empty when all is well."""
        prompt, tokens, finish = answer.prompt, answer.tokens, answer.finish
        bad: list[str] = []
        if finish.prompt_tokens != len(prompt):
            bad.append(f"prompt_tokens {finish.prompt_tokens} != {len(prompt)}")
        text = self.llm.detokenize(tokens).decode("utf-8", errors="replace")
        if answer.text != text:
            bad.append(f"streamed text {answer.text!r} != its tokens' text {text!r}")
        if np.isin(tokens, self.eog).any():
            bad.append("an end-of-generation token inside the answer")
        llm = self.llm
        llm.reset()
        llm.eval(prompt + tokens)
        rows = llm.scores[len(prompt) - 1 : len(prompt) + len(tokens)]  # row j predicts tokens[j]
        for j, tok in enumerate(tokens):
            row = rows[j]
            gap = float(row.max() - row[tok])
            if gap > margin:
                best = int(row.argmax())
                bad.append(f"token {j} ({tok}) is {gap:.3f} below the greedy choice {best}")
        end = rows[len(tokens)]
        eog_gap = float(end.max() - end[self.eog].max())
        if finish.reason == "stop":
            if finish.completion_tokens != len(tokens) + 1:
                bad.append(f"stop after {finish.completion_tokens} tokens, {len(tokens)} emitted")
            if eog_gap > margin:
                bad.append(f"stopped, but end-of-generation is {eog_gap:.3f} below greedy")
        elif finish.reason == "length":
            if finish.completion_tokens != len(tokens) or len(tokens) != MAX_TOKENS:
                bad.append(f"length after {finish.completion_tokens} tokens, {len(tokens)} emitted")
        else:
            bad.append(f"unexpected finish reason {finish.reason!r}")
        return bad

    def close(self) -> None:
        self.llm.close()


@pytest.fixture(scope="module")
def checker(model_path: Path) -> Iterator[GreedyChecker]:
    c = GreedyChecker(model_path)
    try:
        yield c
    finally:
        c.close()


def tampered(checker: GreedyChecker, answer: Answer) -> tuple[Answer, int]:
    """The answer with one token swapped for the runner-up at a position with a clear winner:
    what a drafter that accepted a wrong draft token would emit."""
    llm = checker.llm
    llm.reset()
    llm.eval(answer.prompt + answer.tokens)
    rows = llm.scores[len(answer.prompt) - 1 : len(answer.prompt) + len(answer.tokens)]
    for j in range(len(answer.tokens) // 2, len(answer.tokens)):
        top2 = np.sort(rows[j])[-2:]
        if top2[1] - top2[0] > 2 * TIE_MARGIN:
            wrong = int(np.argsort(rows[j])[-2])
            tokens = [*answer.tokens[:j], wrong, *answer.tokens[j + 1 :]]
            text = llm.detokenize(tokens).decode("utf-8", errors="replace")
            return Answer(text, answer.finish, answer.prompt, tokens), j
    raise AssertionError("no position with a clear greedy choice")


async def test_prompt_lookup_tokens_are_greedy(model_path: Path, checker: GreedyChecker) -> None:
    engine = LlamaCppEngine(model_path, n_ctx=1024)
    try:
        drafted_answers = []
        for prompt in PROMPTS:
            drafted = await run(engine, prompt, LlamaOptions(draft="prompt-lookup"))
            assert checker.violations(drafted) == [], prompt
            drafted_answers.append(drafted)
            again = await run(engine, prompt)  # plain decoding: the KV cache stayed consistent
            assert checker.violations(again) == [], prompt
        stats = engine.draft_stats
        assert stats is not None and stats.accepted > 0 and stats.batches > 0
        # the checker catches a drafter that lets one wrong token through
        bad, j = tampered(checker, drafted_answers[0])
        assert any(v.startswith(f"token {j} ") for v in checker.violations(bad))
    finally:
        await engine.aclose()


async def test_checker_rejects_a_drafter_that_skips_verification(
    model_path: Path, checker: GreedyChecker, monkeypatch: pytest.MonkeyPatch
) -> None:
    verify = PromptLookup._verify

    def accept_blindly(self: PromptLookup, draft: list[int]) -> list[int]:
        """Emit every draft token unchecked (the KV cache kept consistent)."""
        if not draft:
            return verify(self, draft)
        llm = self._llm
        n_past = llm.n_tokens
        self._decode([self._pending, *draft], n_past)
        llm.n_tokens = n_past + len(draft)
        llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
        self.batches += 1
        return list(draft)

    monkeypatch.setattr(PromptLookup, "_verify", accept_blindly)
    engine = LlamaCppEngine(model_path, n_ctx=1024)
    try:
        answer = await run(engine, PROMPTS[0], LlamaOptions(draft="prompt-lookup"))
        assert any(v.startswith("token ") for v in checker.violations(answer))
    finally:
        await engine.aclose()


async def test_engine_level_draft_and_opt_out(model_path: Path, checker: GreedyChecker) -> None:
    engine = LlamaCppEngine(model_path, n_ctx=1024, draft="prompt-lookup")
    try:
        drafted = await run(engine, PROMPTS[1])
        stats = engine.draft_stats
        assert stats is not None and stats.batches > 0
        assert checker.violations(drafted) == []
        before = stats.batches
        plain = await run(engine, PROMPTS[1], LlamaOptions(draft="off"))
        assert stats.batches == before  # opted out: plain decoding
        assert checker.violations(plain) == []
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
