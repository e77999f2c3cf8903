"""What a client keeps about its finished requests, and what it tells OpenTelemetry.

    client = HybridClient(local=..., cloud=..., telemetry=Telemetry(window_s=600))
    ...
    report = client.stats()          # rolling P50/P95/P99 per engine and policy, and counts
    report.engines["local"].ttft_ms.p99

`Telemetry` holds the rolling aggregates (`telemetry.stats`) and, where enabled, the
OpenTelemetry recorder (`telemetry.otel`, the `hybridllm[otel]` extra). Prompt and answer
text are kept only where the user opts in (`capture_content`, or the OpenTelemetry GenAI
switch `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from hybridllm import clock, errors
from hybridllm.runtime.trace import Trace
from hybridllm.telemetry.stats import Counts, GroupStats, Percentiles, Stats, StatsReport

if TYPE_CHECKING:
    from hybridllm.events import ToolCall
    from hybridllm.telemetry.otel import OtelRecorder

__all__ = ["Counts", "GroupStats", "Percentiles", "Stats", "StatsReport", "Telemetry"]

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
OTEL_ENV = "HYBRIDLLM_OTEL"  # "1"/"true": record OpenTelemetry spans and metrics


class Telemetry:
    """`window_s`: how far back `stats()` looks (split into `buckets` slices);
    `relative_accuracy`: the percentiles' bound on relative error; `capture_content`: keep the
    prompt, the answer and tool-call arguments in each trace (`trace.content`) and in telemetry
    (None: as `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` says; off when unset);
    `otel`: record OpenTelemetry spans and metrics through the global providers (None: as
    `HYBRIDLLM_OTEL` says; off when unset; True needs `pip install hybridllm[otel]`)."""

    def __init__(
        self,
        *,
        window_s: float = 3600.0,
        buckets: int = 12,
        relative_accuracy: float = 0.005,
        capture_content: bool | None = None,
        otel: bool | None = None,
    ) -> None:
        _check(window_s, buckets, relative_accuracy, capture_content, otel)
        self.stats = Stats(window_s, buckets, relative_accuracy)
        self.capture_content = (
            _env_flag(CAPTURE_ENV) if capture_content is None else capture_content
        )
        wants_otel = _env_flag(OTEL_ENV) if otel is None else otel
        self.otel: OtelRecorder | None = _otel(self.capture_content) if wants_otel else None

    @contextlib.contextmanager
    def request(self, trace: Trace) -> Iterator[None]:
        """Around one request's work: its OpenTelemetry parent span is current (so spans that
        other instrumentation makes inside it nest under it). Nothing when OTel is off."""
        if self.otel is None:
            yield
            return
        with self.otel.request(trace):
            yield

    def finished(
        self,
        trace: Trace,
        messages: Sequence[Mapping[str, Any]],
        answer: str,
        calls: Sequence[ToolCall],
    ) -> None:
        """One request is over: add its trace (its content already recorded, `content()`) to
        the aggregates (on the loop, so `stats()` counts it at once; 2.8 ms of the loop for a
        1,000-token answer, measured). OpenTelemetry's export is `export()`."""
        self.stats.record(trace)

    def content(
        self, messages: Sequence[Mapping[str, Any]], answer: str, calls: Sequence[ToolCall]
    ) -> dict[str, Any] | None:
        """A request's content for its trace where the client captures it (None: it does not)."""
        if not self.capture_content:
            return None
        return {
            "messages": [dict(m) for m in messages],
            "answer": answer,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
        }

    async def export(self, trace: Trace) -> None:
        """Hand a finished request to OpenTelemetry, on a worker thread: the SDK records each
        chunk gap as a histogram sample (about 14 us each), which would hold the event loop for
        14 ms after a 1,000-token answer. Nothing when OTel is off."""
        if self.otel is not None:
            await anyio.to_thread.run_sync(self.otel.finished, trace, clock.now())


def _otel(capture: bool) -> OtelRecorder:
    try:
        from hybridllm.telemetry.otel import OtelRecorder
    except ImportError as exc:  # the extra is not installed
        raise errors.ConfigError(
            f"OpenTelemetry was asked for but is not installed ({exc}): "
            "pip install 'hybridllm[otel]'"
        ) from exc
    return OtelRecorder(capture_content=capture)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _check(window_s: float, buckets: int, accuracy: float, capture: object, otel: object) -> None:
    if not (isinstance(window_s, int | float) and window_s > 0 and window_s < float("inf")):
        raise errors.InvalidArgumentError("window_s", window_s, "a number of seconds > 0")
    if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1:
        raise errors.InvalidArgumentError("buckets", buckets, "an int >= 1")
    for name, flag in (("capture_content", capture), ("otel", otel)):
        if flag is not None and not isinstance(flag, bool):
            raise errors.InvalidArgumentError(name, flag, "True, False or None")
    if not (isinstance(accuracy, float) and 0.0 < accuracy < 0.5):
        raise errors.InvalidArgumentError("relative_accuracy", accuracy, "a float in (0, 0.5)")
