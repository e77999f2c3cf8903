"""`OpenAIEngine`: streaming chat completions from any OpenAI-compatible endpoint.

Uses `openai.AsyncOpenAI` with the SDK's own retries off (retries, if any, belong to the
orchestrator, which knows the deadline). Every failure leaves this module as a
`hybridllm.errors.CloudError` subclass carrying the status code, Retry-After and whether content
had already been delivered. Closing the stream closes the HTTP response at once, so the server
sees the disconnect.

A missing or refused API key is configuration, not a passing fault. Without a key (no `api_key=`,
no `OPENAI_API_KEY`) the engine never sends a placeholder: it is unavailable from the start. Once
the endpoint refuses the key (401/403), that request fails with `AuthenticationError` and the
engine stops sending. Either way `info().unavailable` gives the reason (routing then serves
locally and says why), a `RuntimeWarning` says it once, and `stream()` raises
`CloudUnavailableError` (nothing sent) until `set_api_key()` gives a new key.

Tools (`GenerationRequest.tools`): `tools`, `tool_choice` and `response_format` are sent as the
caller gave them (`ToolSpec.wire()`), and a tool loop's messages whole (an assistant message's
`tool_calls`, a tool message's `tool_call_id`). The streamed `delta.tool_calls` pieces are
assembled into complete calls (`engines.call_deltas`), each yielded as one `Called`, never
partial; text deltas stream as before. An answer that called finishes with "tool_calls" (also
where OpenAI says "stop": a call `tool_choice` forced). A malformed piece is a
`CloudProtocolError`; whether a call is valid is the runtime's check (`runtime.checked`).
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import inspect
import logging
import math
import os
import re
import ssl
import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal, cast
from urllib.parse import urlsplit

import anyio
import httpx2
import openai

from hybridllm import clock, errors
from hybridllm.engines import validate
from hybridllm.engines.base import (
    EngineInfo,
    GenerationRequest,
    Message,
    chat_messages,
    estimate_prompt_tokens,
)
from hybridllm.engines.call_deltas import CallAssembler
from hybridllm.engines.capabilities import Endpoint, EngineCheck, Outgoing
from hybridllm.engines.continuation import (
    CONTINUATIONS,
    Continuation,
    Dialect,
    continued_messages,
    dialect_fields,
    probe,
)
from hybridllm.engines.limit import ConcurrencyLimit
from hybridllm.engines.options import OpenAIOptions
from hybridllm.engines.template import ChatTemplate
from hybridllm.engines.tokens import estimate_text_tokens
from hybridllm.events import (
    PRIORITIES,
    Called,
    CallOpened,
    Chunk,
    Delta,
    EngineName,
    Finish,
    Mark,
    RequestSent,
    TokenLimit,
)

DEFAULT_TIMEOUT = httpx2.Timeout(60.0, connect=5.0)
OPENAI_BASE_URL = "https://api.openai.com/v1"  # the openai SDK's own default
PROBE_TIMEOUT_S = 10.0  # the continuation probe's bound (a few tokens, once per engine)
TokenLimitParam = Literal["auto", "max_tokens", "max_completion_tokens"]
TOKEN_LIMIT_PARAMS: tuple[TokenLimitParam, ...] = ("auto", "max_tokens", "max_completion_tokens")
# OpenAI's reasoning models, which refuse `max_tokens` (o1, o3-mini, o4-mini, gpt-5, gpt-5.1, ...)
REASONING_MODEL = re.compile(r"(o\d+|gpt-5)($|[-.])")
NO_KEY = (
    "no API key: set OPENAI_API_KEY or pass api_key= (any non-empty value for a server that "
    "needs none)"
)

log = logging.getLogger(__name__)


async def _close(stream: Any) -> None:
    """Close the SDK's stream. An instrumentation may hand back its own wrapper of it
    (opentelemetry-instrumentation-openai-v2 does, with a synchronous `close()` that leaves the
    SDK stream's close un-awaited): then close the stream it wraps and end the wrapper as an
    async context manager does (its span ends; it ignores a second end)."""
    if isinstance(stream, openai.AsyncStream):
        await stream.close()
        return
    inner = getattr(stream, "stream", None)
    if isinstance(inner, openai.AsyncStream):
        await inner.close()
        await stream.__aexit__(None, None, None)
        return
    closing = stream.close()
    if inspect.isawaitable(closing):
        await closing


class OpenAIEngine:
    """An OpenAI-compatible chat endpoint.

    `base_url` and `api_key` default to the openai SDK's environment variables
    (`OPENAI_BASE_URL`, `OPENAI_API_KEY`). `timeout` is the SDK's timeout (seconds or
    `httpx2.Timeout`); `include_usage` asks the server for a final usage chunk. Without a key
    the engine sends nothing (see the module); a server that needs no key takes any value
    (`api_key="none"`).

    Checked when made (`InvalidArgumentError`): `base_url` an http(s) URL, `api_key` a
    string, `model` a non-blank string, `timeout` a number of seconds > 0 or an `httpx2.Timeout`,
    `include_usage` a bool, `default_headers` a mapping of strings, `name` "local" or "cloud",
    `max_concurrency` an int >= 1 and `queue_timeout_s` seconds > 0 (or None).

    `max_concurrency`: at most this many requests in flight to the endpoint; the others wait
    (by priority, then arrival) at most `queue_timeout_s`, then fail with
    `CloudQueueTimeoutError` (`engines.limit`). A 429's Retry-After holds them too, and both
    show in `info().expected_wait_s`, which routing adds to the cloud's first-token time.

    `continuation`: how a continuation (a request with `assistant_prefix`: failover, handoff)
    is asked for. "instruction" (any endpoint): the delivered text as an assistant turn, then a
    user turn asking to go on (`engines.base.chat_messages`); the model starts a new turn and
    may restart the answer. "continue_final_message" (vLLM's extra chat parameters, and
    `hybridllm serve-model`): the delivered text is the final assistant message, left open, and the
    model continues the text itself; its prompt is the original prompt plus the delivered text,
    so a server's prefix cache covers all but the new tokens. "trailing_assistant": the delivered
    text as a trailing assistant message (hosts that continue it). "raw_completion" (needs
    `chat_template`): the prompt written here from the model's chat template with the delivered
    text in the opened assistant turn, sent to `/v1/completions` (llama-cpp-python's server,
    vLLM); a continuation with tools or a JSON schema goes as the instruction instead. "auto"
    (the default) probes once (`engines.continuation`).

    `chat_template`: the served model's chat template (`engines.template.ChatTemplate`, or its
    Jinja text), for the "raw_completion" dialect; `ChatTemplate.of_gguf(...)` reads one from a
    GGUF model.

    `max_context`: the endpoint's context in tokens, where known (None: what `check()` reads
    from the endpoint's model list, vLLM's `max_model_len` and the like, else not known;
    `context`). Routing sends a prompt the context cannot hold elsewhere. A request's
    `max_tokens` is then sent cut to what the context leaves after the prompt (estimated: the
    endpoint's tokenizer is not at hand), at least 1. `token_limit_param`: the field that carries
    it. "auto": `max_completion_tokens` for OpenAI's reasoning models (o1, o3, o4-mini, the gpt-5
    family) on OpenAI's own hosts (api.openai.com, *.openai.azure.com), which refuse
    `max_tokens`; `max_tokens` elsewhere (llama-cpp-python's server knows no other; vLLM takes
    both). The `RequestSent` mark carries what was sent (`TokenLimit`; `Trace.token_limit`).
    By the same rule `temperature` and `top_p` are left out for those models on those hosts,
    which refuse them (`reasoning_host`).
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float | httpx2.Timeout = DEFAULT_TIMEOUT,
        include_usage: bool = True,
        default_headers: Mapping[str, str] | None = None,
        name: EngineName = "cloud",
        max_concurrency: int | None = None,
        queue_timeout_s: float | None = None,
        continuation: Continuation = "auto",
        max_context: int | None = None,
        token_limit_param: TokenLimitParam = "auto",
        chat_template: ChatTemplate | str | None = None,
    ) -> None:
        self.limit = ConcurrencyLimit(name, max_concurrency, queue_timeout_s)
        self.max_context = (
            None if max_context is None else validate.integer("max_context", max_context, minimum=1)
        )
        # the model's context as the endpoint's model list says it (`check()`: vLLM's
        # `max_model_len`, ...); `max_context` given wins
        self.reported_context: int | None = None
        self.token_limit_param = validate.one_of(
            "token_limit_param", token_limit_param, TOKEN_LIMIT_PARAMS
        )
        if continuation not in CONTINUATIONS:
            raise errors.InvalidArgumentError(
                "continuation", continuation, " or ".join(map(repr, CONTINUATIONS))
            )
        self.continuation: Continuation = continuation
        self.chat_template = _template(chat_template, continuation)
        # the dialect continuations are sent in (`engines.continuation`): fixed, or probed once
        self._dialect: Dialect | None = None if continuation == "auto" else continuation
        self._probing = anyio.Lock()
        _check_args(base_url, api_key, model, timeout, include_usage, default_headers, name)
        self.name: EngineName = name
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        self.api_key: str | None = api_key or os.environ.get("OPENAI_API_KEY") or None
        # why the engine sends nothing (a missing or refused key), and whether it was said
        self._unavailable: errors.CloudUnavailableError | None = (
            errors.CloudUnavailableError(NO_KEY) if self.api_key is None else None
        )
        self._warned = False
        self.model = model or os.environ.get("OPENAI_MODEL") or "gpt-4o-mini"
        self.include_usage = include_usage
        self._timeout = timeout
        # the longest wait for one stream event (keep-alives do not count): the read timeout
        self._read_timeout_s = timeout.read if isinstance(timeout, httpx2.Timeout) else timeout
        self._headers = dict(default_headers or {})
        self._client: openai.AsyncOpenAI | None = None
        self._active = 0

    @property
    def unavailable(self) -> str | None:
        """Why the engine sends nothing now (None: it sends)."""
        return None if self._unavailable is None else self._unavailable.reason

    def set_api_key(self, api_key: str) -> None:
        """Use a new API key from the next request on; an engine stopped by a missing or
        refused key sends again."""
        if not isinstance(api_key, str) or not api_key.strip():
            raise errors.ConfigError("api_key must be a non-empty string")
        self.api_key = api_key
        self._unavailable = None
        self._warned = False
        if self._client is not None:  # the same connection pool, the new key
            self._client = self._client.with_options(api_key=api_key)

    def _stop(self, reason: errors.CloudUnavailableError) -> None:
        """Stop sending, and say so once (until the key changes)."""
        self._unavailable = reason
        self._say()

    def _say(self) -> None:
        if self._unavailable is not None and not self._warned:
            self._warned = True
            log.warning("%s; requests are served without the cloud", self._unavailable)
            warnings.warn(
                f"{self._unavailable}; requests are served without the cloud until the key "
                "changes (OpenAIEngine.set_api_key())",
                RuntimeWarning,
                stacklevel=3,
            )

    async def start(self) -> None:
        self._say()  # a missing key: said when the engine starts, not at every request
        if self._client is None and self.api_key is not None:  # without one: made by the key
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self.api_key or "",
                timeout=self._timeout,
                max_retries=0,
                default_headers=self._headers or None,
                http_client=openai.DefaultAsyncHttpxClient(verify=shared_tls()),
            )

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            model=self.model,
            supports_continuation=True,
            queue_depth=self._active + self.limit.waiting,
            expected_wait_s=self.limit.expected_wait_s(),
            wait_by_priority={p: self.limit.expected_wait_s(p) for p in PRIORITIES},
            unavailable=self.unavailable or self._queue_unavailable(),
            n_ctx=self.context,
        )

    @property
    def context(self) -> int | None:
        """The endpoint's context in tokens: `max_context`, else what `check()` read from the
        endpoint's model list (None: not known)."""
        return self.max_context if self.max_context is not None else self.reported_context

    def _queue_unavailable(self) -> str | None:
        limit = self.limit
        wait, timeout = limit.expected_wait_s(), limit.queue_timeout_s
        if limit.max_concurrency is not None and timeout is not None and wait > timeout:
            return f"cloud queue wait ~{wait:.1f} s > queue_timeout_s={timeout:g} s"
        return None

    def predict_ttft_s(self, request: GenerationRequest) -> float | None:
        return None  # learned from traces by the latency model (a later issue)

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return None  # the endpoint's tokenizer is not at hand

    def token_limit(self, request: GenerationRequest) -> TokenLimit:
        """The output-token bound `request` is sent with: `max_tokens`, cut to what
        `max_context` leaves after the (estimated) prompt, in the field the endpoint accepts."""
        sent, context = request.max_tokens, self.context
        if context is not None:
            prompt = estimate_prompt_tokens(self._messages(request), request.tools)
            sent = max(1, min(sent, context - prompt))
        param = self.token_limit_param
        if param == "auto":
            param = "max_completion_tokens" if self.reasoning_host else "max_tokens"
        return TokenLimit(param, sent, request.max_tokens)

    @property
    def reasoning_host(self) -> bool:
        """One of OpenAI's reasoning models on OpenAI's own hosts, which refuse `max_tokens`,
        `temperature` and `top_p` (only their defaults are taken)."""
        return self._openai_host() and REASONING_MODEL.match(self.model) is not None

    def _openai_host(self) -> bool:
        """The endpoint is OpenAI's own (or Azure OpenAI), whose documented fields we may add."""
        host = self._host
        return host == "api.openai.com" or host.endswith(".openai.azure.com")

    @property
    def _host(self) -> str:
        """The endpoint's host name ("api.openai.com" without a `base_url`)."""
        return urlsplit(self.base_url or OPENAI_BASE_URL).hostname or ""

    def _fields(
        self, request: GenerationRequest, limit: TokenLimit, dialect: Dialect | None = None
    ) -> dict[str, Any]:
        """The request's fields besides model, messages and stream."""
        options = request.option(OpenAIOptions)
        kwargs: dict[str, Any] = {} if options is None else options.fields()
        kwargs[limit.param] = limit.sent
        if not self.reasoning_host:  # those refuse any value: the model samples its own way
            kwargs["temperature"], kwargs["top_p"] = request.temperature, request.top_p
        if request.seed is not None:
            kwargs["seed"] = request.seed
        if request.stop:
            kwargs["stop"] = list(request.stop)
        if self.include_usage:
            kwargs["stream_options"] = {"include_usage": True}
        if request.tools is not None:  # tools, tool_choice, response_format: as given
            kwargs.update(request.tools.wire())
        if self._openai_host():  # cache affinity: one key per conversation (its opening)
            key = conversation_key(request.messages, request.conversation)
            kwargs.setdefault("prompt_cache_key", key)
        fields = dialect_fields(dialect) if request.assistant_prefix and dialect else {}
        if fields:
            kwargs["extra_body"] = {**dict(kwargs.get("extra_body") or {}), **fields}
        return kwargs

    def _messages(
        self, request: GenerationRequest, dialect: Dialect | None = None
    ) -> list[dict[str, Any]]:
        """The chat messages (a continuation's included: the delivered text as the open final
        message in `dialect`, or `engines.base.chat_messages`' instruction), each whole: an
        assistant message's `tool_calls` and a tool message's `tool_call_id` go as given."""
        dialect = self._dialect if dialect is None else dialect  # the engine's, where fixed
        if request.assistant_prefix and dialect is not None:
            prefix = request.assistant_prefix
            shaped = continued_messages(request.messages, prefix, dialect, self._host)
            if shaped is not None:
                return shaped
        return [dict(m) for m in chat_messages(request)]

    async def continuation_dialect(self) -> Dialect:
        """The dialect this engine's continuations are sent in: the one given, else the one
        probed (once; `engines.continuation.probe`), else "instruction" while the endpoint
        cannot be probed."""
        if self._dialect is None:
            async with self._probing:
                if self._dialect is None:
                    self._dialect = await self.probe_continuation()
        return self._dialect or "instruction"

    async def probe_continuation(self) -> Dialect | None:
        """Probe the endpoint's continuation dialect now (None: it could not be reached)."""
        raw = self._probe_raw if self.chat_template is not None else None
        found = await probe(self._probe_send, self._host, raw)
        if found is not None:
            log.info("%s: continuations in the %s dialect", self.base_url or self._host, found)
        return found

    async def _probe_send(
        self, messages: list[dict[str, Any]], extra: dict[str, Any]
    ) -> str | None:
        """One probe request, streamed: its text, or None where the endpoint refused it (4xx)."""
        client = await self._ready_client()
        pieces: list[str] = []
        try:
            with anyio.fail_after(PROBE_TIMEOUT_S):
                sent = client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    stream=True,
                    max_tokens=6,
                    temperature=0.0,
                    extra_body=extra or None,
                )
                stream = cast("openai.AsyncStream[Any]", await sent)
                async for c in stream:
                    if c.choices and c.choices[0].delta.content:
                        pieces.append(c.choices[0].delta.content)
        except openai.APIStatusError as exc:
            if 400 <= exc.status_code < 500 and exc.status_code != 429:
                return None  # the dialect's fields refused here
            raise
        return "".join(pieces)

    async def _probe_raw(self, messages: list[dict[str, Any]], prefix: str) -> str | None:
        """One probe request in the raw-completion dialect: its text, or None where the
        endpoint refused it (a 4xx: no `/v1/completions`)."""
        assert self.chat_template is not None
        client = await self._ready_client()
        try:
            with anyio.fail_after(PROBE_TIMEOUT_S):
                answer = await client.completions.create(
                    model=self.model,
                    prompt=self.chat_template.prompt(messages, prefix),
                    max_tokens=6,
                    temperature=0.0,
                )
        except openai.APIStatusError as exc:
            if 400 <= exc.status_code < 500 and exc.status_code != 429:
                return None
            raise
        return "".join(c.text or "" for c in answer.choices[:1])

    def _raw_prompt(self, request: GenerationRequest, dialect: Dialect | None) -> str | None:
        """The raw prompt of a continuation sent in the raw-completion dialect (None: not one;
        one with tools or a schema, or whose messages the template refuses, goes as the
        instruction)."""
        if dialect != "raw_completion" or not request.assistant_prefix or request.tools is not None:
            return None
        assert self.chat_template is not None
        try:
            return self.chat_template.prompt(request.messages, request.assistant_prefix)
        except errors.InvalidArgumentError as exc:
            log.info("%s: the chat template refused a continuation (%s)", self.model, exc.value)
            return None

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        client, key = await self._ready_client(), self.api_key
        limit = self.token_limit(request)
        dialect = await self.continuation_dialect() if request.assistant_prefix else None
        prompt = self._raw_prompt(request, dialect)
        if dialect == "raw_completion" and prompt is None:
            dialect = "instruction"
        kwargs = self._fields(request, limit, dialect)
        seen = _Seen(CallAssembler(self.base_url or "the endpoint"))
        limited = self.limit.max_concurrency is not None
        if limited:
            yield Mark("queued", clock.now())
        await self.limit.acquire(request.priority)  # CloudQueueTimeoutError past the timeout
        held_from = clock.now()
        if limited:
            yield Mark("started", held_from)
        self._active += 1
        stream: openai.AsyncStream[Any] | None = None
        try:
            yield RequestSent(clock.now(), limit=limit, continuation=dialect)
            try:
                if prompt is None:
                    raw = await client.chat.completions.with_raw_response.create(
                        model=self.model,
                        messages=self._messages(request, dialect),  # type: ignore[arg-type]
                        stream=True,
                        **kwargs,
                    )
                else:
                    raw = await client.completions.with_raw_response.create(
                        model=self.model, prompt=prompt, stream=True, **_raw_fields(kwargs)
                    )
                yield Mark("first_byte", clock.now())
                stream = cast("openai.AsyncStream[Any]", raw.parse())
                events = stream.__aiter__()
                while (chunk := await _next_event(events, self._read_timeout_s)) is not _END:
                    if chunk is _QUIET:  # keep-alives at most: the read timeout did not fire
                        raise errors.CloudTimeoutError(
                            f"no event from the cloud endpoint for {self._read_timeout_s:g} s",
                            received_content=seen.received,
                        )
                    chunk = chunk if prompt is None else _chat_shaped(chunk)
                    for delta in _deltas(chunk, seen):
                        yield delta
            except errors.HybridError:
                raise
            except (openai.OpenAIError, httpx2.HTTPError) as exc:
                raise self._noted(exc, key, seen.received) from exc
            except (ValueError, TypeError, AttributeError) as exc:  # malformed SSE / JSON
                raise errors.CloudProtocolError(
                    f"malformed stream from {self.base_url or 'the endpoint'}: {exc}",
                    received_content=seen.received,
                ) from exc
            yield _finished(request, seen)
        finally:
            self._active -= 1
            self.limit.release(clock.now() - held_from)
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await _close(stream)

    async def _ready_client(self) -> openai.AsyncOpenAI:
        """The client, started on first use; nothing is sent with a missing or refused key."""
        if self._unavailable is not None:
            raise errors.CloudUnavailableError(
                self._unavailable.reason, status_code=self._unavailable.status_code
            )
        if self._client is None:
            await self.start()
        assert self._client is not None
        return self._client

    def _noted(self, exc: BaseException, key: str | None, received: bool) -> errors.CloudError:
        """`exc` in hybridllm's tree, noticed: a 429's Retry-After holds the queue, a refused
        key (`key`, the one sent, still in use) stops the engine."""
        error = map_error(exc, received_content=received, url=self.base_url)
        if isinstance(error, errors.RateLimitError) and error.retry_after is not None:
            self.limit.note_retry_after(error.retry_after)  # routing sees the wait
        if isinstance(error, errors.AuthenticationError) and key == self.api_key:
            # the key in use was refused (not one replaced while this request ran)
            code = error.status_code
            self._stop(
                errors.CloudUnavailableError(
                    f"authentication failed ({code}): check OPENAI_API_KEY or api_key=",
                    status_code=code,
                )
            )
        return error

    # ---- the check (`engines.capabilities.Checks`) -----------------------------------------

    async def check(self, timeout_s: float = 3.0) -> EngineCheck:
        """Whether the endpoint serves this engine: it answers `GET /models` within `timeout_s`
        with this key, and lists the model (None where it lists none). A refused key stops
        the engine as a refused request would (`unavailable`, `CloudUnavailable`); nothing is
        generated and nothing is billed."""
        where = self.base_url or "the OpenAI API"
        if self.api_key is None:
            return EngineCheck(
                None, False, None, f"{where}: {NO_KEY}", errors.CloudUnavailableError
            )
        await self.start()
        assert self._client is not None
        try:
            with anyio.fail_after(timeout_s):
                page = await self._client.with_options(timeout=timeout_s).models.list()
        except TimeoutError:
            why = f"{where}: no answer within {timeout_s:g} s"
            return EngineCheck(False, None, None, why, errors.CloudTimeoutError)
        except Exception as exc:  # the finding, in hybridllm's tree (a refused key stops it)
            return _check_failed(where, self._noted(exc, self.api_key, False))
        ids = [m.id for m in page.data]
        found = (self.model in ids) if ids else None
        listed = {True: "listed", False: f"NOT listed ({', '.join(ids[:5])})", None: "unlisted"}
        entry = next((m for m in page.data if m.id == self.model), None)
        self.reported_context = _listed_context(entry) or self.reported_context
        said = f"{where}: key accepted; {self.model} {listed[found]}"
        if self.context is not None:
            said += f", context {self.context} tokens"
        if found is not False and self._dialect is None:  # probed here, not at the first seam
            with anyio.move_on_after(timeout_s):
                self._dialect = await self.probe_continuation()
        if self._dialect is not None:
            said += f"; continues in the {self._dialect} dialect"
        return EngineCheck(True, True, found, said)

    # ---- verifying drafts (`engines.capabilities.VerifiesAtEndpoint`) -------------------------

    def verification_endpoint(self) -> Endpoint:
        """The endpoint drafts are verified at: this engine's base URL and model."""
        return Endpoint(str(self.base_url or OPENAI_BASE_URL), self.model)

    async def verification_post(
        self, path: str, body: Mapping[str, Any], outgoing: Outgoing | None = None
    ) -> dict[str, Any]:
        """POST a verifier's request (the dialects of `runtime.plans.speculative`:
        `completions`, `chat/completions`) through this engine's own client: its key (a new
        one from `set_api_key()` included), its timeouts, a refused key noticed as in
        `stream()`. `outgoing` is for a guard around
        the engine; the body goes as it is, with the engine's model."""
        if self._unavailable is not None:  # nothing is sent with a missing or refused key
            raise errors.CloudUnavailableError(
                self._unavailable.reason, status_code=self._unavailable.status_code
            )
        if self._client is None:
            await self.start()
        assert self._client is not None
        client, key = self._client, self.api_key
        try:
            data = await client.post(
                "/" + path.lstrip("/"), cast_to=object, body={"model": self.model, **body}
            )
        except (openai.OpenAIError, httpx2.HTTPError) as exc:
            raise self._noted(exc, key, False) from exc
        except ValueError as exc:  # the body is not JSON
            raise errors.CloudProtocolError(f"verification: not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise errors.CloudProtocolError("verification: the answer is not a JSON object")
        return data


def shared_tls() -> ssl.SSLContext:
    """The TLS context every cloud engine's connections share: httpx's default (the trust
    store `SSL_CERT_FILE` / `SSL_CERT_DIR` name, else the system's), made once per trust store.
    Each client made its own before, reading the whole CA bundle again (about 30 ms an engine
    start on a 2-core machine)."""
    return _tls(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    return httpx2.create_ssl_context()  # reads the same variables


def _check_args(
    base_url: object,
    api_key: object,
    model: object,
    timeout: object,
    include_usage: object,
    headers: object,
    name: object,
) -> None:
    if base_url is not None:
        url = validate.text("base_url", base_url)
        if not url.startswith(("http://", "https://")):
            raise errors.InvalidArgumentError("base_url", url, "an http:// or https:// URL")
    if api_key is not None:  # a blank key is the same as none (see the module)
        validate.text("api_key", api_key, blank_ok=True)
    if model is not None:
        validate.text("model", model)
    if not isinstance(timeout, httpx2.Timeout):
        validate.number("timeout", timeout, above=0.0)
    validate.flag("include_usage", include_usage)
    if headers is not None and not (
        isinstance(headers, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise errors.InvalidArgumentError("default_headers", headers, "a mapping of str to str")
    validate.one_of("name", name, ("local", "cloud"))


def conversation_key(messages: Sequence[Mapping[str, Any]], given: str | None = None) -> str:
    """A stable key for a conversation, sent as OpenAI's `prompt_cache_key` so that its turns
    reach the same prefix cache: a hash of the app's own key (`conversation=`) where it gave
    one, else of its system messages and first user message (the part every later turn
    repeats); never the text itself."""
    if given is not None:
        return "hl-" + hashlib.sha256(b"app\x00" + given.encode()).hexdigest()[:32]
    opening: list[str] = []
    for m in messages:
        opening.append(f"{m.get('role')}\x00{m.get('content')}")
        if m.get("role") == "user":
            break
    return "hl-" + hashlib.sha256("\x01".join(opening).encode()).hexdigest()[:32]


def _count(value: object) -> int | None:
    """A token count from a server's usage, or None if it is not one."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@dataclass
class _Seen:
    """What a cloud stream has told so far: text received, deltas, the tool calls being
    assembled, its finish and its usage."""

    calls: CallAssembler
    received: bool = False
    n_deltas: int = 0
    finish: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # the prompt tokens the endpoint served from its prefix cache, where its usage says so
    # (OpenAI's `usage.prompt_tokens_details.cached_tokens`; vLLM sends it when asked)
    cached_tokens: int | None = None
    call_tokens: int = 0  # the assembled calls' tokens, estimated (for usage not reported)

    def called(self, calls: list[Called]) -> list[Called]:
        """`calls`, noted: content received, and their tokens."""
        for call in calls:
            self.received = True
            self.call_tokens += estimate_text_tokens(call.name + call.arguments)
        return calls


def _deltas(chunk: Any, seen: _Seen) -> Iterator[Delta | Called | CallOpened]:
    """One streamed chunk's text, as deltas, and the tool calls it opens (a `CallOpened` as a
    call's first piece names it) and completes (assembled from `delta.tool_calls`:
    `engines.call_deltas`); its usage and finish reason noted in `seen`."""
    usage = getattr(chunk, "usage", None)
    if usage is not None:  # (counts that are not counts: estimated instead)
        seen.prompt_tokens = _count(getattr(usage, "prompt_tokens", None))
        seen.completion_tokens = _count(getattr(usage, "completion_tokens", None))
        details = getattr(usage, "prompt_tokens_details", None)
        seen.cached_tokens = _count(getattr(details, "cached_tokens", None))
    for choice in chunk.choices or ():
        text = choice.delta.content if choice.delta else None
        if text:
            if not isinstance(text, str):  # the SDK does not validate chunks
                raise TypeError(f"delta content is {type(text).__name__}")
            seen.received = seen.calls.received = True
            seen.n_deltas += 1
            yield Delta(text, clock.now())
        pieces = (getattr(choice.delta, "tool_calls", None) if choice.delta else None) or ()
        if not isinstance(pieces, list | tuple):
            raise TypeError(f"delta tool_calls is {type(pieces).__name__}")
        for piece in pieces:
            named = len(seen.calls.opened)
            whole = seen.calls.add(piece)
            for name in seen.calls.opened[named:]:
                yield CallOpened(clock.now(), call_name=name)
            yield from seen.called(whole)
        if choice.finish_reason:
            if not isinstance(choice.finish_reason, str):
                raise TypeError(f"finish_reason is {type(choice.finish_reason).__name__}")
            seen.finish = choice.finish_reason
            yield from seen.called(seen.calls.finish(seen.finish))


def _raw_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The chat request's fields as `/v1/completions` takes them: the token bound as
    `max_tokens`, no chat-only fields (Predicted Outputs, the prompt cache key)."""
    kept = {k: v for k, v in fields.items() if k not in ("prediction", "prompt_cache_key")}
    if "max_completion_tokens" in kept:
        kept["max_tokens"] = kept.pop("max_completion_tokens")
    return kept


def _chat_shaped(chunk: Any) -> Any:
    """A `/v1/completions` stream chunk in the chat chunk's shape (`choices[].delta.content`),
    its usage kept, so one reader (`_deltas`) checks both."""
    choices = [
        SimpleNamespace(
            delta=SimpleNamespace(content=getattr(c, "text", None), tool_calls=None),
            finish_reason=getattr(c, "finish_reason", None),
        )
        for c in (chunk.choices or ())
    ]
    return SimpleNamespace(choices=choices, usage=getattr(chunk, "usage", None))


def _template(given: ChatTemplate | str | None, continuation: Continuation) -> ChatTemplate | None:
    """The engine's chat template (a str is its Jinja text); "raw_completion" needs one."""
    template = ChatTemplate(given) if isinstance(given, str) else given
    if template is not None and not isinstance(template, ChatTemplate):
        raise errors.InvalidArgumentError(
            "chat_template", given, "a ChatTemplate, a chat template's Jinja text, or None"
        )
    if continuation == "raw_completion" and template is None:
        raise errors.InvalidArgumentError(
            "chat_template", None, 'the model\'s chat template where continuation="raw_completion"'
        )
    return template


def _finished(request: GenerationRequest, seen: _Seen) -> Finish:
    """The stream's end: its finish reason and usage (estimated where the server sent none)."""
    if seen.finish is None:
        raise errors.CloudProtocolError(
            "the stream ended without a finish reason (the server dropped the request; "
            "llama_cpp.server does this for a prompt longer than its context, and, with "
            "its interrupt_requests on, to an answer while another request waits)",
            received_content=seen.received,
        )
    if seen.calls.pending:
        raise errors.CloudProtocolError(
            f"tool call pieces came after the finish reason ({seen.calls.pending} call(s) "
            "never finished)",
            received_content=True,
        )
    estimated = seen.prompt_tokens is None or seen.completion_tokens is None
    prompt_tokens = seen.prompt_tokens
    if prompt_tokens is None:
        prompt_tokens = estimate_prompt_tokens(chat_messages(request), request.tools)
    completion_tokens = seen.completion_tokens
    if completion_tokens is None:  # servers send about one delta per token
        completion_tokens = seen.n_deltas + seen.call_tokens
    # an answer that called (OpenAI says "stop" when tool_choice names the tool)
    called = seen.calls.handed > 0 and seen.finish == "stop"
    return Finish(
        "tool_calls" if called else seen.finish,
        prompt_tokens,
        completion_tokens,
        clock.now(),
        usage_estimated=estimated,
        cached_prompt_tokens=seen.cached_tokens,
    )


_END = object()  # the stream ended
_QUIET = object()  # no event within the read timeout


async def _next_event(events: AsyncIterator[Any], read_s: float | None) -> Any:
    """The stream's next event, `_END`, or `_QUIET` if none came within `read_s`. The HTTP read
    timeout counts bytes, and SSE keep-alives (comments, which the SDK drops) are bytes: a
    server sending only keep-alives would otherwise hold a request for ever."""
    with anyio.move_on_after(math.inf if read_s is None else read_s):
        try:
            return await events.__anext__()
        except StopAsyncIteration:
            return _END
    return _QUIET


# where OpenAI-compatible model lists give a model's context: vLLM (`max_model_len`), LM Studio
# (`max_context_length`), OpenRouter and others (`context_length`)
CONTEXT_FIELDS = ("max_model_len", "max_context_length", "context_length")


def _listed_context(entry: object) -> int | None:
    """A model list entry's context in tokens (None: it gives none)."""
    extra = getattr(entry, "model_extra", None) or {}
    for name in CONTEXT_FIELDS:
        value = extra.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _check_failed(where: str, error: errors.CloudError) -> EngineCheck:
    """What a failed `GET /models` says of the endpoint."""
    kind = type(error)
    if isinstance(error, errors.AuthenticationError):
        return EngineCheck(True, False, None, f"{where}: the key was refused ({error})", kind)
    if isinstance(error, errors.CloudConnectionError | errors.CloudTimeoutError):
        return EngineCheck(False, None, None, f"{where}: unreachable ({error})", kind)
    if isinstance(error, errors.CloudStatusError) and error.status_code == 404:
        # no /models here: the endpoint answers, and cannot list its models
        return EngineCheck(True, None, None, f"{where}: answers; it lists no models", kind)
    return EngineCheck(True, None, None, f"{where}: answered with an error ({error})", kind)


def map_error(
    exc: BaseException, *, received_content: bool, url: str | None = None
) -> errors.CloudError:
    """Translate an openai / httpx2 exception into hybridllm's tree (the boundary)."""
    rc = received_content
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retry_after = _retry_after(exc.response.headers)
        msg = _status_message(exc)
        if status in (401, 403):
            return errors.AuthenticationError(msg, status_code=status, received_content=rc)
        if status == 429:
            return errors.RateLimitError(
                msg, status_code=status, retry_after=retry_after, received_content=rc
            )
        if status >= 500:
            return errors.ServerError(
                msg, status_code=status, retry_after=retry_after, received_content=rc
            )
        return errors.CloudStatusError(
            msg, status_code=status, retry_after=retry_after, received_content=rc
        )
    if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
        return errors.CloudTimeoutError(f"cloud endpoint timed out: {exc}", received_content=rc)
    if isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
        cause = exc.__cause__ or exc
        return errors.CloudConnectionError(
            f"cannot reach the cloud endpoint {url or ''}: {type(cause).__name__}: {cause}",
            received_content=rc,
        )
    return errors.CloudProtocolError(f"{type(exc).__name__}: {exc}", received_content=rc)


def _status_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and "message" in inner:
            return str(inner["message"])
        if "detail" in body:
            return str(body["detail"])
    return exc.message


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, parsed.timestamp() - time.time())
