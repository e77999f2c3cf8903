"""Option rotations of a multiple-choice prompt (`option_rotations`): pure parts, no model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hybridllm.engines.llama.option_rotations import (
    PERM_NAMES,
    back_to_original,
    rotations,
    summarise,
)
from hybridllm.engines.llama.signals import SIGNAL_NAMES, distribution, logprob, option_letters

PROMPT = "Which is a bird?\n\nA. cat\nB. crow\nC. dog\nD. eel\n\nAnswer with the letter only."


def test_rotations_move_every_option_through_every_letter() -> None:
    letters = option_letters(PROMPT)
    rots = rotations(PROMPT, letters, 4)
    assert len(rots) == 3  # a whole cycle of four options
    first, order = rots[0]
    assert (
        first
        == "Which is a bird?\n\nA. eel\nB. cat\nC. crow\nD. dog\n\nAnswer with the letter only."
    )
    assert order == [3, 0, 1, 2]
    seen = {i: {o[i] for _, o in rots} | {i} for i in range(4)}
    assert all(s == {0, 1, 2, 3} for s in seen.values())
    assert all(p.startswith("Which is a bird?\n\n") and p.endswith("letter only.") for p, _ in rots)


def test_rotations_limited_and_refused() -> None:
    assert len(rotations(PROMPT, option_letters(PROMPT), 1)) == 1
    assert rotations(PROMPT, option_letters(PROMPT), 0) == []
    broken = "Q?\nA. x\nsomething\nB. y\nC. z"
    assert rotations(broken, ["A", "B", "C"], 3) == []


def test_back_to_original() -> None:
    assert back_to_original([0.1, 0.2, 0.3, 0.4], [3, 0, 1, 2]) == [0.2, 0.3, 0.4, 0.1]


def test_summarise_knowledge_against_letter_bias() -> None:
    # knows it: option 1 first wherever it stands
    knows = summarise([0.1, 0.7, 0.1, 0.1], [[0.1, 0.6, 0.2, 0.1], [0.2, 0.5, 0.2, 0.1]])
    assert knows["perm_agree"] == 1.0
    assert knows["perm_p"] == pytest.approx(0.6)
    assert knows["perm_margin"] == pytest.approx(0.6 - (0.1 + 0.2 + 0.2) / 3)
    # letter bias: always letter B, so a different option after each rotation
    biased = summarise([0.1, 0.7, 0.1, 0.1], [[0.1, 0.1, 0.7, 0.1], [0.1, 0.1, 0.1, 0.7]])
    assert biased["perm_agree"] == 0.0
    assert biased["perm_p"] < knows["perm_p"] and biased["perm_margin"] < 0.2


def test_summarise_without_options_is_nan_and_names_are_signals() -> None:
    assert all(math.isnan(v) for v in summarise([], []).values())
    assert all(math.isnan(v) for v in summarise([0.5, 0.5], []).values())
    assert set(PERM_NAMES) <= set(SIGNAL_NAMES)


class _Session:
    """Enough of a `LlamaSession` for `rotation_cycle` and `_rotated`: rendering and tokenizing are
    identity-like; the KV cache holds `cached`."""

    def __init__(self, cached: str = "") -> None:
        self.llm = SimpleNamespace(_input_ids=[ord(c) for c in cached], n_tokens=len(cached))

    def render(self, messages: list[dict[str, str]]) -> str:
        return messages[-1]["content"]

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]


@pytest.fixture
def fake_prefill(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[float]]:
    """Each rotation's prefill moves a fake clock on by 20 ms; the calls, and the clock."""
    from hybridllm.engines.llama import signals as llama_signals

    calls: list[int] = []
    clock = [100.0]

    def probs(llm: object, tokens: list[int], reuse: int, ids: list[int]) -> list[float]:
        calls.append(len(tokens))
        clock[0] += 0.02
        return [0.7, 0.1, 0.1, 0.1]

    monkeypatch.setattr(llama_signals, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(llama_signals, "_option_probs", probs)
    monkeypatch.setattr(llama_signals, "letter_ids", lambda llm, letters: [1, 2, 3, 4])
    monkeypatch.setattr(llama_signals, "_reuse", lambda session, tokens: 0)
    return calls, clock


def _cycle(session: _Session, prompt: str = PROMPT, pace_s: float | None = None) -> object:
    from hybridllm.engines.llama import signals as llama_signals

    msgs = [{"role": "user", "content": prompt}]
    asked = session.tokenize(prompt)
    return llama_signals.rotation_cycle(session, msgs, asked, option_letters(prompt), 4, pace_s)


def test_rotations_given_up_whole_when_past_their_time(
    fake_prefill: tuple[list[int], list[float]],
) -> None:
    """The rule where the prefill speed is not known: a rotation starts only if it would end by
    `by`, at the pace of those before it."""
    from hybridllm.engines.llama import signals as llama_signals

    calls, clock = fake_prefill
    cycle = _cycle(_Session())
    assert cycle.price_s is None and len(cycle.prompts) == 3  # type: ignore[attr-defined]
    rotate = llama_signals._rotated
    assert len(rotate(_Session(), cycle)) == 3  # type: ignore[arg-type]  # no limit: all three
    assert len(calls) == 3
    # time for one rotation and a half: the second would end late, so it is not started and
    # none is used
    calls.clear()
    assert rotate(_Session(), cycle, clock[0] + 0.03) == []  # type: ignore[arg-type]
    assert len(calls) == 1
    # time for two: the third would end late
    calls.clear()
    assert rotate(_Session(), cycle, clock[0] + 0.05) == []  # type: ignore[arg-type]
    assert len(calls) == 2
    calls.clear()
    assert len(rotate(_Session(), cycle, clock[0] + 0.065)) == 3  # type: ignore[arg-type]
    calls.clear()
    assert rotate(_Session(), cycle, clock[0] - 1) == []  # type: ignore[arg-type]
    assert calls == []  # past already: not one prefill


def test_the_cycle_is_priced_by_what_the_answer_does_not_reuse(
    fake_prefill: tuple[list[int], list[float]],
) -> None:
    """Counted against the KV cache (the template's start cached): the rotations prefill the
    question once and three option blocks; the prompt as asked then finds the question cached,
    so the price is the blocks alone, at the engine's prefill speed. A whole cycle past `by` at
    that speed is not started (not one rotation wasted)."""
    from hybridllm.engines.llama import signals as llama_signals

    calls, clock = fake_prefill
    prompt = "Which is a bird?\n\nA. ant\nB. bat\nC. crow\nD. dog\n\nAnswer with the letter only."
    question = "Which is a bird?\n\nA. "  # every rotation keeps the letters: "A. " too
    session = _Session(cached="Which")
    cycle = _cycle(session, prompt, pace_s=0.001)  # the engine's prefill: 1,000 tokens/s
    block = len(prompt) - len(question)  # each option text starts with its own character
    assert cycle.fresh == len(prompt) - len("Which") + 2 * block  # type: ignore[attr-defined]
    assert cycle.shared == len(question) - len("Which")  # type: ignore[attr-defined]
    assert cycle.price_s == pytest.approx(3 * block * 0.001)  # type: ignore[attr-defined]
    rotate = llama_signals._rotated
    whole = cycle.fresh * 0.001  # type: ignore[attr-defined]
    assert rotate(session, cycle, clock[0] + whole * 0.9) == []  # type: ignore[arg-type]
    assert calls == []
    assert len(rotate(session, cycle, clock[0] + whole * 1.1)) == 3  # type: ignore[arg-type]
    assert llama_signals._unshared_ms(cycle, 100.0) == pytest.approx(  # type: ignore[arg-type]
        100.0 * 3 * block / cycle.fresh  # type: ignore[attr-defined]
    )


def test_a_tokens_logprob_alone_is_the_distributions() -> None:
    """`logprob` (a call's confidence, every token) gives `distribution`'s figure for a wide
    row of logits, far from zero included."""
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=151_936) * 4).astype(np.float32)
    logits[7] += 40.0
    for token in (0, 7, 151_935):
        assert logprob(logits, token) == pytest.approx(
            distribution(logits, token).logprob, abs=1e-6
        )
