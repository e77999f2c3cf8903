"""Typed per-engine options, like simonw/llm's `Options` per model.

    request = GenerationRequest(messages, temperature=0.0,
                                options=(LlamaOptions(draft="prompt-lookup"),
                                         OpenAIOptions(prediction=draft_text)))

Each engine reads only its own class from `GenerationRequest.options`: the local engine's
drafting never reaches the cloud SDK as a keyword, and a cloud option never reaches llama.cpp.
Bad values are an `InvalidArgumentError` (a `ConfigError`) when the object is made, before any
request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hybridllm.errors import InvalidArgumentError

DRAFT_MODES = ("prompt-lookup", "off")


class EngineOptions:
    """Base of every engine's options class."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class LlamaOptions(EngineOptions):
    """Options for `LlamaCppEngine`.

    `draft`: "prompt-lookup" turns prompt-lookup speculative decoding on for this request
    (greedy requests only: temperature 0), "off" turns it off, None keeps the engine's own
    setting (`LlamaCppEngine(draft=...)`)."""

    draft: Literal["prompt-lookup", "off"] | None = None

    def __post_init__(self) -> None:
        if self.draft is not None and self.draft not in DRAFT_MODES:
            raise InvalidArgumentError("draft", self.draft, f"None or one of {DRAFT_MODES}")


@dataclass(frozen=True, slots=True)
class OpenAIOptions(EngineOptions):
    """Options for `OpenAIEngine`, sent as the chat completions API's fields.

    `prediction`: Predicted Outputs (text the answer is expected to repeat; OpenAI reports
    accepted and rejected prediction tokens). `presence_penalty`, `frequency_penalty`: -2 to 2.
    `user`: the end user's id, for the provider's abuse monitoring. `extra_body`: JSON fields a
    particular OpenAI-compatible server understands (e.g. vLLM's `top_k`), merged into the
    request body (`n` other than 1 is refused: a stream is one answer). Every string here
    leaves with the request, so the cloud guard scans them."""

    prediction: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    extra_body: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and -2 <= value <= 2
            ):
                raise InvalidArgumentError(name, value, "a finite number from -2 to 2")
        if self.extra_body is not None and not isinstance(self.extra_body, Mapping):
            raise InvalidArgumentError("extra_body", self.extra_body, "a mapping")
        n = (self.extra_body or {}).get("n", 1)
        if n != 1 or isinstance(n, bool):  # one stream is one answer: choices would mix
            raise InvalidArgumentError("extra_body.n", n, "1 or absent (one answer per request)")
        for name in ("prediction", "user"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidArgumentError(name, value, "a string")

    def fields(self) -> dict[str, object]:
        """The keyword arguments for `chat.completions.create`."""
        kwargs: dict[str, object] = {}
        if self.prediction is not None:
            kwargs["prediction"] = {"type": "content", "content": self.prediction}
        if self.presence_penalty is not None:
            kwargs["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty is not None:
            kwargs["frequency_penalty"] = self.frequency_penalty
        if self.user is not None:
            kwargs["user"] = self.user
        if self.extra_body:
            kwargs["extra_body"] = dict(self.extra_body)
        return kwargs
