"""A client telemetry for tests that read the traces of finished requests, cancelled ones too
(the adapters' cancellation tests: a cancelled request's trace says its attempt was cancelled)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridllm.events import ToolCall
from hybridllm.runtime.trace import Trace
from hybridllm.telemetry import Telemetry


class Recorded(Telemetry):
    """The client's telemetry, keeping every finished request's trace (cancelled ones too)."""

    def __init__(self) -> None:
        super().__init__()
        self.traces: list[Trace] = []

    def finished(
        self,
        trace: Trace,
        messages: Sequence[Mapping[str, Any]],
        answer: str,
        calls: Sequence[ToolCall],
    ) -> None:
        super().finished(trace, messages, answer, calls)
        self.traces.append(trace)
