"""The engine seam: one small async interface every engine implements.

Like an httpx transport, an engine knows nothing about routing, deadlines or the app. It takes a
`GenerationRequest` and streams `Chunk`s (`Delta`, `Mark`, `Finish`); it maps its own failures to
`hybridllm.errors.EngineError` subclasses at the boundary. `stream()` is an async generator that
the orchestrator always closes (``contextlib.aclosing``): closing it must stop the work at once
(the local worker stops decoding, the cloud connection is closed).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from hybridllm.engines import validate
from hybridllm.engines.options import EngineOptions
from hybridllm.engines.tokens import estimate_prompt_tokens, prompt_token_bound
from hybridllm.errors import ConfigError, InvalidArgumentError
from hybridllm.events import PRIORITIES, Chunk, EngineName, Priority
from hybridllm.policy import Tenant
from hybridllm.tools import ToolSpec

__all__ = [
    "CONTINUE_INSTRUCTION",
    "Engine",
    "EngineInfo",
    "EngineOptions",
    "GenerationRequest",
    "Message",
    "chat_messages",
    "count_prompt_tokens",
    "estimate_prompt_tokens",
    "prompt_token_bound",
]

# role, content (a string) and name; an assistant message may add `tool_calls` (a list of
# OpenAI's {"id", "type": "function", "function": {"name", "arguments"}}), a "tool" message
# carries `tool_call_id` (`engines.validate.messages` checks every field)
Message = Mapping[str, Any]
OptionsT = TypeVar("OptionsT", bound=EngineOptions)

CONTINUE_INSTRUCTION = (
    "Your previous answer was cut off. Continue it exactly where it stopped, mid-word if need "
    "be; do not repeat any of it and do not comment."
)


@dataclass(frozen=True)
class GenerationRequest:
    """What goes on the wire, and nothing else (where it may go, and under which budget, is the
    caller's business: the cloud guard gets that beside the request).

    `options`: typed per-engine options, at most one object per class; each engine reads only its
    own class (`LlamaOptions`, `OpenAIOptions`), so an option meant for one engine never reaches
    another.

    The sampling fields are checked when the request is made (`engines.validate`: max_tokens an
    int >= 1, temperature 0 to 2, top_p in (0, 1], stop strings non-empty, seed 0 to 2**32 - 1):
    a bad value is an `InvalidArgumentError` and never reaches an engine.

    `tools`: what the answer may call and the shape a JSON answer must have; an engine sends
    or enforces it and checks what it produced (`hybridllm.tools.check_call`, `check_answer`).

    `priority` is not sent anywhere: it is the request's class in an engine's queue
    (`engines.queue`: "interactive" before "normal" before "background", and an interactive
    request preempts a background one decoding on the device)."""

    messages: Sequence[Message]
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # text the answer must continue from (mid-stream failover): the start of the assistant turn
    assistant_prefix: str = ""
    options: tuple[EngineOptions, ...] = ()
    priority: Priority = "normal"
    # the tools, tool choice and response format (`hybridllm.tools.tool_spec`; None: plain text)
    tools: ToolSpec | None = None
    # the app's key for the conversation (`validate.conversation`; None: found by content)
    conversation: str | None = None
    # the app's end user (`validate.user`): the budget's per-user caps hold it; never sent to
    # an engine, and kept hashed in a ledger (None: no user)
    user: str | None = None
    # who the request is billed as beside the app (a gateway key: its caps; None: no tenant)
    tenant: Tenant | None = None

    def __post_init__(self) -> None:
        validate.one_of("priority", self.priority, PRIORITIES)
        validate.max_tokens(self.max_tokens)
        validate.temperature(self.temperature)
        validate.top_p(self.top_p)
        validate.seed(self.seed)
        object.__setattr__(self, "stop", validate.stop(self.stop))
        validate.text("assistant_prefix", self.assistant_prefix, blank_ok=True)
        if self.conversation is not None:
            validate.conversation(self.conversation)
        if self.user is not None:
            validate.user(self.user)
        if self.tenant is not None and not isinstance(self.tenant, Tenant):
            raise InvalidArgumentError("tenant", self.tenant, "a hybridllm.policy.Tenant")
        options = self.options
        if isinstance(options, EngineOptions) or not isinstance(options, Iterable):
            raise InvalidArgumentError(
                "options", options, "a sequence of engine options, e.g. (LlamaOptions(),)"
            )
        options = tuple(options)
        seen: set[type[EngineOptions]] = set()
        for option in options:
            if not isinstance(option, EngineOptions):
                raise ConfigError(
                    f"options holds {option!r}: use typed engine options (LlamaOptions, "
                    "OpenAIOptions), not a mapping of keywords"
                )
            if type(option) in seen:
                raise ConfigError(f"options holds two {type(option).__name__} objects")
            seen.add(type(option))
        object.__setattr__(self, "options", options)

    def option(self, kind: type[OptionsT]) -> OptionsT | None:
        """The request's options of this class (None: the engine's defaults)."""
        for option in self.options:
            if isinstance(option, kind):
                return option
        return None


def chat_messages(request: GenerationRequest) -> tuple[Message, ...]:
    """The chat messages an endpoint receives for `request`: a continuation (mid-stream
    failover) adds the delivered text as a partial assistant turn and asks the model to go on
    from it without repeating it. Engines that continue natively (a raw template) may do better;
    what the guard scans and bounds is this."""
    messages = tuple(request.messages)
    if request.assistant_prefix:
        messages += (
            {"role": "assistant", "content": request.assistant_prefix},
            {"role": "user", "content": CONTINUE_INSTRUCTION},
        )
    return messages


@dataclass(frozen=True)
class EngineInfo:
    """What an engine can do and how busy it is, for the router and the orchestrator."""

    name: EngineName
    model: str
    # honours `assistant_prefix` (a started answer goes on without repeating itself): routing
    # allows a mid-stream failover only to an engine that does
    supports_continuation: bool = False
    queue_depth: int = 0
    expected_wait_s: float = 0.0
    # the wait for a request of each priority class, where the queue serves by class (an
    # interactive request skips the waiting background ones and preempts a running one)
    wait_by_priority: Mapping[Priority, float] | None = None
    n_ctx: int | None = None
    # measured speed (local engines: tuning or warm-up, then refined by real requests)
    prefill_tps: float | None = None
    decode_tps: float | None = None
    # why the engine cannot take a request now (None: it can): a cloud engine without a usable
    # API key, a local queue at its bound. Routing leaves such an engine out with this reason
    # when another may serve; a request sent anyway fails at once with a typed error
    unavailable: str | None = None
    # it runs on this device (the privacy guard and the budget apply to every engine that does
    # not); a client holds at most one such engine, the "local" side of its policies
    on_device: bool = False


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

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        """The prompt tokens these messages make with this engine's own tokenizer and chat
        template, cheaply, on the event loop (None: no tokenizer at hand)."""
        ...

    async def aclose(self) -> None:
        """Release every resource (threads, sockets, model memory). Idempotent."""


def count_prompt_tokens(messages: Sequence[Message], engines: Iterable[Engine] = ()) -> int:
    """THE prompt-token figure for routing, the latency model and explain: the first engine
    with a tokenizer at hand counts exactly; else the script-aware estimate."""
    for engine in engines:
        n = engine.count_tokens(messages)
        if n is not None:
            return n
    return estimate_prompt_tokens(messages)
