"""Log-probabilities of a plain text under the local model (no chat template): how readily the
model writes `text` after `prefix`. The privacy judge asks it whether the model knows a name
(`guard.privacy_known`): a well-known person's surname follows the first name in an
encyclopedic list; a private person's does not.

    logprobs = await engine.text_logprobs("Famous people: Albert Einstein,", " Rosa Parks")

One queued job of the engine, like `signals()`, run on the llama thread
(`LlamaSession.text_logprobs`): the live cache is kept first where the text would cut it (the
conversations' saved states), then the scorer evaluates only what the KV cache does not hold,
so a second name after the same prefix costs its own few tokens.
"""

from __future__ import annotations

from typing import Any


async def engine_text_logprobs(engine: Any, prefix: str, text: str) -> tuple[float, ...]:
    """Run `LlamaSession.text_logprobs` as one queued job of `engine` (a `LlamaCppEngine`)."""
    estimate_s = engine.estimate_s(len(text) // 3, 0)
    out = await engine.queued_job(
        lambda session: session.text_logprobs(prefix, text), estimate_s=estimate_s, what="scoring"
    )
    return tuple(out)
