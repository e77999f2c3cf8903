"""Admission: the checked arguments of one request (`HybridClient.stream()`, `complete()`,
`decide()` and the blocking forms) and the `GenerationRequest` they make over the policy's
defaults. The client applies the effective policy and decides (`HybridClient._admit`); the
keyword arguments are listed here only (`StreamArgs`), so mypy checks every form alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from hybridllm import errors
from hybridllm.engines import validate
from hybridllm.engines.base import EngineOptions, GenerationRequest, Message
from hybridllm.engines.capabilities import ConstrainsOutput
from hybridllm.events import EngineName, Priority
from hybridllm.policy import PlanName, Policy, Tenant
from hybridllm.tools import tool_spec

__all__ = [
    "ARG_NAMES",
    "RequestArgs",
    "StreamArgs",
    "build_request",
    "check_constraints",
    "check_names",
]


class RequestArgs(TypedDict, total=False):
    """The keyword arguments of one request, the same for `stream()`, `complete()`, `decide()`
    and the blocking forms (the list lives here only). Each is checked before anything is sent
    (`engines.validate`): `engine` "local", "cloud" or None (forces that engine);
    `max_tokens` an int >= 1; `temperature` 0 to 2; `top_p` in (0, 1]; `stop` non-empty
    strings; `seed` 0 to 2**32 - 1; `options` typed engine options (`LlamaOptions`, ...), each
    engine reads its own; `priority` the request's class in a busy engine's queue (None: the
    policy's); `plan` a plan to run where it can ("handoff": local starts, cloud continues;
    "cascade": the local model's confidence decides; "speculative": local drafts, cloud
    verifies; "hedge"; None: the policy's `plan`, else the decision picks); `show_drafts`: the
    speculative plan's Draft/Retract events; `tools`, `tool_choice`, `response_format`:
    OpenAI's chat-completions shapes (`hybridllm.tools`): the answer may call the tools
    (`ToolCall` events), or must be JSON of the format's schema; `conversation`: the app's own
    key for the conversation this request continues (a non-blank string of at most 256
    characters): the local engine keeps one saved KV state per key, replacing the last, and
    the cloud's prompt cache is keyed by its hash (None: the conversation is found by its
    content); `user`: the app's end user (a non-blank string of at most 256 characters, never
    sent to an engine, hashed where a ledger keeps it): the policy's per-user budget caps hold
    it (`[budget] per_user_day_usd`, `per_user_month_usd`); `tenant`: who the request is billed
    as beside the app (`hybridllm.policy.Tenant`: a gateway key, its own caps; its users are
    its own). None leaves the policy's setting."""

    engine: EngineName | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stop: str | Sequence[str] | None
    seed: int | None
    options: Sequence[EngineOptions]
    priority: Priority | None
    plan: PlanName | None
    show_drafts: bool | None
    tools: Sequence[Mapping[str, Any]] | None
    tool_choice: str | Mapping[str, Any] | None
    response_format: Mapping[str, Any] | None
    conversation: str | None
    user: str | None
    tenant: Tenant | None


class StreamArgs(RequestArgs, total=False):
    """`RequestArgs` and `policy`: a name, a path or a `Policy` (None: the client's)."""

    policy: str | Path | Policy | None


ARG_NAMES = frozenset(StreamArgs.__optional_keys__)


def check_names(args: Mapping[str, object]) -> None:
    """A keyword argument a request does not take is refused by name (mypy catches it too)."""
    for name in sorted(set(args) - ARG_NAMES):
        known = ", ".join(sorted(ARG_NAMES))
        raise errors.InvalidArgumentError(name, args[name], f"a known keyword argument ({known})")


def check_constraints(
    request: GenerationRequest, engines: Mapping[EngineName, object], forced: EngineName | None
) -> None:
    """Each engine that may serve `request` (all, or the forced one) and constrains output
    itself (`ConstrainsOutput`: the local grammar) can take its schemas: a schema it cannot
    take is an `InvalidArgumentError` now, not a failure after another engine was tried."""
    if request.tools is None:
        return
    for name, engine in engines.items():
        if forced in (None, name) and isinstance(engine, ConstrainsOutput):
            engine.check_constraints(request.tools)


def build_request(
    messages: tuple[Message, ...], pol: Policy, args: RequestArgs
) -> GenerationRequest:
    """The request: the call's arguments over the policy's defaults."""
    max_tokens, temperature = args.get("max_tokens"), args.get("temperature")
    top_p, stop, priority = args.get("top_p"), args.get("stop"), args.get("priority")
    return GenerationRequest(
        messages=messages,
        max_tokens=pol.sampling.max_tokens if max_tokens is None else max_tokens,
        temperature=pol.sampling.temperature if temperature is None else temperature,
        top_p=pol.sampling.top_p if top_p is None else top_p,
        stop=pol.sampling.stop if stop is None else validate.stop(stop),
        seed=args.get("seed"),
        options=args.get("options", ()),  # type: ignore[arg-type]  # checked and copied
        priority=pol.priority if priority is None else priority,  # the queue's class
        tools=tool_spec(args.get("tools"), args.get("tool_choice"), args.get("response_format")),
        conversation=args.get("conversation"),
        user=args.get("user"),
        tenant=args.get("tenant"),
    )
