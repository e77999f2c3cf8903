"""OpenTelemetry spans and metrics for hybridllm's requests (the `hybridllm[otel]` extra).

Only the OpenTelemetry API is used, through the global providers (the app configures the SDK
and its exporters) unless a test passes its own. Names follow the GenAI semantic conventions of
`opentelemetry-semantic-conventions==0.66b2`, imported from its `_incubating` modules. In that
release every `gen_ai.*` name is marked "moved to the GenAI semantic conventions repository"
(still defined, at Development status); its client metrics are
`gen_ai.client.operation.duration`, `gen_ai.client.token.usage` (by `gen_ai.token.type`),
`gen_ai.client.operation.time_to_first_chunk` and `gen_ai.client.operation.time_per_output_chunk`
(the newer repository renames some under `gen_ai.client.inference.*`: not used here). It has no
bucket advice in code: `DURATION_BUCKETS_S` and `TOKEN_BUCKETS` below are the conventions'
documented `ExplicitBucketBoundaries`, the duration one used for the two chunk metrics too, as
OpenTelemetry's own `opentelemetry-util-genai` does. `gen_ai.provider.name` has no value for
llama.cpp: `LOCAL_PROVIDER` is ours ("llama_cpp"); an OpenAI-compatible endpoint is "openai"
(the API flavour, as opentelemetry-instrumentation-openai-v2 says for any such endpoint).

What is made, all from the finished trace except the parent span:
- one parent span per request, "hybridllm.request" (INTERNAL), opened and made current when the
  request's work starts (so the request's tasks, and other instrumentation inside them, nest
  under it) and ended at `finished(trace)` with the request's totals under `hybridllm.*`, its
  `error.type`, `gen_ai.response.finish_reasons`, and status ERROR on failure;
- one child span per `trace.attempts` entry, with its real start and end: "chat {model}", kind
  CLIENT for the cloud and INTERNAL for the local engine, with `gen_ai.*` attributes, the token
  usage where known, `error.type` (the error's class name) and status ERROR when it failed. A
  cancelled attempt (a lost race, a hedge no longer needed) is no error: no `error.type`, status
  unset, `hybridllm.outcome` "cancelled", and no `gen_ai.client.operation.duration` sample;
- per attempt, the four client histograms (time to first chunk and per output chunk only for
  attempts that produced content; per-chunk gaps only for chunks that were delivered, the trace
  keeps no other chunk times);
- the prompt and answer only when `capture_content`: `gen_ai.input.messages` and
  `gen_ai.output.messages` on the parent span, as JSON strings (the release's span attributes).

Beside opentelemetry-instrumentation-openai-v2 (when it is active in the process), which makes
its own CLIENT chat span and gen_ai metrics for each cloud request (nested under our parent
span): a cloud attempt's span is "hybridllm.attempt cloud", INTERNAL, with `hybridllm.*`
attributes and `error.type` only, and no gen_ai metric is recorded for it, so nothing counts twice.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from hybridllm import clock
from hybridllm.runtime.trace import Attempt, Spend, Trace

PREFIX = "hybridllm."  # every attribute of hybridllm's own
OPERATION = ga.GenAiOperationNameValues.CHAT.value
LOCAL_PROVIDER = (
    "llama_cpp"  # ours: 0.66b2 lists no value for llama.cpp (custom values MAY be used)
)
CLOUD_PROVIDER = ga.GenAiProviderNameValues.OPENAI.value  # an OpenAI-compatible endpoint
# the conventions' bucket advice (docs/gen-ai/gen-ai-metrics.md, ExplicitBucketBoundaries)
DURATION_BUCKETS_S = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24]
DURATION_BUCKETS_S += [20.48, 40.96, 81.92]
TOKEN_BUCKETS = [4**i for i in range(14)]  # 1, 4, 16, ... 67108864
OPENAI_V2 = "opentelemetry.instrumentation.openai_v2"
REQUEST_SPAN = "hybridllm.request"

Attributes = dict[str, Any]


class _Instruments:
    """The four GenAI client histograms, with the conventions' units and buckets."""

    def __init__(self, meter: metrics.Meter) -> None:
        def histogram(name: str, unit: str, buckets: list[float], what: str) -> metrics.Histogram:
            return meter.create_histogram(
                name, unit=unit, description=what, explicit_bucket_boundaries_advisory=buckets
            )

        self.duration = histogram(
            gm.GEN_AI_CLIENT_OPERATION_DURATION,
            "s",
            DURATION_BUCKETS_S,
            "GenAI operation duration.",
        )
        self.tokens = histogram(
            gm.GEN_AI_CLIENT_TOKEN_USAGE,
            "{token}",
            [float(b) for b in TOKEN_BUCKETS],
            "Number of input and output tokens used.",
        )
        self.first_chunk = histogram(
            gm.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
            "s",
            DURATION_BUCKETS_S,
            "Time to receive the first chunk.",
        )
        self.per_chunk = histogram(
            gm.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
            "s",
            DURATION_BUCKETS_S,
            "Time per output chunk after the first.",
        )


