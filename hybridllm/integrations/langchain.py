"""`HybridChatModel`: hybridllm as a LangChain chat model (langchain-core 1.x).

    model = HybridChatModel(client=client, policy="chat")
    async for chunk in model.astream("Explain a mutex in two sentences."):
        print(chunk.content, end="")
    chain = prompt | model.with_structured_output(Answer)   # a JSON-schema answer, parsed

Every call is one `HybridClient` request: the router picks the engine, and the plan (race,
failover, handoff, cascade, ...) runs as it would for the app. What LangChain sees:

- text as `AIMessageChunk`s (`astream`, `stream`) or one `AIMessage` (`ainvoke`, `invoke`);
- the answer's tool calls (`bind_tools`) as `tool_calls` / `tool_call_chunks`, each complete
  and checked against its tool's schema before LangChain sees it (a call is never split);
- the route and the trace in `response_metadata` (engine, plan, policy, reason, decision,
  ttft_ms, cost_usd, finish_reason, and the whole trace as `trace`), on the last chunk of a
  stream; the token counts in `usage_metadata`.

Cancelling an `astream` (its task cancelled, or the generator closed early) closes the
hybridllm stream, which stops every engine before the close returns. The sync forms (`invoke`,
`stream`) go through the client's blocking wrappers (`complete_sync`, `events_sync`), so the
client must not be open in a running event loop then; the async forms need it open
(`async with client`) on the loop they run on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import _ChatModelBinding  # bind()'s type, 1.8+
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    UsageMetadata,
    convert_to_openai_messages,
)
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.output_parsers import (
    BaseOutputParser,
    JsonOutputKeyToolsParser,
    JsonOutputParser,
    PydanticOutputParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, Field

from hybridllm import errors
from hybridllm.client import Completion, HybridClient
from hybridllm.engines import validate
from hybridllm.events import Done, Event, Token, ToolCall
from hybridllm.policy import Policy
from hybridllm.runtime.admission import (
    ARG_NAMES,
    RequestArgs,
    StreamArgs,
    build_request,
    check_names,
)
from hybridllm.runtime.trace import Trace

__all__ = ["HybridChatModel", "route_metadata", "usage_metadata", "to_openai_messages"]

# what LangChain adds to a structured-output call for its tracing, never a request's argument
_TRACING_ONLY = ("ls_structured_output_format", "structured_output_format")
# LangChain's tool_choice words and OpenAI's (which hybridllm takes)
_CHOICES = {"auto": "auto", "none": "none", "required": "required", "any": "required"}

StructuredMethod = Literal["json_schema", "function_calling"]


class HybridChatModel(BaseChatModel):
    """A LangChain chat model over a `HybridClient`: `policy` (a name, a path or a `Policy`;
    None: the client's) for every call unless a call binds its own (`model.bind(policy=...)`).
    Any keyword argument of `HybridClient.stream()` (`max_tokens`, `temperature`, `engine`,
    `plan`, `conversation`, ...) may be given to the constructor (kept in `request`, for every
    call) or bound (`model.bind(max_tokens=60)`, over the constructor's); what was bound holds
    under `with_structured_output` and `bind_tools`, in either order."""

    client: HybridClient
    policy: str | Path | Policy | None = None
    request: dict[str, Any] = Field(default_factory=dict)

    def __init__(
        self, *, client: HybridClient, policy: str | Path | Policy | None = None, **kw: Any
    ) -> None:
        """Checks `client`, `policy` (resolved now, so an unknown name fails here, naming the
        argument) and the request arguments (by name and by value, as the client checks them)
        before LangChain's own fields."""
        if not isinstance(client, HybridClient):
            raise errors.InvalidArgumentError("client", client, "a HybridClient")
        resolved = client.policies.get(validate.policy_ref(policy))
        fields: dict[str, Any] = {"client": client, "policy": policy}
        request = dict(kw.pop("request", None) or {})
        for name, value in kw.items():  # pydantic would drop an unknown one without a word
            if name in type(self).model_fields:
                fields[name] = value
            elif name in ARG_NAMES:
                request[name] = value
            else:
                known = ", ".join(sorted({*type(self).model_fields, *ARG_NAMES} - {"request"}))
                rule = f"a field of the chat model or a request argument ({known})"
                raise errors.InvalidArgumentError(name, value, rule)
        fields["request"] = _checked_request(resolved, request)
        super().__init__(**fields)

    @property
    def _llm_type(self) -> str:
        return "hybridllm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        policy = self.policy.name if isinstance(self.policy, Policy) else self.policy
        request = {k: repr(v) for k, v in sorted(self.request.items())}
        return {"policy": None if policy is None else str(policy), "request": request}

    # ---- the calls ----------------------------------------------------------------------------

    def _args(self, stop: list[str] | None, kwargs: Mapping[str, Any]) -> StreamArgs:
        """The request's keyword arguments: the model's policy and `request`, then what the
        call bound (checked by name here, by value by the client), then LangChain's `stop`."""
        bound = {k: v for k, v in kwargs.items() if k not in _TRACING_ONLY}
        check_names(bound)
        args: dict[str, Any] = {"policy": self.policy, **self.request, **bound}
        if stop:
            args["stop"] = stop
        return cast("StreamArgs", args)  # the names checked above, the values by the client

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """One streamed request; leaving it early (cancelled, closed) stops every engine."""
        args = self._args(stop, kwargs)
        calls = 0
        async with self.client.stream(to_openai_messages(messages), **args) as s:
            async for event in s.events():
                chunk = _chunk(event, calls)
                if chunk is None:
                    continue
                calls += isinstance(event, ToolCall)
                yield chunk

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """`_astream`, blocking (the client's `events_sync`)."""
        events = self.client.events_sync(to_openai_messages(messages), **self._args(stop, kwargs))
        calls = 0
        try:
            for event in events:
                chunk = _chunk(event, calls)
                if chunk is not None:
                    calls += isinstance(event, ToolCall)
                    yield chunk
        finally:
            events.close()  # stops the engines when the caller leaves early

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """One whole answer (`HybridClient.complete`: nothing streamed, so a cascade may
        judge the whole local answer)."""
        args = self._args(stop, kwargs)
        done = await self.client.complete(to_openai_messages(messages), **args)
        return _result(done)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """`_agenerate`, blocking (the client's `complete_sync`)."""
        args = self._args(stop, kwargs)
        return _result(self.client.complete_sync(to_openai_messages(messages), **args))

    # ---- tools and structured output -----------------------------------------------------------

    def bind(self, **kwargs: Any) -> _ChatModelBinding:
        """LangChain's binding, whose `bind_tools` and `with_structured_output` keep what was
        bound (on LangChain's own, they reach the model alone and the bound arguments are lost:
        `model.bind(max_tokens=60).with_structured_output(S)` would ask for the default)."""
        return HybridBinding(bound=self, kwargs=kwargs, config={})

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with `tools` (LangChain tools, functions, pydantic classes or OpenAI
        dicts) offered to every call; `tool_choice`: "auto", "none", "required" (or "any",
        LangChain's word for it, or True), a tool's name, or OpenAI's `{"type": "function",
        ...}`; None: the engines' default ("auto")."""
        return self.bind(**_tools_args(tools, tool_choice), **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: StructuredMethod = "json_schema",
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """The model answering in JSON of `schema` (a pydantic class, a TypedDict, a JSON
        schema or an OpenAI tool dict), parsed: an instance of a pydantic class, else a dict.
        `method` "json_schema" (default) asks for a `json_schema` response format, which the
        local engine enforces with a grammar and the runtime checks; "function_calling" forces
        a call of one tool built from the schema (LangChain's own way, through `bind_tools`).
        `include_raw`: a dict of the message (`raw`), `parsed` and `parsing_error`. Request
        arguments bound on the result (`.bind(max_tokens=60)`) reach the model."""
        return _structured(self, schema, include_raw, method, kwargs)


class HybridBinding(_ChatModelBinding):
    """`HybridChatModel.bind(...)`: LangChain's binding (a `RunnableBinding`, its `kwargs`
    what was bound), whose `bind_tools` and `with_structured_output` bind on it, so what was
    bound before reaches the request."""

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """`HybridChatModel.bind_tools`, over what this binding holds."""
        return self.bind(**_tools_args(tools, tool_choice), **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: StructuredMethod = "json_schema",
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """`HybridChatModel.with_structured_output`, over what this binding holds."""
        return _structured(self, schema, include_raw, method, kwargs)


def _checked_request(policy: Policy, request: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's request arguments, checked now by name and by value as the client
    checks a call's (a bad one is the client's own `InvalidArgumentError`, naming it)."""
    check_names(request)
    if "policy" in request:
        raise errors.InvalidArgumentError("request.policy", request["policy"], "absent: policy=")
    if request.get("engine") is not None:
        validate.engine_name("engine", request["engine"])  # the client's: a side or a name
    probe = validate.messages([{"role": "user", "content": "?"}])
    build_request(probe, policy, cast("RequestArgs", request))  # raises on a bad value
    return dict(request)


def _tools_args(
    tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
    tool_choice: str | dict[str, Any] | bool | None,
) -> dict[str, Any]:
    """`bind_tools`' request arguments: the tools as OpenAI's, and the tool choice if any."""
    args: dict[str, Any] = {"tools": [convert_to_openai_tool(t) for t in tools]}
    if tool_choice is not None and tool_choice is not False:
        args["tool_choice"] = _tool_choice(tool_choice)
    return args


def _structured(
    base: HybridChatModel | HybridBinding,
    schema: dict[str, Any] | type,
    include_raw: bool,
    method: StructuredMethod,
    kwargs: Mapping[str, Any],
) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
    """`with_structured_output` on the model or a binding of it (`base`, which keeps what it
    bound): the model asked for `schema` (a response format, or a forced tool call), then the
    parser; the model is the chain's first step, so what is bound on the chain reaches it."""
    if method not in ("json_schema", "function_calling"):
        rule = '"json_schema" or "function_calling"'
        raise errors.InvalidArgumentError("method", method, rule)
    if kwargs:
        rule = "no other keyword argument (include_raw, method)"
        raise errors.InvalidArgumentError(next(iter(kwargs)), kwargs, rule)
    traced = {"kwargs": {"method": method}, "schema": schema}
    function = convert_to_openai_tool(schema)["function"]
    pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    llm: Runnable[LanguageModelInput, AIMessage]
    parser: BaseOutputParser[Any]
    if method == "function_calling":  # LangChain's own way
        llm = base.bind_tools([schema], tool_choice="any", ls_structured_output_format=traced)
        parser = JsonOutputKeyToolsParser(key_name=function["name"], first_tool_only=True)
        if pydantic:
            parser = PydanticToolsParser(
                tools=[cast("type[BaseModel]", schema)], first_tool_only=True
            )
    else:
        spec = {"name": function["name"], "schema": function["parameters"], "strict": True}
        format_ = {"type": "json_schema", "json_schema": spec}
        llm = base.bind(response_format=format_, ls_structured_output_format=traced)
        parser = JsonOutputParser()
        if pydantic:
            parser = PydanticOutputParser(pydantic_object=cast("type[BaseModel]", schema))
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(
        parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
    )
    failed = RunnablePassthrough.assign(parsed=lambda _: None)
    raw = RunnableMap(raw=RunnablePassthrough())  # after the model, not around it (see above)
    return llm | raw | parsed.with_fallbacks([failed], exception_key="parsing_error")


# ---- conversions ---------------------------------------------------------------------------------


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain's messages as OpenAI chat dicts (text content, an assistant's `tool_calls`,
    a tool result's `tool_call_id`), which the client checks one by one."""
    out: list[dict[str, Any]] = convert_to_openai_messages(list(messages), text_format="string")
    for m in out:
        if m.get("content") is None:
            m["content"] = ""
    return out


def route_metadata(trace: Trace) -> dict[str, Any]:
    """The route and the trace as a message's `response_metadata`: JSON-ready values."""
    model = next((a.model for a in reversed(trace.attempts) if a.engine == trace.engine), None)
    return {
        "model_provider": "hybridllm",
        "model_name": model,
        "engine": trace.engine,
        "plan": trace.plan,
        "policy": trace.policy,
        "reason": trace.route_reason,
        "decision": list(trace.reasons),
        "reason_codes": list(trace.reason_codes),
        "ttft_ms": trace.ttft_ms,
        "cost_usd": trace.cost_usd,
        "finish_reason": trace.finish_reason,
        "request_id": trace.request_id,
        "trace": trace.to_dict(),
    }


def usage_metadata(trace: Trace) -> UsageMetadata:
    """The request's token counts as LangChain's `usage_metadata`."""
    prompt, completion = trace.prompt_tokens or 0, trace.completion_tokens or 0
    usage = UsageMetadata(
        input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion
    )
    if trace.cached_prompt_tokens:
        usage["input_token_details"] = {"cache_read": trace.cached_prompt_tokens}
    return usage


def _chunk(event: Event, calls: int) -> ChatGenerationChunk | None:
    """The LangChain chunk of one event (None: an event LangChain has no place for; the
    trace keeps it). `calls`: the tool calls sent before, the index of this one."""
    if isinstance(event, Token):
        return ChatGenerationChunk(message=AIMessageChunk(content=event.text))
    if isinstance(event, ToolCall):
        part = tool_call_chunk(name=event.name, args=event.arguments, id=event.id, index=calls)
        return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[part]))
    if isinstance(event, Done):
        last = AIMessageChunk(
            content="",
            response_metadata=route_metadata(event.trace),
            usage_metadata=usage_metadata(event.trace),
            chunk_position="last",
        )
        return ChatGenerationChunk(message=last)
    return None


def _result(done: Completion) -> ChatResult:
    """A whole answer as LangChain's result: one AIMessage with its calls, route and usage."""
    calls = [tool_call(name=c.name, args=c.parsed(), id=c.id) for c in done.tool_calls]
    message = AIMessage(
        content=done.text,
        tool_calls=calls,
        response_metadata=route_metadata(done.trace),
        usage_metadata=usage_metadata(done.trace),
    )
    return ChatResult(generations=[ChatGeneration(message=message)])


def _tool_choice(choice: str | dict[str, Any] | bool) -> str | dict[str, Any]:
    """LangChain's `tool_choice` as OpenAI's (which the client checks against the tools)."""
    if choice is True:
        return "required"
    if isinstance(choice, dict):
        return choice
    if isinstance(choice, str) and choice.strip():
        word = _CHOICES.get(choice)
        return word or {"type": "function", "function": {"name": choice}}
    rule = '"auto", "none", "required", "any", True, a tool\'s name or a mapping'
    raise errors.InvalidArgumentError("tool_choice", choice, rule)
