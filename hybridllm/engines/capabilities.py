"""What an engine can do beyond the seam: small optional capabilities, declared as protocols.

The `Engine` seam (`engines.base`) is all a plan needs to stream an answer. Some plans need
more of an engine: the cascade reads the local model's own confidence, the speculative plan has
it draft and the cloud verify. Each such ability is one small `runtime_checkable` protocol
here, so code asks `isinstance(engine, ReadsSignals)` (a capability, never a concrete engine
class) and mypy sees the methods it then calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hybridllm.engines._llama_signals import LocalSignals
    from hybridllm.engines.base import Message

__all__ = ["ReadsSignals"]


@runtime_checkable
class ReadsSignals(Protocol):
    """Reads its own confidence signals on a prompt (router stage 2, the cascade)."""

    async def signals(
        self,
        messages: Sequence[Message],
        n_answer: int = 8,
        *,
        rotations_within_s: float | None = None,
    ) -> LocalSignals: ...
