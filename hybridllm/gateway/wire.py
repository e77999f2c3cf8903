"""A chat-completions request body as the hybrid client's call: the messages, the policy (the
request's `model`, or the ``x-hybridllm-policy`` header) and `StreamArgs`.

Every parameter the gateway passes on is listed (`PASSED`); a parameter it does not support is
a 400 naming it (`param`), never silently dropped, unless it is null or OpenAI's own default
(``n: 1``, ``logprobs: false``, ``presence_penalty: 0``...: asking for what happens anyway).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, cast

from hybridllm.gateway.limits import GatewayLimits
from hybridllm.runtime.admission import StreamArgs
from hybridllm.server.schema import ApiError, ChatBody, parse

__all__ = ["ARGUMENT_PARAMS", "MODEL_PREFIX", "PASSED", "ChatCall", "chat_call", "policy_name"]

MODEL_PREFIX = "hybridllm/"
# what reaches the client's StreamArgs, and what shapes the response
PASSED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "tools",
        "tool_choice",
        "response_format",
        "user",  # OpenAI's end-user id: the client's `user=` (per-user caps; hashed, not logged)
        "prompt_cache_key",  # the client's `conversation=`
    }
)
# parameters accepted at OpenAI's default only (they ask for what happens anyway)
NEUTRAL: Mapping[str, object] = {
    "n": 1,
    "logprobs": False,
    "presence_penalty": 0,
    "frequency_penalty": 0,
}
# the client's argument -> the request's parameter, where their names differ (error `param`s)
ARGUMENT_PARAMS: Mapping[str, str] = {"conversation": "prompt_cache_key"}
# request fields that become StreamArgs as they are (when the request set them)
AS_IS = ("temperature", "top_p", "seed", "tools", "tool_choice", "response_format")


@dataclass(frozen=True, slots=True)
class ChatCall:
    """One chat request as the client takes it: `messages`, `args` (the policy among them),
    whether to stream and to add the usage chunk, and the model name to answer with."""

    messages: list[dict[str, Any]]
    args: StreamArgs
    policy: str
    model: str
    stream: bool
    include_usage: bool


def chat_call(
    data: Mapping[str, Any],
    *,
    header_policy: str | None,
    policies: Collection[str],
    limits: GatewayLimits,
) -> ChatCall:
    """The request `data` (a parsed JSON object) as a `ChatCall`, or the `ApiError` of its first
    problem: an unsupported parameter, a bad field (400), too many messages or tokens (400),
    an unknown policy (404)."""
    _refuse_unsupported(data)
    _refuse_unknown_inner(data)
    body = parse(ChatBody, {k: v for k, v in data.items() if k in PASSED})
    if len(body.messages) > limits.max_messages:
        raise ApiError(
            400,
            f"messages: at most {limits.max_messages} per request, not {len(body.messages)}",
            param="messages",
            code="too_many_messages",
        )
    policy = policy_name(header_policy or body.model, policies)
    args: dict[str, Any] = {"policy": policy}
    set_ = body.model_fields_set
    args.update({name: getattr(body, name) for name in AS_IS if name in set_})
    if "stop" in set_ and body.stop is not None:
        args["stop"] = body.stops()
    args["max_tokens"] = _max_tokens(body, limits)
    key = data.get("prompt_cache_key")
    if key is not None:
        args["conversation"] = _conversation(key)
    user = data.get("user")
    if user is not None:
        args["user"] = _user(user)
    usage = body.stream_options is not None and body.stream_options.include_usage
    messages = [m.message() for m in body.messages]  # a non-text content part: a 400
    return ChatCall(
        messages,
        cast(StreamArgs, {k: v for k, v in args.items() if v is not None}),
        policy,
        body.model,
        body.stream,
        usage,
    )


def _refuse_unsupported(data: Mapping[str, Any]) -> None:
    for name in sorted(set(data) - PASSED):
        value = data[name]
        if value is None or (name in NEUTRAL and value == NEUTRAL[name]):
            continue
        raise ApiError(
            400,
            f"{name} is not supported by the hybridllm gateway (it is never dropped silently)",
            param=name,
            code="unsupported_parameter",
        )


# what a message and `stream_options` may hold on the way to the client (anything else is a 400)
MESSAGE_FIELDS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
STREAM_OPTIONS = frozenset({"include_usage"})


def _refuse_unknown_inner(data: Mapping[str, Any]) -> None:
    """A message field or a `stream_options` key the client does not take is a 400 naming it
    (null counts as absent), never dropped."""
    messages = data.get("messages")
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(m, Mapping):
            _refuse_keys(m, MESSAGE_FIELDS, f"messages[{i}]")
    options = data.get("stream_options")
    if isinstance(options, Mapping):
        _refuse_keys(options, STREAM_OPTIONS, "stream_options")


def _refuse_keys(obj: Mapping[str, Any], known: frozenset[str], at: str) -> None:
    for key in sorted(k for k in obj if k not in known and obj[k] is not None):
        raise ApiError(
            400,
            f"{at}.{key} is not supported by the hybridllm gateway (it is never dropped "
            f"silently; {at} holds {', '.join(sorted(known))})",
            param=f"{at}.{key}",
            code="unsupported_parameter",
        )


def _max_tokens(body: ChatBody, limits: GatewayLimits) -> int | None:
    """`max_completion_tokens` (OpenAI's newer name) or `max_tokens`, within the limit; both,
    with different values, is a 400 (one would be ignored)."""
    both = body.max_tokens is not None and body.max_completion_tokens is not None
    if both and body.max_tokens != body.max_completion_tokens:
        raise ApiError(
            400,
            f"max_tokens ({body.max_tokens}) and max_completion_tokens "
            f"({body.max_completion_tokens}) disagree: give one",
            param="max_tokens",
            code="conflicting_parameters",
        )
    for name in ("max_completion_tokens", "max_tokens"):
        value = getattr(body, name)
        if value is None:
            continue
        if value > limits.max_tokens:
            raise ApiError(
                400,
                f"{name}: at most {limits.max_tokens} on this gateway, not {value}",
                param=name,
                code="max_tokens_too_large",
            )
        return int(value)
    return None  # the policy's


def _conversation(key: object) -> str:
    """`prompt_cache_key` as the client's `conversation=` (the client checks the rest of its
    rule, and its error names the parameter as the request does: `ARGUMENT_PARAMS`)."""
    if not isinstance(key, str):
        raise ApiError(400, "prompt_cache_key must be a string", param="prompt_cache_key")
    return key


def _user(user: object) -> str:
    """OpenAI's `user` as the client's `user=` (its rule checked there: 400 on `user`)."""
    if not isinstance(user, str):
        raise ApiError(400, "user must be a string", param="user")
    return user


def policy_name(model: str, policies: Collection[str]) -> str:
    """The policy a request's `model` (or header) names: ``hybridllm/<policy>`` or the bare
    name, one of `policies` (never a path); else a 404 model_not_found."""
    name = model[len(MODEL_PREFIX) :] if model.startswith(MODEL_PREFIX) else model
    if name not in policies:
        known = ", ".join(f"{MODEL_PREFIX}{p}" for p in sorted(policies))
        raise ApiError(
            404,
            f"the model {model!r} does not exist: a model here is a policy ({known})",
            param="model",
            code="model_not_found",
        )
    return name
