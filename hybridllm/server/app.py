"""The ASGI app (Starlette) over one `ServedModel`, and `serve()` to run it with uvicorn."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hybridllm import errors
from hybridllm.engines.llama.served import ServedModel
from hybridllm.server import chat, completions
from hybridllm.server.schema import ApiError, ChatBody, CompletionBody, parse

T = TypeVar("T")


def create_app(model: ServedModel, *, api_key: str | None = None) -> Starlette:
    """The app; the model is started when the app starts (uvicorn's lifespan)."""

    def check(request: Request) -> None:
        if api_key is not None:
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                raise ApiError(401, "invalid API key", code="invalid_api_key", type="auth_error")

    async def body_of(request: Request) -> dict[str, Any]:
        check(request)
        body = await _json(request)
        if body.get("model") not in (model.alias, model.model):
            raise ApiError(
                404,
                f"the model {body.get('model')!r} does not exist (this server has {model.alias!r})",
                param="model",
                code="model_not_found",
            )
        return body

    async def models(request: Request) -> Response:
        check(request)
        entry = {"id": model.alias, "object": "model", "created": 0, "owned_by": "hybridllm"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def chat_completions(request: Request) -> Response:
        data = await body_of(request)
        body = parse(ChatBody, data)
        request_ = chat.request_for(body, model.n_ctx)
        prepared = await _mapped(model.prepare(request_, body.bias()))
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(
                chat.stream(model, prepared, usage), media_type="text/event-stream"
            )
        return JSONResponse(
            await until_disconnect(request, _mapped(chat.complete(model, prepared)))
        )

    async def text_completions(request: Request) -> Response:
        data = await body_of(request)
        body = parse(CompletionBody, data)
        tokens = completions.prompt_tokens(model, body)
        job = completions.job_for(body, tokens, model.max_logprobs)
        out = await until_disconnect(request, _mapped(model.complete(job)))
        headers = {f"x-hybridllm-{k.replace('_', '-')}": str(v) for k, v in model.last.items()}
        return JSONResponse(completions.response(model, body, tokens, out), headers=headers)

    async def debug_stats(request: Request) -> Response:
        check(request)
        return JSONResponse({**model.stats, "last": model.last})

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse(exc.body(), status_code=exc.status)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await model.start()
        try:
            yield
        finally:
            await model.aclose()

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", text_completions, methods=["POST"]),
            Route("/debug/stats", debug_stats, methods=["GET"]),
        ],
        exception_handlers={ApiError: on_error},
        lifespan=lifespan,
    )


async def _json(request: Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


async def _mapped(work: Awaitable[T]) -> T:
    """Errors of the model as HTTP errors: bad input 400, anything else 500."""
    try:
        return await work
    except errors.ContextOverflowError as exc:
        raise ApiError(400, str(exc), param="messages", code="context_length_exceeded") from exc
    except errors.InvalidArgumentError as exc:  # e.g. a schema no grammar can constrain
        raise ApiError(400, str(exc), param=exc.argument) from exc
    except errors.ConfigError as exc:
        raise ApiError(400, str(exc)) from exc
    except errors.HybridError as exc:
        raise ApiError(500, str(exc), type="server_error") from exc


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so aborting llama.cpp) if the client goes away."""
    result: list[T] = []
    failed: list[Exception] = []

    async def run(scope: anyio.CancelScope) -> None:
        try:
            result.append(await work)
        except Exception as exc:  # re-raised below, outside the task group (no ExceptionGroup)
            failed.append(exc)
        scope.cancel()

    async def watch(scope: anyio.CancelScope) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, tg.cancel_scope)
        tg.start_soon(watch, tg.cancel_scope)
    if failed:
        raise failed[0]
    if not result:
        raise ApiError(499, "the client closed the connection")
    return result[0]


def serve(
    model: ServedModel,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    log_level: str = "warning",
) -> None:
    """Run the server until interrupted (blocking)."""
    import uvicorn

    uvicorn.run(
        create_app(model, api_key=api_key),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=2,
    )
