"""The gateway's ASGI app: the hybrid client over OpenAI's HTTP API (Starlette).

`create_app(client, limits, api_key=..., keys=...)` gives an ASGI app whose lifespan opens and
closes the client (uvicorn runs it: `gateway.command`). Its door (`Door`, outermost but for
CORS) checks every HTTP request before a route sees it: the caller (``Authorization: Bearer
KEY``: the admin key or one of the ledger's virtual keys, `gateway.tenants`; all but ``GET /``,
the playground page, which holds no secret and asks for the key itself), the body's declared
size (413), and for chat completions the concurrency limit and the key's requests per minute
(429 with Retry-After). A virtual key's request is billed as its tenant (its caps hold it) and
may use only its policies (403). It writes one access-log line per request (method, path, status,
milliseconds, policy, engine: never prompt or answer text) to the ``hybridllm.gateway.access``
logger.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hybridllm import errors
from hybridllm.client import HybridClient
from hybridllm.events import EngineName
from hybridllm.gateway import playground, relay, tenants, wire
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.gateway.tenants import Caller, Keyring
from hybridllm.guard.keys import KeyStore
from hybridllm.guard.rates import RateCounter
from hybridllm.policy import known_policies
from hybridllm.runtime.health import UNCHECKED, EngineState
from hybridllm.server.app import until_disconnect
from hybridllm.server.schema import ApiError

__all__ = ["CHAT_PATH", "Door", "create_app"]

access_log = logging.getLogger("hybridllm.gateway.access")
CHAT_PATH = "/v1/chat/completions"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Door:
    """Auth, the body's declared size and the concurrency limit, before any route; the access
    log after (see the module). `active`: chat requests being served now."""

    def __init__(self, app: ASGIApp, limits: GatewayLimits, keyring: Keyring) -> None:
        self.app, self.limits, self.keyring = app, limits, keyring
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), [0]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._enter(scope, receive, sending)
        finally:
            state = scope.get("state") or {}
            trace = state.get("trace")  # the request's, read at the end: its final engine
            access_log.info(
                "%s %s %d %.1f ms policy=%s engine=%s",
                scope["method"],
                scope["path"],
                status[0],
                (time.perf_counter() - t0) * 1e3,
                state.get("policy", "-"),
                "-" if trace is None or trace.engine is None else trace.engine,
            )

    async def _enter(self, scope: Scope, receive: Receive, send: Send) -> None:
        page = scope["path"] == playground.PAGE_PATH and scope["method"] in ("GET", "HEAD")
        headers = Headers(scope=scope)
        caller = (
            tenants.OPEN if page else await self.keyring.caller(headers.get("authorization", ""))
        )
        refusal = caller if isinstance(caller, ApiError) else self._refusal(headers)
        if refusal is not None:
            await _answer(refusal, scope, receive, send)
            return
        assert isinstance(caller, Caller)
        scope.setdefault("state", {})["caller"] = caller
        if scope["path"] != CHAT_PATH:
            await self.app(scope, receive, send)
            return
        limited = await self.keyring.admit(caller)
        if limited is not None:
            await _answer(limited, scope, receive, send)
            return
        if self.active >= self.limits.max_concurrency:
            busy = ApiError(
                429,
                f"the gateway serves {self.limits.max_concurrency} requests at once and all are "
                f"taken; retry after {self.limits.retry_after_s} s",
                code="concurrency_limit",
                type="rate_limit_error",
                headers={"retry-after": str(self.limits.retry_after_s)},
            )
            await _answer(busy, scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1

    def _refusal(self, headers: Headers) -> ApiError | None:
        """A request refused at the door once its caller is known: a body declared larger than
        the limit (413)."""
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body_bytes:
            return _too_large(self.limits)
        return None


def _too_large(limits: GatewayLimits) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than this gateway's {limits.max_body_bytes} bytes",
        code="request_too_large",
    )


def _caller(request: Request) -> Caller:
    caller = request.scope.get("state", {}).get("caller")
    return caller if isinstance(caller, Caller) else tenants.OPEN


async def _answer(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(error.body(), status_code=error.status, headers=error.headers)
    await response(scope, receive, send)


async def _json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read up to `limit` bytes (a chunked body larger: 413)."""
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"the request body is larger than {limit} bytes")
        parts.append(part)
    try:
        data = json.loads(b"".join(parts))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not JSON ({exc})", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return data


