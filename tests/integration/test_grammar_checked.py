"""The checked grammar (`hybridllm.engines.llama.grammar.CheckedGrammar`) against llama.cpp's
grammar over the whole vocabulary, on the real model's vocabulary and real grammars: on the
same logits, the greedy choice is the same token and, under sampling, the tokens that survive
top-k and min-p are the same set. Logits are drawn (seeded) so that every path runs: the model's
first choice allowed, refused with an allowed token among the best, and refused with none."""

from __future__ import annotations

import ctypes
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.engines.llama.grammar import CheckedGrammar
from hybridllm.engines.llama.toolcalls import answer_gbnf, call_gbnf
from hybridllm.tools import tool_spec

SCHEMA = {  # a forecast request: strings, an enum, a bounded integer, an optional nested object
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "at": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        },
    },
    "required": ["city", "days", "unit"],
}
TOOL = {"type": "function", "function": {"name": "forecast", "parameters": SCHEMA}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": SCHEMA}}
GRAMMARS = {
    "json_schema": lambda: answer_gbnf(tool_spec(None, None, FORMAT).response_format),
    "json_object": lambda: answer_gbnf(
        tool_spec(None, None, {"type": "json_object"}).response_format
    ),
    "tool_call": lambda: call_gbnf(tool_spec([TOOL], "required", None).callable_tools),
}
TOP_K, MIN_P = 40, 0.05


@pytest.fixture(scope="module")
def llm(model_path: Path) -> Any:
    import llama_cpp

    return llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)


class Whole:
    """llama.cpp's grammar sampler applied to the whole vocabulary (the reference)."""

    def __init__(self, llm: Any, grammar: str) -> None:
        import llama_cpp

        self.lc, self.n = llama_cpp, llm.n_vocab()
        self.sampler = llama_cpp.llama_sampler_init_grammar(
            llm._model.vocab, grammar.encode(), b"root"
        )

    def allowed(self, logits: np.ndarray) -> np.ndarray:
        dtype = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
        data = np.zeros(self.n, dtype=dtype)
        data["id"], data["logit"] = np.arange(self.n), logits
        arr = self.lc.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(self.lc.llama_token_data)),
            size=self.n,
            selected=-1,
            sorted=False,
        )
        self.lc.llama_sampler_apply(self.sampler, ctypes.byref(arr))
        return np.isfinite(data["logit"])

    def accept(self, token: int) -> None:
        self.lc.llama_sampler_accept(self.sampler, token)

    def close(self) -> None:
        self.lc.llama_sampler_free(self.sampler)


def draw(rng: random.Random, n: int, allowed: np.ndarray, eog: set[int]) -> np.ndarray:
    """Logits where the best token is allowed, refused with an allowed one close behind, or
    refused with every allowed token far below (a third of the steps each); the boosted allowed
    token is not an end of generation where another is allowed (the text goes on)."""
    logits = np.array([rng.gauss(0.0, 2.0) for _ in range(n)], dtype=np.single)
    ok, refused = np.flatnonzero(allowed), np.flatnonzero(~allowed)
    ok = np.array([t for t in ok if t not in eog]) if set(ok.tolist()) - eog else ok
    case = rng.randrange(3)
    if case == 0 or not len(refused):
        logits[rng.choice(ok)] += 25.0
    elif case == 1:
        logits[rng.choice(refused)] += 30.0
        logits[rng.choice(ok)] += 25.0
    else:
        logits[rng.sample(list(refused), min(60, len(refused)))] += 30.0
    return logits


def survivors(logits: np.ndarray, finite: np.ndarray) -> set[int]:
    """The tokens top-k and then min-p keep, among those `finite` marks."""
    ids = np.flatnonzero(finite)
    ids = ids[np.argsort(logits[ids])[::-1][:TOP_K]]
    if not len(ids):
        return set()
    floor = logits[ids[0]] + math.log(MIN_P)
    return {int(t) for t in ids if logits[t] >= floor}


