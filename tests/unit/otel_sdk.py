"""The OpenTelemetry SDK's in-memory exporter and metric reader for the OTel unit tests: each
test makes its own providers (no global state is set) and reads back what was recorded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hybridllm.telemetry.otel import OtelRecorder


@dataclass
class Sdk:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def recorder(self, capture_content: bool = False) -> OtelRecorder:
        return OtelRecorder(
            capture_content=capture_content,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def span(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, [s.name for s in self.spans()]
        return found[0]

    def points(self, metric: str) -> list[HistogramDataPoint]:
        """Every histogram data point of `metric`, from every instrumentation scope."""
        data = self.reader.get_metrics_data()
        out: list[HistogramDataPoint] = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out += list(m.data.data_points)  # type: ignore[arg-type]
        return out

    def count(self, metric: str, **attrs: Any) -> int:
        """Samples of `metric` whose attributes include `attrs`."""
        pts = self.points(metric)
        return sum(p.count for p in pts if all(p.attributes.get(k) == v for k, v in attrs.items()))

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def make_sdk() -> Sdk:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Sdk(tracer_provider, MeterProvider(metric_readers=[reader]), exporter, reader)
