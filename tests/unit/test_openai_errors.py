"""The error boundary of OpenAIEngine: openai / httpx2 exceptions become hybridllm errors."""

from __future__ import annotations

import httpx2
import openai
import pytest

from hybridllm import errors
from hybridllm.engines.openai_engine import map_error

REQ = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")


def status_error(code: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(
        code, headers=headers or {}, request=REQ, json={"error": {"message": f"failure {code}"}}
    )
    cls = {
        401: openai.AuthenticationError,
        429: openai.RateLimitError,
        500: openai.InternalServerError,
        400: openai.BadRequestError,
    }.get(code, openai.APIStatusError)
    return cls(f"failure {code}", response=response, body={"error": {"message": f"failure {code}"}})


@pytest.mark.parametrize(
    ("code", "cls", "retryable"),
    [
        (401, errors.AuthenticationError, False),
        (403, errors.AuthenticationError, False),
        (429, errors.RateLimitError, True),
        (500, errors.ServerError, True),
        (503, errors.ServerError, True),
        (400, errors.CloudStatusError, False),
    ],
)
def test_status_codes(code: int, cls: type[errors.CloudStatusError], retryable: bool) -> None:
    err = map_error(status_error(code), received_content=False)
    assert type(err) is cls
    assert isinstance(err, errors.CloudStatusError) and err.status_code == code
    assert err.retryable is retryable and err.engine == "cloud"
    assert f"failure {code}" in str(err)


def test_retry_after_header_seconds_and_ms() -> None:
    err = map_error(status_error(429, {"retry-after": "2"}), received_content=False)
    assert isinstance(err, errors.RateLimitError) and err.retry_after == 2.0
    err = map_error(status_error(429, {"retry-after-ms": "1500"}), received_content=False)
    assert isinstance(err, errors.RateLimitError) and err.retry_after == 1.5
    err = map_error(status_error(429, {"retry-after": "soon"}), received_content=False)
    assert isinstance(err, errors.RateLimitError) and err.retry_after is None


def test_nothing_is_retryable_once_content_was_received() -> None:
    err = map_error(status_error(503), received_content=True)
    assert err.received_content and not err.retryable
    err = map_error(httpx2.ReadError("reset", request=REQ), received_content=True)
    assert isinstance(err, errors.CloudConnectionError) and not err.retryable


def test_transport_errors() -> None:
    err = map_error(openai.APIConnectionError(request=REQ), received_content=False)
    assert isinstance(err, errors.CloudConnectionError) and err.retryable
    err = map_error(openai.APITimeoutError(request=REQ), received_content=False)
    assert isinstance(err, errors.CloudTimeoutError) and err.retryable
    err = map_error(httpx2.ReadTimeout("slow", request=REQ), received_content=False)
    assert isinstance(err, errors.CloudTimeoutError)
    err = map_error(httpx2.RemoteProtocolError("bad", request=REQ), received_content=True)
    assert isinstance(err, errors.CloudConnectionError) and err.received_content


@pytest.mark.parametrize(
    ("exc", "cls", "retryable", "words"),
    [
        (status_error(401), errors.AuthenticationError, False, "failure 401"),
        (
            openai.APIConnectionError(request=REQ),
            errors.CloudConnectionError,
            True,
            "cannot reach the cloud endpoint http://127.0.0.1/v1: APIConnectionError",
        ),
        (ValueError("not json"), errors.CloudProtocolError, False, "ValueError: not json"),
    ],
)
def test_every_error_maps_to_its_own_type(
    exc: Exception, cls: type[errors.CloudError], retryable: bool, words: str
) -> None:
    """Anything else (a malformed stream) is a protocol error, never a retryable one."""
    err = map_error(exc, received_content=False, url="http://127.0.0.1/v1")
    assert type(err) is cls and isinstance(err, errors.HybridError)
    assert err.retryable is retryable and not err.received_content and err.engine == "cloud"
    assert words in str(err)
