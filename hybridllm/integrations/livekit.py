"""LiveKit Agents' `llm.LLM` over a `HybridClient` (issue 30; livekit-agents 1.x).

    from livekit.agents import Agent, AgentSession
    from hybridllm.integrations.livekit import HybridLLM

    session = AgentSession(llm=HybridLLM(client=client, policy="voice-assistant"), ...)

`chat()` turns LiveKit's `ChatContext` into OpenAI chat messages and the agent's function
tools into OpenAI tool schemas (LiveKit's own converters, the ones its OpenAI plugin uses), runs
one hybrid request, and hands its events back as `ChatChunk`s: text as content deltas, each
checked tool call as a `FunctionToolCall` the agent runs with its `function_tool`, usage as
`CompletionUsage`. Which engine answered and why reaches the app in LiveKit's ways: the last
chunk's `delta.extra["hybridllm"]` (LiveKit keeps it on the assistant message's `extra`), the
request span's attributes, the LLM's `"hybridllm_trace"` event with the whole `Trace`, and
`HybridLLMStream.trace`. LiveKit's own `LLMMetrics` (`metrics_collected`) are measured by
LiveKit from these chunks, so their `ttft` is the time to the first token hybridllm delivered.

Interruption (LiveKit cancels the reply's task) and `aclose()` close the hybrid stream, which
cancels every engine: the local decode stops and the cloud connection is closed.

hybridllm runs its own deadlines, retries and failover (the policy), so LiveKit's
`conn_options` (an attempt timeout and retry count meant for one provider's HTTP call) are not
used, and a failure of both engines is raised as a non-retryable `APIConnectionError`: LiveKit
does not run the whole hybrid plan again. A refusal (`RefusedError`: privacy, budget) and a
bad argument (`ConfigError`) are raised as they are: they are answers, not outages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Unpack

from livekit.agents import APIConnectionError, llm
from livekit.agents.types import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectOptions,
    NotGivenOr,
)
from livekit.agents.utils import is_given

from hybridllm import errors
from hybridllm.client import HybridClient
from hybridllm.events import Done, Event, Token, ToolCall, Usage
from hybridllm.policy import Policy
from hybridllm.runtime.admission import RequestArgs, StreamArgs, check_names
from hybridllm.runtime.trace import Trace
from hybridllm.tools import tool_spec

PolicyArg = str | Path | Policy | None
TRACE_EVENT: Literal["hybridllm_trace"] = "hybridllm_trace"
# arguments LiveKit cannot take: its text goes to speech as it comes, nothing can be retracted
REFUSED_ARGS = {"show_drafts": "absent: LiveKit speaks text as it comes and cannot retract it"}


class HybridLLM(llm.LLM[Literal["hybridllm_trace"]]):
    """An `llm.LLM` whose every reply is one `HybridClient` request under `policy` (a name, a
    path, a `Policy`; None: the client's). `request` holds keyword arguments of
    `HybridClient.stream` for every reply (`max_tokens`, `temperature`, `engine`, ...); a
    call's `extra_kwargs` add to them. The client is the app's: open it before the session,
    close it after (this LLM's `aclose` leaves it open)."""

    def __init__(
        self, *, client: HybridClient, policy: PolicyArg = None, **request: Unpack[RequestArgs]
    ) -> None:
        super().__init__()
        if not isinstance(client, HybridClient):
            raise errors.InvalidArgumentError("client", client, "a HybridClient")
        self._client = client
        self._policy = policy
        self._request = request_args(dict(request))

    @property
    def model(self) -> str:
        """The policy's name: the model that answers is chosen per request (see the trace)."""
        if isinstance(self._policy, Policy):
            return self._policy.name
        return str(self._policy) if self._policy is not None else "hybridllm"

    @property
    def provider(self) -> str:
        return "hybridllm"

    @property
    def client(self) -> HybridClient:
        return self._client

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> HybridLLMStream:
        """One reply. `tool_choice` is sent as given, with the tools or without them, checked
        here as the client checks a `stream()` call's ("none" asks for no call; another choice
        with no tools is the client's `InvalidArgumentError` naming `tool_choice`).
        `parallel_tool_calls`: True (or not given) is what every engine does, an answer may
        carry several calls, each checked; False has no field in a hybridllm request and is an
        `InvalidArgumentError` naming it. Bad tools or messages raise here, typed."""
        args: dict[str, Any] = dict(self._request)
        if is_given(extra_kwargs):
            args.update(request_args(extra_kwargs, name="extra_kwargs"))
        if is_given(parallel_tool_calls) and parallel_tool_calls is not True:
            rule = "True or not given (an answer may carry several calls; hybridllm has no bound)"
            raise errors.InvalidArgumentError("parallel_tool_calls", parallel_tool_calls, rule)
        schemas = tool_schemas(tools or [])
        if schemas:
            args["tools"] = schemas
        if is_given(tool_choice):
            choice = dict(tool_choice) if isinstance(tool_choice, Mapping) else tool_choice
            args["tool_choice"] = choice
        tool_spec(args.get("tools"), args.get("tool_choice"), args.get("response_format"))
        args["policy"] = self._policy
        return HybridLLMStream(
            self,
            chat_ctx=chat_ctx,
            tools=tools or [],
            conn_options=conn_options,
            messages=chat_messages(chat_ctx),
            args=args,
        )


class HybridLLMStream(llm.LLMStream):
    """One reply's chunks. `trace` is the hybrid request's trace once it started (route,
    engines, TTFT, usage, cost)."""

    def __init__(
        self,
        hybrid: HybridLLM,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool],
        conn_options: APIConnectOptions,
        messages: list[dict[str, Any]],
        args: dict[str, Any],
    ) -> None:
        self._hybrid = hybrid
        self._messages = messages
        self._args: StreamArgs = args  # type: ignore[assignment]  # checked by request_args
        self._trace: Trace | None = None
        super().__init__(hybrid, chat_ctx=chat_ctx, tools=tools, conn_options=conn_options)

    @property
    def trace(self) -> Trace | None:
        return self._trace

    async def _run(self) -> None:
        stream = self._hybrid.client.stream(self._messages, **self._args)
        self._trace = stream.trace
        try:
            async with stream:
                async for event in stream.events():
                    chunk = to_chunk(event, stream.trace.request_id)
                    if chunk is not None:
                        self._event_ch.send_nowait(chunk)
        except errors.EngineError as exc:
            raise APIConnectionError(f"hybridllm: {exc}", retryable=False) from exc
        finally:
            self._trace = stream.trace  # the frozen value, once the stream has ended
            self._report(self._trace)

    def _report(self, trace: Trace) -> None:
        """The route on the request span, and the whole trace to the LLM's listeners."""
        span = self._llm_request_span
        if span is not None and span.is_recording():
            span.set_attributes({f"hybridllm.{k}": v for k, v in route_info(trace).items()})
        self._hybrid.emit(TRACE_EVENT, trace)


def request_args(args: Mapping[str, Any], *, name: str = "request") -> dict[str, Any]:
    """`args` checked as `HybridClient.stream`'s keyword arguments (each bad name refused by
    name); `policy` is the adapter's own argument, and `show_drafts` cannot be honoured."""
    check_names(args)
    for key, rule in REFUSED_ARGS.items():
        if args.get(key):
            raise errors.InvalidArgumentError(f"{name}.{key}", args[key], rule)
    if "policy" in args:
        raise errors.InvalidArgumentError(f"{name}.policy", args["policy"], "HybridLLM(policy=)")
    return dict(args)


def chat_messages(chat_ctx: llm.ChatContext) -> list[dict[str, Any]]:
    """The context as OpenAI chat messages, by LiveKit's own converter; text only (an image
    is refused: neither engine is sent one), provider-specific `extra_content` dropped."""
    converted, _ = chat_ctx.to_provider_format("openai", inject_dummy_user_message=False)
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(converted):
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise errors.InvalidArgumentError(
                f"chat_ctx.items[{i}].content", content, "text (hybridllm sends no images)"
            )
        messages.append({k: v for k, v in message.items() if k != "extra_content"})
    return messages


def tool_schemas(tools: list[llm.Tool]) -> list[dict[str, Any]]:
    """The agent's function tools as OpenAI tool schemas (strict, as LiveKit's OpenAI plugin
    sends them). A provider tool (a cloud vendor's hosted tool) is refused by position: the
    local engine cannot run it."""
    for i, tool in enumerate(tools):
        if isinstance(tool, llm.ProviderTool):
            raise errors.InvalidArgumentError(f"tools[{i}]", tool, "a function tool")
    return llm.ToolContext(tools).parse_function_tools("openai", strict=True)


def to_chunk(event: Event, request_id: str) -> llm.ChatChunk | None:
    """One hybridllm event as a LiveKit chunk (None: nothing LiveKit takes)."""
    if isinstance(event, Token):
        delta = llm.ChoiceDelta(role="assistant", content=event.text)
        return llm.ChatChunk(id=request_id, delta=delta)
    if isinstance(event, ToolCall):
        call = llm.FunctionToolCall(name=event.name, arguments=event.arguments, call_id=event.id)
        return llm.ChatChunk(
            id=request_id, delta=llm.ChoiceDelta(role="assistant", tool_calls=[call])
        )
    if isinstance(event, Usage):
        usage = llm.CompletionUsage(
            prompt_tokens=event.prompt_tokens,
            completion_tokens=event.completion_tokens,
            total_tokens=event.prompt_tokens + event.completion_tokens,
        )
        return llm.ChatChunk(id=request_id, usage=usage)
    if isinstance(event, Done):
        extra = {"hybridllm": route_info(event.trace)}
        return llm.ChatChunk(id=request_id, delta=llm.ChoiceDelta(extra=extra))
    return None


def route_info(trace: Trace) -> dict[str, str | float | int]:
    """The route and the trace's headline figures, JSON-ready (no None: span attributes)."""
    info: dict[str, str | float | int] = {
        "request_id": trace.request_id,
        "engine": trace.engine or "",
        "route_reason": trace.route_reason,
        "plan": trace.plan or "",
        "started": json.dumps(trace.started),
    }
    figures = {"ttft_ms": trace.ttft_ms, "total_ms": trace.total_ms, "cost_usd": trace.cost_usd}
    info.update({k: round(v, 6) for k, v in figures.items() if v is not None})
    if trace.fallback_cause is not None:
        info["fallback_cause"] = trace.fallback_cause
        info["fallback_reason"] = trace.fallback_reason or ""
    return info