@pytest.mark.parametrize("kind", sorted(GRAMMARS))
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampling"])
def test_checked_grammar_keeps_what_the_whole_grammar_keeps(llm: Any, kind: str, greedy: bool):
    import llama_cpp

    rng = random.Random(f"{kind}-{greedy}")
    vocab = llm._model.vocab
    eog = {i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    steps = whole_vocab = 0
    while steps < 80:  # answers one after another, each under a fresh grammar
        checked = CheckedGrammar(
            llama_cpp, vocab, GRAMMARS[kind](), greedy=greedy, top_k=TOP_K,
            min_p=0.0 if greedy else MIN_P,
        )  # fmt: skip
        taken = answer(llm, Whole(llm, GRAMMARS[kind]()), checked, rng, eog, greedy)
        assert checked.steps == taken  # one check a step
        steps, whole_vocab = steps + checked.steps, whole_vocab + checked.whole
    assert 0 < whole_vocab < steps  # both paths ran


def answer(
    llm: Any, whole: Whole, checked: CheckedGrammar, rng: random.Random, eog: set[int],
    greedy: bool,
) -> int:  # fmt: skip
    """Decode one answer on drawn logits, checking each step against the whole grammar; the
    steps it took."""
    prompt, written = [0, 0, 0], []  # the processor feeds its grammar what follows the prompt
    try:
        step = 0
        while step < 80:
            step += 1
            allowed = whole.allowed(np.zeros(llm.n_vocab(), dtype=np.single))
            logits = draw(rng, llm.n_vocab(), allowed, eog)
            reference = whole.allowed(logits)
            out = checked(np.array(prompt + written), logits.copy())
            assert not np.any(np.isfinite(out) & ~reference)  # nothing the grammar refuses
            if greedy:
                best = int(np.argmax(np.where(reference, logits, -np.inf)))
                assert int(np.argmax(out)) == best
            else:
                kept = survivors(logits, reference)
                assert survivors(logits, np.isfinite(out)) == kept
                best = max(kept, key=lambda t: logits[t])
            if best in eog:
                break
            whole.accept(best)
            written.append(best)
        return step
    finally:
        whole.close()


def test_a_json_answer_resumed_mid_way_goes_on_under_its_grammar(model_path: Path) -> None:
    """A JSON answer paused mid-object (a preemption), the KV cache used by another request,
    then resumed: its grammar goes on from what it had written, not from the start (which
    would force a second object into the first one's middle)."""
    import jsonschema

    from hybridllm.engines.base import GenerationRequest
    from hybridllm.engines.llama.session import LlamaSession
    from hybridllm.local.settings import DEFAULT_SETTINGS

    session = LlamaSession(model_path, n_ctx=1024, settings=DEFAULT_SETTINGS.resolved(), extra={})
    small = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": small}}
    asked = GenerationRequest(
        messages=[{"role": "user", "content": "Describe a baker as JSON: name and age."}],
        max_tokens=200,
        temperature=0.0,
        tools=tool_spec(None, None, fmt),
    )
    try:
        gen = session.prefill(session.prepare(asked))
        text = [session.step(gen) or "" for _ in range(5)]
        assert gen.finish_reason is None and "".join(text).lstrip().startswith("{")
        session.close(gen)
        other = GenerationRequest(
            messages=[{"role": "user", "content": "Say hello to the team."}], max_tokens=4
        )
        between = session.prefill(session.prepare(other))
        for _ in range(4):
            session.step(between)
        session.close(between)
        session.resume(gen)
        while (piece := session.step(gen)) is not None:
            text.append(piece)
        jsonschema.validate(json.loads("".join(text)), small)
        assert gen.finish_reason == "stop"
    finally:
        session.unload()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_a_named_functions_call_is_opened_by_the_prompt_and_resumed_after_it() -> None:
    """`tool_choice` naming the function: the call's JSON up to its arguments is read with the
    prompt (`ToolPlan.opening`), so the call is named before any token is decoded; it counts as
    the answer's tokens, not the prompt's; its confidence reads the arguments alone; and a call
    paused mid-way and resumed goes on under its grammar from after that opening."""
    from hybridllm.engines.base import GenerationRequest
    from hybridllm.engines.llama.session import LlamaSession
    from hybridllm.engines.llama.toolcalls import call_opening
    from hybridllm.local.resolve import resolve_model
    from hybridllm.local.settings import DEFAULT_SETTINGS

    qwen = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)  # a model that calls tools
    session = LlamaSession(qwen, n_ctx=2048, settings=DEFAULT_SETTINGS.resolved(), extra={})
    messages = [{"role": "user", "content": "What is the weather like in Lyon today?"}]
    asked = GenerationRequest(
        messages=messages, max_tokens=60, temperature=0.0, tools=tool_spec([WEATHER], NAMED, None)
    )
    try:
        prepared = session.prepare(asked)
        opening = session.tokenize(call_opening("get_weather"))
        assert prepared.forced == len(opening) and prepared.tokens[-len(opening) :] == opening
        assert prepared.prompt_tokens == len(prepared.tokens) - len(opening)
        gen = session.prefill(prepared)
        assert gen.opened == ["get_weather"] and gen.completion_tokens == len(opening)
        for _ in range(3):  # into the arguments, then paused for another request
            assert session.step(gen) == ""
        session.close(gen)
        other = GenerationRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        between = session.prefill(session.prepare(other))
        session.step(between)
        session.close(between)
        session.resume(gen)
        while session.step(gen) is not None:
            pass
        assert gen.finish_reason == "tool_calls" and [c.name for c in gen.calls] == ["get_weather"]
        call = gen.calls[0]
        assert isinstance(json.loads(call.arguments)["city"], str)
        assert call.confidence is not None and 0.0 < call.confidence <= 1.0
    finally:
        session.unload()
