"""One prompt-token estimate (script-aware), one upper bound, and the choice between them and an
engine's own tokenizer (`engines.base.count_prompt_tokens`)."""

from __future__ import annotations

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.engines.base import (
    CONTINUE_INSTRUCTION,
    GenerationRequest,
    chat_messages,
    count_prompt_tokens,
    estimate_prompt_tokens,
    prompt_token_bound,
)
from hybridllm.engines.tokens import estimate_text_tokens
from hybridllm.testing import ScriptedEngine

# (text, SmolLM2-135M tokens, Qwen2.5 tokens): counted with llama.cpp's tokenizers (no special
# tokens, no template); the calibration table in hybridllm/engines/tokens.py
SAMPLES = {
    "chinese": (
        "请用三句话总结下面的报告，并列出主要风险。机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
        79,
        29,
    ),
    "japanese": (
        "次の報告書を三文で要約し、主なリスクを挙げてください。東京は日本の首都です。ひらがなとカタカナ。",
        86,
        38,
    ),
    "russian": (
        "Пожалуйста, кратко изложите следующий отчёт в трёх предложениях и перечислите основные "
        "риски.",
        74,
        35,
    ),
    "arabic": (
        "يرجى تلخيص التقرير التالي في ثلاث جمل وذكر المخاطر الرئيسية. القاهرة هي عاصمة مصر.",
        79,
        29,
    ),
    "emoji": ("🎉🚀😀👍🔥❤️🙈🌍🍕⚽", 31, 11),
    "code": (
        "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + "
        "fib(n - 2)\n\nprint([fib(i) for i in range(10)])  # {'a': 1}",
        61,
        56,
    ),
    "english": (
        "The quick brown fox jumps over the lazy dog. Please summarise the following report in "
        "three sentences and list the main risks.",
        25,
        25,
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_estimate_sits_between_the_real_tokenizers(name: str) -> None:
    text, smol, qwen = SAMPLES[name]
    est = estimate_text_tokens(text)
    low, high = min(smol, qwen), max(smol, qwen)
    assert 0.8 * low <= est <= 1.25 * high, (name, est, smol, qwen)
    # the bound never undercounts, whatever the vocabulary
    bound = prompt_token_bound([{"role": "user", "content": text}])
    assert bound >= high + 8 and bound >= est


def test_cjk_is_not_four_characters_per_token() -> None:
    """The report: a 549-token Chinese prompt was put at ~190 tokens by characters / 4."""
    text = SAMPLES["chinese"][0] * 15  # 750 characters
    est = estimate_prompt_tokens([{"role": "user", "content": text}])
    assert est >= 700 > len(text) // 4 + 10
    assert estimate_text_tokens("東京タワー") == 5 and estimate_text_tokens("서울") == 2


def test_estimate_edges() -> None:
    assert estimate_text_tokens("") == 0 and estimate_text_tokens("a") == 1
    assert estimate_text_tokens("2024-11-30") == 10  # digits split one by one (8 + 2 * 0.75)
    assert estimate_prompt_tokens([]) == 3
    one = [{"role": "user", "content": "hello there"}]
    assert estimate_prompt_tokens(one) == 4 + estimate_text_tokens("hello there") + 3
    # the bound: UTF-8 bytes, 8 per message, 64 per request
    assert prompt_token_bound([{"role": "user", "content": "é"}]) == 2 + 8 + 64


def test_a_continuation_is_bounded_with_what_it_sends() -> None:
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], assistant_prefix="Hel")
    sent = chat_messages(req)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == "Hel" and sent[2]["content"] == CONTINUE_INSTRUCTION
    assert prompt_token_bound(sent) == 2 + 3 + len(CONTINUE_INSTRUCTION) + 3 * 8 + 64


def test_a_continue_final_message_continuation_sends_the_open_assistant_text() -> None:
    from hybridllm import OpenAIEngine

    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], assistant_prefix="Hel")
    engine = OpenAIEngine(api_key="k", continuation="continue_final_message")
    assert engine._messages(req) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hel"},
    ]  # no instruction: the server continues "Hel" itself (vLLM's continue_final_message)
    plain = GenerationRequest(messages=[{"role": "user", "content": "hi"}])
    assert engine._messages(plain) == [{"role": "user", "content": "hi"}]
    assert OpenAIEngine(api_key="k")._messages(req) == [dict(m) for m in chat_messages(req)]


def test_an_engine_tokenizer_wins_over_the_estimate() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    none, counted = ScriptedEngine("cloud"), ScriptedEngine("local", token_count=42)
    assert count_prompt_tokens(msgs) == estimate_prompt_tokens(msgs)
    assert count_prompt_tokens(msgs, [none]) == estimate_prompt_tokens(msgs)
    assert count_prompt_tokens(msgs, [none, counted]) == 42


@pytest.mark.anyio
async def test_routing_and_the_latency_model_use_the_engine_count() -> None:
    local = ScriptedEngine("local", tokens=["a"], token_count=777)
    cloud = ScriptedEngine("cloud", tokens=["b"])
    async with HybridClient(local=local, cloud=cloud, policy=Policy(name="p")) as client:
        _, facts, state = client.decide("東京")
    assert facts.prompt_tokens == 777
    assert state.continues == frozenset({"local", "cloud"})