class _Routes:
    """The endpoints over one client."""

    def __init__(
        self,
        client: HybridClient,
        limits: GatewayLimits,
        page: playground.Page,
        keys: KeyStore | None = None,
    ) -> None:
        self.client, self.limits, self.page, self.keys = client, limits, page, keys

    async def home(self, request: Request) -> Response:
        """The playground page (`gateway.playground`), with its security headers."""
        return Response(self.page.body, media_type="text/html", headers=self.page.headers)

    async def chat(self, request: Request) -> Response:
        data = await _json(request, self.limits.max_body_bytes)
        call = wire.chat_call(
            data,
            header_policy=request.headers.get("x-hybridllm-policy"),
            policies=known_policies(dirs=self.client.policies.dirs),
            limits=self.limits,
        )
        request.state.policy = call.policy
        key = _caller(request).key
        if key is not None:
            if not key.allows(call.policy):
                raise tenants.refused_policy(key, call.policy)
            call.args["tenant"] = key.tenant
        try:
            stream = self.client.stream(call.messages, **call.args)
        except errors.HybridError as exc:
            raise relay.api_error(exc) from exc
        try:  # admission (and a queue before the first event) ends if the client leaves
            events, first = await until_disconnect(request, relay.first_event(stream))
        except BaseException:
            await stream.aclose()
            raise
        request.state.trace = stream.trace
        if call.stream:
            body = relay.sse(stream, events, first, call)
            return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)
        done = await until_disconnect(request, relay.whole(stream, events, first, call))
        return JSONResponse(done.body, headers=done.headers)

    async def usage(self, request: Request) -> Response:
        """Spend and room this UTC day and month: the caller's key's, or every key's for the
        admin (`gateway.tenants.usage`)."""
        caller, ledgers = _caller(request), self.client.ledgers()
        try:
            body = await anyio.to_thread.run_sync(tenants.usage, caller, ledgers, self.keys)
        except errors.LedgerUnavailableError as exc:
            raise ApiError(503, str(exc), code="ledger_unavailable", type="server_error") from exc
        return JSONResponse(body)

    async def models(self, request: Request) -> Response:
        key = _caller(request).key
        names = known_policies(dirs=self.client.policies.dirs)
        names = names if key is None else [n for n in names if key.allows(n)]
        data = [
            {
                "id": f"{wire.MODEL_PREFIX}{n}",
                "object": "model",
                "created": 0,
                "owned_by": "hybridllm",
            }
            for n in names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        """Each engine: configured or not, its model, its circuit, what its check at start
        found, and why it cannot serve now (`cause`). "ok" while every configured engine
        serves, "degraded" while one does not (503 when none does)."""
        engines: dict[str, Any] = {}
        serves: list[bool] = []
        client = self.client
        for side, held in (("local", client.local), ("cloud", client.cloud)):
            if held is None:  # a side the client lacks
                engines[side] = {"configured": False}
        for name, engine in client.engines.items():
            breaker = client.breakers[name]
            info = engine.info()
            checked = self.client.last_check.get(name)
            found = UNCHECKED if checked is None else checked.check
            state = EngineState(name, found, breaker.state, info.unavailable)
            serves.append(state.serves)
            engines[name] = {
                "configured": True,
                "on_device": info.on_device,
                "model": info.model,
                "circuit": breaker.state,
                "unavailable": info.unavailable,
                "queue_depth": info.queue_depth,
                "reachable": found.reachable,
                "key_accepted": found.key_accepted,
                "model_found": found.model_found,
                "cause": state.cause,
            }
        status = "ok" if all(serves) else "degraded"
        body = {"status": status if any(serves) else "unavailable", "engines": engines}
        return JSONResponse(body, status_code=200 if any(serves) else 503)


def create_app(
    client: HybridClient,
    limits: GatewayLimits | None = None,
    *,
    api_key: str | None = None,
    on_check: Callable[[Mapping[EngineName, EngineState]], None] | None = None,
    keys: KeyStore | None = None,
    rates: RateCounter | None = None,
) -> ASGIApp:
    """The gateway over `client`, which its lifespan opens and checks (`HybridClient.check()`:
    each engine's state, told to `on_check`, logged, and read by /healthz) and closes (see the
    module). `keys`: the virtual keys (kept in the ledger), `rates`: where their requests per
    minute are counted."""
    limits = limits or GatewayLimits()
    keyring = Keyring(api_key, keys, rates)
    routes = _Routes(client, limits, playground.page(key_required=keyring.keyed), keys)

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with client:
            states = await client.check()  # each engine, found at start (a bounded probe)
            if on_check is not None:
                on_check(states)
            yield

    app: ASGIApp = Door(
        Starlette(
            routes=[
                Route(playground.PAGE_PATH, routes.home, methods=["GET"]),
                Route(CHAT_PATH, routes.chat, methods=["POST"]),
                Route("/v1/models", routes.models, methods=["GET"]),
                Route("/v1/usage", routes.usage, methods=["GET"]),
                Route("/healthz", routes.health, methods=["GET"]),
            ],
            exception_handlers={ApiError: on_error},
            lifespan=lifespan,
        ),
        limits,
        keyring,
    )
    if limits.cors_origins:
        app = CORSMiddleware(
            app,
            allow_origins=list(limits.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-hybridllm-policy"],
            expose_headers=[
                f"x-hybridllm-{h}"
                for h in ("engine", "plan", "policy", "ttft-ms", "cost-usd", "reason")
            ],
        )
    return app