@dataclass(frozen=True, slots=True)
class _Usage:
    input: int | None
    output: int | None
    usd: float | None = None


class OtelRecorder:
    """Spans and metrics of finished requests (`Telemetry(otel=True)`). `tracer_provider` and
    `meter_provider`: None for the global ones (the app's SDK); tests pass their own."""

    def __init__(
        self,
        *,
        capture_content: bool,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.capture_content = capture_content
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self._instruments = _Instruments(metrics.get_meter(__name__, meter_provider=meter_provider))
        self._open: dict[str, Span] = {}  # request id -> its live parent span

    @contextlib.contextmanager
    def request(self, trace_: Trace) -> Iterator[None]:
        """Open the request's parent span and make it current around its work (it is ended,
        with the totals, by `finished`)."""
        span = self._parent(trace_)
        self._open[trace_.request_id] = span
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield

    def finished(self, trace_: Trace, end: float | None = None) -> None:
        """Make the attempts' spans and metrics from the trace and end the parent span at `end`
        (a `clock.now()` time; None: now, which needs the event loop's thread)."""
        parent = self._open.pop(trace_.request_id, None) or self._parent(trace_)
        end = clock.now() if end is None else end
        shadowed = openai_v2_active()
        context = trace.set_span_in_context(parent)
        usage = _attempt_usage(trace_)
        for i, attempt in enumerate(trace_.attempts):
            gen_ai = not (shadowed and trace_.on_cloud(attempt.engine))
            self._attempt_span(trace_, attempt, usage[i], context, gen_ai, end)
            if gen_ai:
                self._metrics(trace_, attempt, usage[i])
        parent.set_attributes(_request_attributes(trace_))
        if self.capture_content and trace_.content is not None:
            parent.set_attributes(_content(trace_))
        if trace_.error_type is not None:
            parent.set_status(Status(StatusCode.ERROR, trace_.error))
        parent.end(end_time=_ns(trace_, end))

    def _parent(self, trace_: Trace) -> Span:
        return self._tracer.start_span(
            REQUEST_SPAN, kind=SpanKind.INTERNAL, start_time=_ns(trace_, trace_.t_start)
        )

    def _attempt_span(
        self,
        trace_: Trace,
        attempt: Attempt,
        usage: _Usage,
        context: Any,
        gen_ai: bool,
        end: float,
    ) -> None:
        cloud = trace_.on_cloud(attempt.engine)
        kind = SpanKind.CLIENT if gen_ai and cloud else SpanKind.INTERNAL
        name = f"{OPERATION} {attempt.model}" if gen_ai else f"hybridllm.attempt {attempt.engine}"
        attrs = _own_attempt_attributes(attempt, usage)
        if gen_ai:
            attrs.update(_gen_ai_attempt_attributes(trace_, attempt, usage))
        span = self._tracer.start_span(
            name, context, kind, _clean(attrs), start_time=_ns(trace_, attempt.t_start)
        )
        if attempt.outcome == "failed":
            span.set_status(Status(StatusCode.ERROR, attrs.get(ERROR_TYPE)))
        span.end(end_time=_ns(trace_, attempt.t_end if attempt.t_end is not None else end))

    def _metrics(self, trace_: Trace, attempt: Attempt, usage: _Usage) -> None:
        common = _metric_attributes(trace_, attempt)
        ins = self._instruments
        if attempt.outcome != "cancelled" and attempt.t_end is not None:
            failed = _error_type(attempt.error_type) if attempt.outcome == "failed" else None
            ins.duration.record(
                attempt.t_end - attempt.t_start, _clean({**common, ERROR_TYPE: failed})
            )
        for kind, count in (("input", usage.input), ("output", usage.output)):
            if count is not None:
                ins.tokens.record(count, {**common, ga.GEN_AI_TOKEN_TYPE: kind})
        if attempt.t_first is not None:
            ins.first_chunk.record(attempt.t_first - attempt.t_start, common)
        for gap in _chunk_gaps_s(trace_, attempt):
            ins.per_chunk.record(gap, common)


def openai_v2_active() -> bool:
    """Whether opentelemetry-instrumentation-openai-v2 instruments this process (asked through
    its own API; not imported here: a process that instruments it has imported it)."""
    module = sys.modules.get(OPENAI_V2)
    instrumentor = getattr(module, "OpenAIInstrumentor", None)
    return instrumentor is not None and bool(instrumentor().is_instrumented_by_opentelemetry)


def _ns(trace_: Trace, t: float) -> int:
    """A `clock.now()` time of this request as epoch nanoseconds."""
    return int((trace_.wall_start + (t - trace_.t_start)) * 1e9)


def _clean(attrs: Attributes) -> Attributes:
    return {k: v for k, v in attrs.items() if v is not None}


def _error_type(cls: type[BaseException] | None) -> str | None:
    return None if cls is None else cls.__name__


def _metric_attributes(trace_: Trace, attempt: Attempt) -> Attributes:
    cloud = trace_.on_cloud(attempt.engine)
    return {
        ga.GEN_AI_OPERATION_NAME: OPERATION,
        ga.GEN_AI_PROVIDER_NAME: CLOUD_PROVIDER if cloud else LOCAL_PROVIDER,
        ga.GEN_AI_REQUEST_MODEL: attempt.model,
    }


def _own_attempt_attributes(attempt: Attempt, usage: _Usage) -> Attributes:
    return {
        PREFIX + "engine": attempt.engine,
        PREFIX + "role": attempt.role,
        PREFIX + "attempt": attempt.attempt,
        PREFIX + "outcome": attempt.outcome,
        PREFIX + "chunks": attempt.tokens,
        PREFIX + "cost_usd": usage.usd,
        ERROR_TYPE: _error_type(attempt.error_type) if attempt.outcome == "failed" else None,
    }


def _gen_ai_attempt_attributes(trace_: Trace, attempt: Attempt, usage: _Usage) -> Attributes:
    served = attempt is _serving_attempt(trace_)
    first = None if attempt.t_first is None else attempt.t_first - attempt.t_start
    return {
        **_metric_attributes(trace_, attempt),
        ga.GEN_AI_REQUEST_STREAM: True,
        ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: first,
        ga.GEN_AI_RESPONSE_FINISH_REASONS: (
            [trace_.finish_reason] if served and trace_.finish_reason else None
        ),
        ga.GEN_AI_USAGE_INPUT_TOKENS: usage.input,
        ga.GEN_AI_USAGE_OUTPUT_TOKENS: usage.output,
    }


def _request_attributes(trace_: Trace) -> Attributes:
    """The parent span's figures: the request's totals."""
    own = {
        "request_id": trace_.request_id,
        "engine": trace_.engine,
        "plan": trace_.plan,
        "policy": trace_.policy,
        "objective": trace_.objective,
        "route_reason": trace_.route_reason or None,
        "fallback": trace_.fallback_reason,
        "fallback_cause": trace_.fallback_cause,
        "parallel_engine": trace_.parallel_engine,
        "hedged": trace_.hedged,
        "retries": trace_.retries,
        "engines_started": list(trace_.started) or None,
        "cost_usd": trace_.cost_usd,
        "ttft_ms": trace_.ttft_ms,
        "tpot_ms": trace_.tpot_ms,
        "tokens": trace_.n_tokens,
        "prompt_tokens": trace_.prompt_tokens,
        "completion_tokens": trace_.completion_tokens,
        "deadline_missed_ms": trace_.deadline_missed_ms,
        "tool_calls": list(trace_.tool_calls) or None,
    }
    attrs: Attributes = {PREFIX + k: v for k, v in own.items()}
    attrs[ERROR_TYPE] = _error_type(trace_.error_type)
    attrs[ga.GEN_AI_RESPONSE_FINISH_REASONS] = (
        [trace_.finish_reason] if trace_.finish_reason else None
    )
    return _clean(attrs)


def _content(trace_: Trace) -> Attributes:
    """The captured prompt and answer, in the conventions' message shape (JSON strings)."""
    content = trace_.content or {}
    inputs = [
        {"role": m.get("role", "user"), "parts": [_text_part(m.get("content"))]}
        for m in content.get("messages", [])
    ]
    parts: list[dict[str, Any]] = [_text_part(content.get("answer", ""))]
    parts += [
        {"type": "tool_call", "id": c["id"], "name": c["name"], "arguments": c["arguments"]}
        for c in content.get("tool_calls", [])
    ]
    output = {"role": "assistant", "parts": parts, "finish_reason": trace_.finish_reason or ""}
    return {
        ga.GEN_AI_INPUT_MESSAGES: json.dumps(inputs, default=str),
        ga.GEN_AI_OUTPUT_MESSAGES: json.dumps([output], default=str),
    }


def _text_part(text: Any) -> dict[str, Any]:
    return {"type": "text", "content": text if isinstance(text, str) else json.dumps(text)}


def _serving_attempt(trace_: Trace) -> Attempt | None:
    """The attempt that finished the answer: the serving engine's last finished one."""
    done = [a for a in trace_.attempts if a.outcome == "finished" and a.engine == trace_.engine]
    return done[-1] if done and trace_.finish_reason is not None else None


def _attempt_usage(trace_: Trace) -> list[_Usage]:
    """Each attempt's tokens, where known: a cloud request the guard settled has its billed
    usage (matched by role, in order); else the serving attempt has the request's usage."""
    spends: dict[str, list[Spend]] = {}
    for spend in trace_.spent:
        spends.setdefault(spend.role, []).append(spend)
    serving = _serving_attempt(trace_)
    out = []
    for attempt in trace_.attempts:
        mine = spends.get(attempt.role) if trace_.on_cloud(attempt.engine) else None
        if mine:
            s = mine.pop(0)
            out.append(_Usage(s.prompt_tokens, s.completion_tokens, s.usd))
        elif attempt is serving:
            out.append(_Usage(trace_.prompt_tokens, trace_.completion_tokens))
        else:
            out.append(_Usage(None, None))
    return out


def _chunk_gaps_s(trace_: Trace, attempt: Attempt) -> list[float]:
    """The gaps between this attempt's delivered chunks, as it produced them."""
    times, spans = trace_.token_times, trace_.spans
    end = float("inf") if attempt.t_end is None else attempt.t_end
    mine: list[float] = []
    for k, span in enumerate(spans):
        stop = spans[k + 1].first if k + 1 < len(spans) else len(times)
        if span.engine == attempt.engine:
            mine += [t for t in times[span.first : stop] if attempt.t_start <= t <= end]
    return [b - a for a, b in zip(mine, mine[1:], strict=False)]
