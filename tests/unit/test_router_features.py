"""Router features: pure, stable across processes, bounded cost on long prompts."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from hybridllm.routing import features as F


def test_approx_tokens_latin_and_cjk() -> None:
    assert F.approx_tokens("") == 0
    assert F.approx_tokens("a" * 400) == 100
    # CJK characters count about one token each, not one per four bytes
    assert 250 <= F.approx_tokens("你好世界" * 75) <= 300


def test_question_form_and_signals() -> None:
    mc = F.extract("Which is a planet?\n\nA. Sun\nB. Mars\nC. Moon\n\nAnswer with the letter.")
    d = mc.dense_dict()
    assert d["mc_options"] > 0 and d["wh_word"] == 1.0 and d["question_mark"] == 1.0
    yn = F.extract("Is water wet? Answer yes or no.").dense_dict()
    assert yn["yes_no"] == 1.0 and yn["mc_options"] == 0.0
    code = F.extract("Fix this:\n```python\ndef f(x):\n    return x == 1\n```").dense_dict()
    assert code["code"] > 0 and code["code_fence"] == 1.0 and code["imperative"] == 1.0
    math_ = F.extract("Calculate 4680 / 5 and the total sum.").dense_dict()
    assert math_["math_ops"] > 0 and math_["math_words"] > 0 and math_["digits"] > 0


def test_script_shares() -> None:
    zh = F.extract("请把这句话翻译成英文").dense_dict()
    ru = F.extract("Переведи это предложение").dense_dict()
    en = F.extract("Translate this sentence").dense_dict()
    assert zh["cjk"] > 0.8 and zh["cyrillic"] == 0.0
    assert ru["cyrillic"] > 0.8 and ru["cjk"] == 0.0
    assert en["non_ascii"] == 0.0


def test_messages_turns_and_system() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
    ]
    f = F.extract(msgs)
    d = f.dense_dict()
    assert d["has_system"] == 1.0 and d["turns"] == 2 / 5
    # n-grams come from the last user message
    assert np.array_equal(f.hashed, F.extract("What is 2+2?").hashed)
    assert f.approx_tokens > F.extract("What is 2+2?").approx_tokens


def test_long_prompt_uses_a_bounded_window() -> None:
    head = "Summarize the following report. " * 20
    long = head + "filler words here " * 2000 + " What is the main finding?"
    f = F.extract(long)
    assert f.approx_tokens > 8000
    window = F.HEAD_CHARS + F.TAIL_CHARS + 1
    assert len(f.hashed) < 3 * window  # chars (two n-gram sizes) + words, from the window only
    assert f.dense_dict()["wh_word"] == 0.0  # first line is the instruction, not a question


def test_hashes_are_stable_across_processes() -> None:
    code = (
        "from hybridllm.routing.features import extract;"
        "print(extract('Who wrote Hamlet? 你好').hashed.tolist())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == str(F.extract("Who wrote Hamlet? 你好").hashed.tolist())


def test_indices_within_range_and_empty_prompt() -> None:
    f = F.extract("x" * 5000 + "? ∑ émigré")
    assert f.hashed.min() >= 0 and f.hashed.max() < F.N_HASH
    e = F.extract("")
    assert len(e.hashed) == 0 and len(e.dense) == len(F.DENSE_NAMES)
    assert F.extract([]).approx_tokens == 0
