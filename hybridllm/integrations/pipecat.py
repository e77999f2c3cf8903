"""hybridllm as a Pipecat LLM service: `HybridLLMService(client=..., policy=...)`.

A drop-in `LLMService` for pipecat-ai 1.x (the `hybridllm[pipecat]` extra). It answers each
`LLMContextFrame` through `HybridClient.stream()`, so the router, the first-token deadline and
the failover run under Pipecat, which on its own switches LLMs on errors only:

- frames: `LLMFullResponseStartFrame`, one `LLMTextFrame` per token, `LLMFullResponseEndFrame`,
  as Pipecat's own OpenAI service sends them;
- metrics from the trace: TTFB is the trace's TTFT (from the `stream()` call to the first token
  or tool call delivered), processing runs to the trace's end, usage is the trace's; and one
  `HybridRouteMetricsData` per answer, which names the engine, the plan, the route reason and
  carries the whole trace (`Trace.to_dict()`);
- tool calls (`ToolCall` events, complete and checked) go through Pipecat's own
  function-calling flow (`run_function_calls`): the registered functions run, the context
  aggregator adds their results to the context and asks for the next turn;
- an interruption (barge-in, `InterruptionFrame`) cancels the answer under way: leaving the
  stream closes it, which stops every engine (the local one within one decode step, the cloud
  connection closed) before Pipecat's interruption handling returns. Each is recorded in
  `HybridLLMService.interruptions`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (
    Frame,
    FunctionCallFromLLM,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    MetricsFrame,
)
from pipecat.metrics.metrics import LLMTokenUsage, MetricsData
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings
from pipecat.utils.types import is_given

from hybridllm import clock, errors
from hybridllm.client import HybridClient
from hybridllm.engines.options import EngineOptions, OpenAIOptions
from hybridllm.events import Token, ToolCall
from hybridllm.policy import Policy
from hybridllm.runtime.admission import RequestArgs
from hybridllm.runtime.stream import Stream
from hybridllm.runtime.trace import Trace

__all__ = ["HybridLLMService", "HybridRouteMetricsData", "Interruption"]

# request arguments Pipecat's context owns: a service-wide value would contradict it
_FROM_CONTEXT = ("tools", "tool_choice")
# Pipecat's settings that are a request's own arguments, and those that are OpenAI's fields
# (`OpenAIOptions`: the cloud engine sends them; the local engine has no penalties)
_SAMPLING = ("temperature", "max_tokens", "top_p", "seed")
_PENALTIES = ("frequency_penalty", "presence_penalty")
# Pipecat's settings a hybridllm request has no field for: refused when given, never dropped
_NO_FIELD = {
    "top_k": "None (a hybridllm request has no top_k; a cloud server that takes one gets it "
    "as request={'options': [OpenAIOptions(extra_body={'top_k': ...})]})",
}


class HybridRouteMetricsData(MetricsData):
    """The route of one answer, as Pipecat metrics (in a `MetricsFrame`): the engine that
    served it, the plan, the reason, the trace's TTFT and cost, and the whole trace."""

    engine: str | None
    plan: str | None
    route_reason: str
    ttft_ms: float | None
    fallback_reason: str | None
    cost_usd: float | None
    trace: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Interruption:
    """One barge-in: when the service took the `InterruptionFrame` (`at`) and when the answer
    under way had been closed, every engine let go (`stopped_at`), both on `hybridllm.clock`
    (the clock `LlamaCppEngine.stopped_at` reads); `trace`: the interrupted answer's (None:
    nothing was being answered)."""

    at: float
    stopped_at: float
    trace: Trace | None


