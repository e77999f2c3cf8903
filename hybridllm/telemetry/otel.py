"""OpenTelemetry spans and metrics for hybridllm's requests (the `hybridllm[otel]` extra).

Being written (issue 27, part 3): this placeholder records nothing yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import opentelemetry.trace  # noqa: F401  (the extra must be installed)

from hybridllm.runtime.trace import Trace


class OtelRecorder:
    def __init__(self, *, capture_content: bool) -> None:
        self.capture_content = capture_content

    @contextlib.contextmanager
    def request(self, trace: Trace) -> Iterator[None]:
        yield

    def finished(self, trace: Trace) -> None:
        pass
