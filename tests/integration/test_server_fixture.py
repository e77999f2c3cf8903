"""LlamaServer (a real llama_cpp.server on loopback) and FaultProxy in front of it.

The model: conftest's ``model_path`` (``$HYBRIDLLM_TEST_MODEL``, else SmolLM2-135M-Instruct
pulled from its PyPI package into the model cache).

Some tests pin down llama_cpp.server 0.3.36 behaviour the engines rely on (role-only first chunk,
no usage chunk, the two faces of a context overflow); if an upgrade changes it, they say so.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionUserMessageParam

from hybridllm.testing import FaultProxy, Faults, LlamaServer, ServerStartError

API_KEY = "sk-test-key"
ALIAS = "smol"
N_CTX = 1024
EOS_BAN = {"2": -100}  # SmolLM2's <|im_end|>: forces generation to run to max_tokens


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[LlamaServer]:
    threads = min(4, os.cpu_count() or 1)
    with LlamaServer(
        model_path, alias=ALIAS, api_key=API_KEY, n_ctx=N_CTX, n_threads=threads
    ) as srv:
        yield srv


@pytest.fixture
def proxy(server: LlamaServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", server.port)) as p:
        yield p


def _client(base_url: str, api_key: str = API_KEY) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60.0)


def _chat(text: str) -> list[ChatCompletionUserMessageParam]:
    return [{"role": "user", "content": text}]


# -- LlamaServer itself -----------------------------------------------------------------------


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LlamaServer(tmp_path / "nope.gguf").start()


@pytest.mark.integration
def test_bad_model_file_fails_fast_with_log(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file" * 100)
    srv = LlamaServer(bad, startup_timeout=60.0)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="exited with code") as info:
        srv.start()
    assert time.monotonic() - t0 < 60.0
    assert "last lines" in str(info.value)
    assert srv.pid is None and srv.log_path is not None  # the log is kept after a failure
    srv.log_path.unlink()


@pytest.mark.integration
def test_models_endpoint(server: LlamaServer) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    req = urllib.request.Request(
        server.base_url + "/models", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    with urllib.request.urlopen(req, timeout=10.0) as resp:
        body = json.load(resp)
    assert [m["id"] for m in body["data"]] == [ALIAS]
    # with --api_key set, even /v1/models needs the key
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.base_url + "/models", timeout=10.0)
    assert info.value.code == 401


@pytest.mark.integration
def test_chat_completion(server: LlamaServer) -> None:
    with _client(server.base_url) as client:
        resp = client.chat.completions.create(
            model=server.model, messages=_chat("Say hi"), max_tokens=8, temperature=0, seed=1
        )
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content
    assert resp.usage is not None and 0 < resp.usage.completion_tokens <= 8


# -- through the FaultProxy ---------------------------------------------------------------------


@pytest.mark.integration
def test_streaming_through_proxy(server: LlamaServer, proxy: FaultProxy) -> None:
    with _client(proxy.url + "/v1") as client:
        stream = client.chat.completions.create(
            model=server.model,
            messages=_chat("Say hi"),
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    # llama_cpp.server: a role-only first chunk, content chunks, an empty-delta finish chunk,
    # and no usage chunk even though include_usage was asked for (it ignores stream_options).
    first, *middle, last = chunks
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    assert all(c.choices[0].delta.content for c in middle) and len(middle) == 6
    assert last.choices[0].finish_reason == "length" and not last.choices[0].delta.content
    assert all(c.usage is None and c.choices for c in chunks)
    rec = proxy.connections[0]
    assert rec.bytes_down > 0 and rec.first_byte_down_at is not None


@pytest.mark.integration
def test_first_byte_stall_delays_ttft(server: LlamaServer, proxy: FaultProxy) -> None:
    proxy.faults = Faults(first_byte_stall_ms=400)
    with _client(proxy.url + "/v1") as client:
        t0 = time.monotonic()
        stream = client.chat.completions.create(
            model=server.model, messages=_chat("Say hi"), max_tokens=2, stream=True
        )
        next(iter(stream))
        assert time.monotonic() - t0 >= 0.4
        stream.close()


@pytest.mark.integration
def test_wrong_key_gets_401(server: LlamaServer, proxy: FaultProxy) -> None:
    with _client(proxy.url + "/v1", api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError) as info:
            client.chat.completions.create(model=server.model, messages=_chat("hi"), max_tokens=2)
    assert info.value.status_code == 401


@pytest.mark.integration
def test_client_disconnect_stops_generation(server: LlamaServer, proxy: FaultProxy) -> None:
    max_tokens = N_CTX - 100  # would take many seconds if the server kept generating
    with _client(proxy.url + "/v1") as client:
        stream = client.chat.completions.create(
            model=server.model,
            messages=_chat("Write a long story."),
            max_tokens=max_tokens,
            temperature=0,
            logit_bias=EOS_BAN,
            stream=True,
        )
        times = []
        for chunk in stream:
            if chunk.choices[0].delta.content:
                times.append(time.monotonic())
            if len(times) == 6:
                break
        t_close = time.monotonic()
        stream.close()
    closed_at = proxy.wait_client_closed(proxy.connections[0].id, timeout=5.0)
    assert closed_at is not None and closed_at - t_close < 1.0
    # llama_cpp.server serves one request at a time: had it kept generating the remaining
    # tokens, the next request would wait for them. A quick answer means it stopped.
    time_left_if_running = (times[-1] - times[0]) / 5 * (max_tokens - 6)
    with _client(server.base_url) as direct:
        t0 = time.monotonic()
        direct.chat.completions.create(model=server.model, messages=_chat("hi"), max_tokens=2)
        elapsed = time.monotonic() - t0
    assert elapsed < max(1.5, time_left_if_running / 2), (elapsed, time_left_if_running)


@pytest.mark.integration
def test_reset_mid_stream(server: LlamaServer, proxy: FaultProxy) -> None:
    proxy.faults = Faults(reset_after_bytes=1500)  # headers plus a few SSE events
    with _client(proxy.url + "/v1") as client:
        stream = client.chat.completions.create(
            model=server.model,
            messages=_chat("Write a long story."),
            max_tokens=200,
            logit_bias=EOS_BAN,
            stream=True,
        )
        with pytest.raises(openai.APIConnectionError):
            for _ in stream:
                pass
    assert proxy.connections[0].closed_by == "proxy-reset"


@pytest.mark.integration
def test_context_overflow(server: LlamaServer) -> None:
    long = _chat("hello " * (N_CTX + 100))
    with _client(server.base_url) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=server.model, messages=long, max_tokens=4)
    assert info.value.status_code == 400 and info.value.code == "context_length_exceeded"
    # Streaming: the server has already sent 200 and its headers when it finds out, so it
    # drops the connection mid-body. The openai SDK ends the stream quietly with no chunk, no
    # finish_reason and no error: a stream without finish_reason must be treated as failed.
    with _client(server.base_url) as client:
        stream = client.chat.completions.create(
            model=server.model, messages=long, max_tokens=4, stream=True
        )
        assert list(stream) == []