class HybridLLMService(LLMService):
    """A Pipecat `LLMService` answered by a `HybridClient` under one policy.

    `client`: an open `HybridClient` (the app enters it around the pipeline's run);
    `policy`: a policy name, a policy file or a `Policy` (None: the client's);
    `request`: keyword arguments every request gets (`max_tokens`, `priority`, `plan`, ...;
    not `tools` or `tool_choice`, which come from the context). Pipecat's `settings`
    (`LLMSettings`, given here or updated by an `LLMUpdateSettingsFrame`) apply where given,
    over `request`: `temperature`, `max_tokens`, `top_p`, `seed`, `system_instruction`, and
    `frequency_penalty`, `presence_penalty` as the request's `OpenAIOptions` (the cloud engine
    sends them; the local engine has no penalties). `top_k` has no field in a hybridllm
    request: given, it is an `InvalidArgumentError` naming `settings.top_k` (here, or as the
    answer's `ErrorFrame` after an update). Other keyword arguments go to `LLMService`.
    """

    def __init__(
        self,
        *,
        client: HybridClient,
        policy: str | Path | Policy | None = None,
        request: RequestArgs | None = None,
        settings: LLMSettings | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(client, HybridClient):
            raise errors.InvalidArgumentError("client", client, "a HybridClient")
        resolved = None if policy is None else client.policies.get(policy)
        given = dict(request or {})
        for name in _FROM_CONTEXT:
            if name in given:
                raise errors.InvalidArgumentError(
                    f"request[{name!r}]", given[name], "absent: Pipecat's context gives it"
                )
        super().__init__(settings=_settings(settings), **kwargs)
        self._client = client
        self._policy = resolved
        self._request = given
        _from_settings(self._settings, given)  # a setting with no field is refused now
        self._stream: Stream | None = None
        self.last_trace: Trace | None = None  # the last answer's trace (finished or cut)
        self.interruptions: list[Interruption] = []

    @property
    def client(self) -> HybridClient:
        return self._client

    def can_generate_metrics(self) -> bool:
        """TTFB, processing and usage metrics come from each answer's trace."""
        return True

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Answer a context frame; pass every other frame on."""
        if isinstance(frame, InterruptionFrame):
            await self._interrupted(frame, direction)
            return
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            await self._answer(frame.context)
        else:
            await self.push_frame(frame, direction)

    async def _interrupted(self, frame: InterruptionFrame, direction: FrameDirection) -> None:
        """Pipecat's own handling (the base classes) cancels the task answering the context
        frame, which closes its stream and waits until every engine let go; then the
        interruption is recorded and handed on."""
        at, stream = clock.now(), self._stream
        await super().process_frame(frame, direction)
        cut = None if stream is None else stream.trace  # the frozen value: the stream is closed
        self.interruptions.append(Interruption(at, clock.now(), cut))
        await self.push_frame(frame, direction)

    async def run_inference(
        self,
        context: LLMContext,
        max_tokens: int | None = None,
        system_instruction: str | None = None,
        response_schema: dict[str, Any] | None = None,
    ) -> str | None:
        """One out-of-band answer (Pipecat's summaries and the like), with the policy's
        routing; a `response_schema` becomes a JSON-schema response format, checked."""
        args = self._args(await self._params(context, system_instruction))
        if max_tokens is not None:
            args["max_tokens"] = max_tokens
        if response_schema is not None:
            schema = {"name": "response", "schema": response_schema, "strict": True}
            args["response_format"] = {"type": "json_schema", "json_schema": schema}
        done = await self._client.complete(args.pop("messages"), policy=self._policy, **args)
        self.last_trace = done.trace
        return done.text or None

    # ---- one answer ---------------------------------------------------------------------------

    async def _answer(self, context: LLMContext) -> None:
        """The frames of one answer, its metrics and its tool calls; a hybridllm error (a
        refusal, every engine failing) is pushed as Pipecat's error frame."""
        await self.push_frame(LLMFullResponseStartFrame())
        try:
            args = self._args(await self._params(context, None))
            calls = await self._stream_answer(args.pop("messages"), args)
            await self.run_function_calls([_from_llm(call, context) for call in calls])
        except errors.HybridError as e:
            await self.push_error(error_msg=f"hybridllm: {e}", exception=e)
        finally:
            await self.push_frame(LLMFullResponseEndFrame())

    async def _stream_answer(self, messages: Any, args: dict[str, Any]) -> list[ToolCall]:
        """Stream the answer's text as `LLMTextFrame`s; return its tool calls. Leaving this
        (the end, an error, or the task cancelled by an interruption) closes the stream."""
        calls: list[ToolCall] = []
        stream = self._client.stream(messages, policy=self._policy, **args)
        self._stream = stream
        trace = stream.trace
        try:
            async with stream:
                await self.start_ttfb_metrics(start_time=trace.wall_start)
                await self.start_processing_metrics(start_time=trace.wall_start)
                async for event in stream.events():
                    if isinstance(event, Token | ToolCall):
                        await self._first_output(trace)
                    if isinstance(event, Token):
                        await self._push_llm_text(event.text)
                    elif isinstance(event, ToolCall):
                        calls.append(event)
        finally:
            self._stream = None
            self.last_trace = trace
            await self._report(trace)
        return calls

    async def _first_output(self, trace: Trace) -> None:
        """TTFB (and TTFAT) end at the trace's first token; later calls change nothing."""
        if trace.ttft_ms is not None:
            end = trace.wall_start + trace.ttft_ms / 1000.0
            await self.stop_ttfb_metrics(end_time=end)
            await self.stop_ttfat_metrics(end_time=end)

    async def _report(self, trace: Trace) -> None:
        """Processing time, usage and the route, from the trace (after an interruption too)."""
        done = trace.t_done if trace.t_done is not None else clock.now()
        await self.stop_processing_metrics(end_time=_wall(trace, done))
        if trace.prompt_tokens is not None and trace.completion_tokens is not None:
            total = trace.prompt_tokens + trace.completion_tokens
            await self.start_llm_usage_metrics(
                LLMTokenUsage(
                    prompt_tokens=trace.prompt_tokens,
                    completion_tokens=trace.completion_tokens,
                    total_tokens=total,
                    cache_read_input_tokens=trace.cached_prompt_tokens,
                )
            )
        if self.metrics_enabled:
            await self.push_frame(MetricsFrame(data=[_route_data(self.name, trace)]))

    # ---- the request --------------------------------------------------------------------------

    async def _params(self, context: LLMContext, system: str | None) -> dict[str, Any]:
        """The context as OpenAI's chat parameters (messages, tools, tool_choice), through
        Pipecat's own OpenAI adapter, as its OpenAI service reads them."""
        instruction = system or self._settings.system_instruction
        params = await self.get_llm_adapter().get_llm_invocation_params(
            context,
            system_instruction=instruction if isinstance(instruction, str) else None,
            convert_developer_to_user=True,
        )
        return dict(params)

    def _args(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The `stream()` arguments: the service's `request`, Pipecat's given settings over
        it, the context's messages, and its tools with their tool choice (Pipecat's NOT_GIVEN:
        none; a tool choice with no tools is dropped, as it asks nothing)."""
        args: dict[str, Any] = {**self._request, **_from_settings(self._settings, self._request)}
        args["messages"] = chat_messages(params["messages"])
        tools, choice = params.get("tools"), params.get("tool_choice")
        if isinstance(tools, list) and tools:  # a tool choice without tools says nothing
            args["tools"] = tools
            if isinstance(choice, str | Mapping):
                args["tool_choice"] = choice
        return args


def _from_settings(settings: LLMSettings, request: Mapping[str, Any]) -> dict[str, Any]:
    """The request arguments Pipecat's settings give (those given and not None): the sampling
    ones as they are, the penalties in the request's `OpenAIOptions` (over those `request`
    holds, the rest of its options kept); a setting with no field in a hybridllm request is an
    `InvalidArgumentError` naming it."""
    given = {
        f.name: value
        for f in fields(settings)
        if is_given(value := getattr(settings, f.name)) and value is not None
    }
    for name, rule in _NO_FIELD.items():
        if name in given:
            raise errors.InvalidArgumentError(f"settings.{name}", given[name], rule)
    args = {name: given[name] for name in _SAMPLING if name in given}
    penalties = {name: given[name] for name in _PENALTIES if name in given}
    if penalties:
        args["options"] = _with_penalties(request.get("options", ()), penalties)
    return args


def _with_penalties(options: object, penalties: Mapping[str, float]) -> tuple[object, ...]:
    """`options` (the request's, which the client checks) with the penalties in its
    `OpenAIOptions` (one added if none is there)."""
    if isinstance(options, EngineOptions) or not isinstance(options, Iterable):
        rule = "a sequence of engine options, e.g. (OpenAIOptions(),)"
        raise errors.InvalidArgumentError("request['options']", options, rule)
    given = tuple(options)
    kept = [o for o in given if not isinstance(o, OpenAIOptions)]
    openai = next((o for o in given if isinstance(o, OpenAIOptions)), OpenAIOptions())
    return (
        *kept,
        replace(
            openai,
            frequency_penalty=penalties.get("frequency_penalty", openai.frequency_penalty),
            presence_penalty=penalties.get("presence_penalty", openai.presence_penalty),
        ),
    )


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pipecat's OpenAI messages as hybridllm's: a content of parts becomes its text (parts
    other than text, an image or audio, are refused naming the message)."""
    out = []
    for i, message in enumerate(messages):
        m = dict(message)
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "".join(_part_text(f"context.messages[{i}].content", p) for p in content)
        out.append(m)
    return out


def _part_text(where: str, part: Any) -> str:
    if isinstance(part, Mapping) and part.get("type") == "text":
        return str(part.get("text", ""))
    raise errors.InvalidArgumentError(where, part, "text parts only (hybridllm reads text)")


def _from_llm(call: ToolCall, context: LLMContext) -> FunctionCallFromLLM:
    """A checked hybridllm call as Pipecat's (its arguments parse: the call was checked)."""
    return FunctionCallFromLLM(
        function_name=call.name,
        tool_call_id=call.id,
        arguments=json.loads(call.arguments),
        context=context,
    )


def _route_data(processor: str, trace: Trace) -> HybridRouteMetricsData:
    return HybridRouteMetricsData(
        processor=processor,
        model=trace.engine,
        engine=trace.engine,
        plan=trace.plan,
        route_reason=trace.route_reason,
        ttft_ms=trace.ttft_ms,
        fallback_reason=trace.fallback_reason,
        cost_usd=trace.cost_usd,
        trace=trace.to_dict(),
    )


def _wall(trace: Trace, t: float) -> float:
    """A `hybridllm.clock` time as the wall-clock time Pipecat's metrics read."""
    return trace.wall_start + (t - trace.t_start)


def _settings(given: LLMSettings | None) -> LLMSettings:
    """Pipecat's settings in store mode: those given, the rest None (the policy decides);
    the model is "hybridllm" unless given (each answer's route metrics name the engine)."""
    settings = LLMSettings(
        model="hybridllm",
        system_instruction=None,
        temperature=None,
        max_tokens=None,
        top_p=None,
        top_k=None,
        frequency_penalty=None,
        presence_penalty=None,
        seed=None,
        filter_incomplete_user_turns=False,
        user_turn_completion_config=None,
    )
    for f in fields(LLMSettings) if given is not None else ():
        if is_given(value := getattr(given, f.name)):
            setattr(settings, f.name, value)
    return settings
