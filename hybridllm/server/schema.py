"""Request bodies (checked with pydantic) and OpenAI-style error bodies.

Unknown fields are ignored, as OpenAI-compatible servers do; a field of the wrong type or out of
range is a 400 with ``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

B = TypeVar("B", bound=BaseModel)
MAX_TOP = 1024  # prompt_logprobs / logprobs: never more (the server's --max-logprobs caps lower)


class ApiError(Exception):
    """An error answered as an OpenAI-style JSON body with `status` (and `headers`, such as a
    429's Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=False)

    model: str = Field(min_length=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**32)
    stream: bool = False

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise ApiError(400, "stop strings must not be empty", param="stop")
        return tuple(stops)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (OpenAI's shape)
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # the author's name (OpenAI's), as the SDK takes it

    def message(self) -> dict[str, Any]:
        """The message as the engines take it (`engines.base.Message`)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: only text ones are understood
            if any(
                p.get("type") != "text" or not isinstance(p.get("text"), str) for p in self.content
            ):
                raise ApiError(400, "only text content parts are supported", param="messages")
            return "".join(str(p["text"]) for p in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream_options: StreamOptions | None = None
    # vLLM's extra chat parameters: the final (assistant) message left open and continued
    # ("prefill" the answer), which needs add_generation_prompt false
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # OpenAI's logit_bias: token id (a string) -> a bias from -100 (banned) to 100
    logit_bias: dict[str, float] | None = None
    # OpenAI's tools, tool_choice and response_format, checked by `hybridllm.tools.tool_spec`
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    def bias(self) -> dict[int, float]:
        """`logit_bias` as token ids; a key that is not a token id or a bias out of range is a
        400."""
        out: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.isdigit() or not -100.0 <= value <= 100.0:
                raise ApiError(
                    400,
                    f"logit_bias: {key!r}: {value!r} must be a token id and a bias in [-100, 100]",
                    param="logit_bias",
                )
            out[int(key)] = value
        return out


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    n: int = Field(1, ge=1, le=1)


def parse(cls: type[B], data: object) -> B:
    """`data` as `cls`, or a 400 naming the first bad field."""
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise ApiError(400, f"{param}: {err['msg']}", param=param) from exc
