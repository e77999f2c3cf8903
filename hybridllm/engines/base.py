"""The engine seam: one small async interface every engine implements.

Like an httpx transport, an engine knows nothing about routing, deadlines or the app. It takes a
`GenerationRequest` and streams `Chunk`s (`Delta`, `Mark`, `Finish`); it maps its own failures to
`hybridllm.errors.EngineError` subclasses at the boundary. `stream()` is an async generator that
the orchestrator always closes (``contextlib.aclosing``): closing it must stop the work at once
(the local worker stops decoding, the cloud connection is closed).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from hybridllm.events import Chunk, EngineName

Message = Mapping[str, str]
PrivacyMode = Literal["keep-local", "off"]


@dataclass(frozen=True)
class GenerationRequest:
    messages: Sequence[Message]
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # text the answer must continue from (mid-stream failover): the start of the assistant turn
    assistant_prefix: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)
    # routing metadata, never sent: the policy's name (budget caps per scope) and its privacy
    # mode for this request (None: the guard's own mode; see engines/guarded.py)
    scope: str = "default"
    privacy: PrivacyMode | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What an engine can do and how busy it is, for the router and the orchestrator."""

    name: EngineName
    model: str
    can_draft: bool = False
    can_verify: bool = False
    queue_depth: int = 0
    expected_wait_s: float = 0.0
    n_ctx: int | None = None
    # measured speed (local engines: tuning or warm-up, then refined by real requests)
    prefill_tps: float | None = None
    decode_tps: float | None = None


@runtime_checkable
class Engine(Protocol):
    name: EngineName

    async def start(self) -> None:
        """Load, connect, warm up. Idempotent."""

    def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        """Stream chunks for one request; closing the iterator stops the work."""
        ...

    def info(self) -> EngineInfo: ...

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        """Expected seconds to the first token if `request` were sent now (None: unknown)."""
        ...

    async def aclose(self) -> None:
        """Release every resource (threads, sockets, model memory). Idempotent."""


def estimate_prompt_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """About 4 characters per token plus the chat template's few tokens per message (no
    tokenizer: routing and usage estimates both use this)."""
    return sum(4 + len(m.get("content", "")) // 4 for m in messages) + 3
