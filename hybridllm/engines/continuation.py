"""How a cloud endpoint is asked to continue a started answer: its continuation dialect, probed.

A continuation (a request with `assistant_prefix`: a handoff, a failover mid-answer) must make
the endpoint's model go on with the delivered text, not start a new answer. Endpoints differ:

```
continue_final_message  the delivered text is the final assistant message, left open, with
                        vLLM's extra chat parameters (`continue_final_message`,
                        `add_generation_prompt: false`); vLLM, `hybridllm serve-model`
trailing_assistant      the delivered text as a trailing assistant message, nothing else
                        (with `"prefix": true` on it where the host documents that flag:
                        DeepSeek, Mistral); hosts that continue a final assistant turn
raw_completion          the chat prompt written here from the model's chat template
                        (`OpenAIEngine(chat_template=...)`: `engines.template`), the
                        assistant's turn opened with the delivered text, sent as raw text to
                        `/v1/completions`; llama-cpp-python's server, vLLM, most hosts of
                        open models
instruction             the delivered text as an assistant turn, then a user turn asking to
                        go on (any endpoint; a small model follows it badly: the last resort)
```

`OpenAIEngine(continuation="auto")` (the default) probes once, on the first continuation it
sends (or `probe_continuation()`): a tiny count ("1, 2, 3, 4, 5," and the model must go on with
"6") in each dialect in that order (`raw_completion` only where the engine has the model's chat
template), keeping the first that continues it; an endpoint that
refuses a dialect's fields (a 4xx) moves to the next; `instruction` is what is left. The probe
costs one or two requests of a few tokens, sent through the engine's own client (fixed text:
nothing of the user's leaves with it). The dialect a continuation was sent in is in its
`RequestSent` mark and `Trace.continuation`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "CONTINUATIONS",
    "Continuation",
    "Dialect",
    "PROBED",
    "continued_messages",
    "continues",
    "dialect_fields",
    "probe",
]

Dialect = Literal["continue_final_message", "trailing_assistant", "raw_completion", "instruction"]
Continuation = Literal[
    "auto", "continue_final_message", "trailing_assistant", "raw_completion", "instruction"
]
CONTINUATIONS: tuple[Continuation, ...] = (
    "auto",
    "continue_final_message",
    "trailing_assistant",
    "raw_completion",
    "instruction",
)
PROBED: tuple[Dialect, ...] = ("continue_final_message", "trailing_assistant")
CONTINUE_FINAL = {"continue_final_message": True, "add_generation_prompt": False}
# hosts that document a `prefix` flag on a trailing assistant message
PREFIX_FLAG_HOSTS = ("api.deepseek.com", "api.mistral.ai")
PROBE_ASK = "Count from 1 to 12, separated by commas."
PROBE_START = "1, 2, 3, 4, 5,"
PROBE_NEXT = "6"

Send = Callable[[list[dict[str, Any]], dict[str, Any]], Awaitable[str | None]]
SendRaw = Callable[[list[dict[str, Any]], str], Awaitable[str | None]]


def continued_messages(
    messages: Sequence[Mapping[str, Any]], prefix: str, dialect: Dialect, host: str
) -> list[dict[str, Any]] | None:
    """The chat messages of a continuation of `prefix` in `dialect` (None for "instruction":
    `engines.base.chat_messages` writes that one; and for "raw_completion", which is a prompt,
    not messages: `engines.template.ChatTemplate.prompt`)."""
    if dialect in ("instruction", "raw_completion"):
        return None
    final: dict[str, Any] = {"role": "assistant", "content": prefix}
    if dialect == "trailing_assistant" and host in PREFIX_FLAG_HOSTS:
        final["prefix"] = True
    return [*(dict(m) for m in messages), final]


def dialect_fields(dialect: Dialect) -> dict[str, Any]:
    """The extra body fields a continuation in `dialect` carries."""
    return dict(CONTINUE_FINAL) if dialect == "continue_final_message" else {}


def continues(text: str) -> bool:
    """Whether the probe's answer goes on with the count (rather than starting it again)."""
    return text.lstrip().startswith(PROBE_NEXT)


async def probe(send: Send, host: str, raw: SendRaw | None = None) -> Dialect | None:
    """The first dialect of `PROBED` in which the endpoint continues the probe's count, then
    "raw_completion" where `raw` is given (the engine has the model's chat template), else
    "instruction". `send(messages, extra_body)` and `raw(messages, prefix)` return the answer's
    text, or None where the endpoint refused the request (a 4xx: the dialect's fields or the
    path unknown there); an endpoint that cannot be reached raises, and the probe says None
    (not decided: probed again next time)."""
    ask = [{"role": "user", "content": PROBE_ASK}]
    order: tuple[Dialect, ...] = (*PROBED, "raw_completion")
    for dialect in order:
        try:
            if dialect == "raw_completion":
                text = None if raw is None else await raw(ask, PROBE_START)
            else:
                messages = continued_messages(ask, PROBE_START, dialect, host)
                assert messages is not None
                text = await send(messages, dialect_fields(dialect))
        except Exception:  # unreachable, 5xx, timeout: nothing learnt about the dialect
            return None
        if text is not None and continues(text):
            return dialect
    return "instruction"
