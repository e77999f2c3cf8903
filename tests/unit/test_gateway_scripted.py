"""The gateway's app over `ScriptedEngine` doubles (orchestration and wire shapes only; the real
engines, the openai SDK and curl are in tests/integration/test_gateway*.py): the SSE chunks and
the decision under "hybridllm", the non-streamed body and headers, tool calls, the statuses of
refusals and bad input, the door (key, size, 429), CORS and the access log."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from hybridllm import HybridClient
from hybridllm.errors import CloudConnectionError
from hybridllm.gateway.app import Door, create_app
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.gateway.tenants import Keyring
from hybridllm.guard.budget import Cap, ModelPrice, Prices
from hybridllm.testing import ScriptedCall, ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py

POLICIES = {
    "gw-local": '[routing]\nprefer = "local"\nallow_cloud = false\nfallback_order = ["local"]\n',
    "gw-cloud": '[routing]\nprefer = "cloud"\nfallback_order = ["cloud"]\n',
    "gw-mixed": '[routing]\nprefer = "cloud"\n',
}
KEY = "sk-gw"
AUTH = {"authorization": f"Bearer {KEY}"}
SECRET = "my card is 4111 1111 1111 1111"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    for name, text in POLICIES.items():
        (tmp_path / f"{name}.toml").write_text(text)
    return tmp_path


def reset() -> CloudConnectionError:
    return CloudConnectionError("connection reset", received_content=True)


async def gateway(
    policy_dir: Path, local: ScriptedEngine, cloud: ScriptedEngine | None = None, **client: Any
) -> AsyncIterator[httpx.AsyncClient]:
    hybrid = HybridClient(local=local, cloud=cloud, router=None, policy_dirs=[policy_dir], **client)
    app = create_app(hybrid, GatewayLimits(max_body_bytes=4000), api_key=KEY)
    async with hybrid:  # httpx's transport runs no lifespan: the test opens the client
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gw", headers=AUTH
        ) as http:
            yield http


def body(model: str, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def events(response: httpx.Response) -> list[Any]:
    out: list[Any] = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_streamed_chunks_mark_each_engine_and_the_last_carries_the_decision(
    policy_dir: Path,
) -> None:
    local = ScriptedEngine("local", tokens=["!", " Bye"])
    cloud = ScriptedEngine("cloud", script=["Hel", 0.01, "lo", reset()])
    async for http in gateway(policy_dir, local, cloud):
        r = await http.post(
            "/v1/chat/completions",
            json=body("hybridllm/gw-mixed", stream=True, stream_options={"include_usage": True}),
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r)
    assert chunks[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c for c in chunks[1:-1] if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert [(c["choices"][0]["delta"]["content"], c["hybridllm"]) for c in content] == [
        ("Hel", {"engine": "cloud"}),
        ("lo", {"engine": "cloud"}),
        ("!", {"engine": "local"}),
        (" Bye", {"engine": "local"}),
    ]
    final, usage = chunks[-3], chunks[-2]
    assert final["choices"][0]["finish_reason"] == "stop"
    found = final["hybridllm"]
    assert found["spans"] == [
        {"engine": "cloud", "start": 0, "end": 5},
        {"engine": "local", "start": 5, "end": 10},
    ]
    assert (found["engine"], found["policy"]) == ("local", "gw-mixed")
    assert found["plan"] and found["reason"] and found["ttft_ms"] is not None
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-2])  # include_usage: null until the last


async def test_a_whole_answer_carries_the_decision_in_its_body_and_headers(
    policy_dir: Path,
) -> None:
    local = ScriptedEngine("local", tokens=["Hel", "lo"])
    async for http in gateway(policy_dir, local):
        r = await http.post("/v1/chat/completions", json=body("gw-local"))
    assert r.status_code == 200
    data = r.json()
    assert data["object"] == "chat.completion" and data["model"] == "gw-local"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert data["hybridllm"]["spans"] == [{"engine": "local", "start": 0, "end": 5}]
    assert r.headers["x-hybridllm-engine"] == "local"
    assert r.headers["x-hybridllm-policy"] == "gw-local"
    assert r.headers["x-hybridllm-plan"] == data["hybridllm"]["plan"]
    assert float(r.headers["x-hybridllm-ttft-ms"]) == data["hybridllm"]["ttft_ms"]
    assert r.headers["x-hybridllm-reason"].isascii()


async def test_tool_calls_stream_as_delta_tool_calls_and_whole_as_message_tool_calls(
    policy_dir: Path,
) -> None:
    def local() -> ScriptedEngine:
        return ScriptedEngine("local", script=[ScriptedCall("weather", '{"city": "Oslo"}')])

    async for http in gateway(policy_dir, local()):
        r = await http.post("/v1/chat/completions", json=body("gw-local", tools=TOOLS, stream=True))
    chunks = events(r)
    calls = [c for c in chunks[1:-1] if c["choices"][0]["delta"].get("tool_calls")]
    assert len(calls) == 1
    (shape,) = calls[0]["choices"][0]["delta"]["tool_calls"]
    assert shape["index"] == 0 and shape["type"] == "function"
    assert shape["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    async for http in gateway(policy_dir, local()):
        r = await http.post("/v1/chat/completions", json=body("gw-local", tools=TOOLS))
    message = r.json()["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "weather"
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"


async def test_privacy_and_budget_refusals_have_their_statuses_before_any_chunk(
    policy_dir: Path,
) -> None:
    local, cloud = ScriptedEngine("local", tokens=["x"]), ScriptedEngine("cloud", tokens=["y"])
    async for http in gateway(policy_dir, local, cloud):
        r = await http.post("/v1/chat/completions", json=body("gw-cloud", SECRET, stream=True))
    assert r.status_code == 403 and r.json()["error"]["code"] == "privacy_blocked"
    assert cloud.requests == []
    prices = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    caps = [Cap(None, "request", 1e-9)]
    async for http in gateway(policy_dir, local, cloud, prices=prices, budget_caps=caps):
        r = await http.post("/v1/chat/completions", json=body("gw-cloud", stream=True))
    assert r.status_code == 402
    assert (r.json()["error"]["type"], r.json()["error"]["code"]) == (
        "insufficient_quota",
        "budget_exceeded",
    )


@pytest.mark.parametrize(
    ("headers", "content", "status", "code"),
    [
        ({}, json.dumps(body("gw-local")), 401, "invalid_api_key"),
        (
            {"authorization": "Bearer sk-wrong"},
            json.dumps(body("gw-local")),
            401,
            "invalid_api_key",
        ),
        (AUTH, "{not json", 400, "invalid_json"),
        (AUTH, "[1, 2]", 400, "invalid_json"),
        (AUTH, json.dumps(body("gpt-4o")), 404, "model_not_found"),
        (AUTH, json.dumps(body("gw-local", "x" * 5000)), 413, "request_too_large"),
        (AUTH, json.dumps(body("gw-local", n=3)), 400, "unsupported_parameter"),
        (AUTH, json.dumps(body("gw-local", prompt_cache_key=" ")), 400, None),
    ],
)
async def test_bad_requests_get_openai_error_bodies(
    policy_dir: Path, headers: dict[str, str], content: str, status: int, code: str | None
) -> None:
    local = ScriptedEngine("local", tokens=["x"])
    async for http in gateway(policy_dir, local):
        http.headers.pop("authorization")
        r = await http.post("/v1/chat/completions", content=content, headers=headers)
    assert r.status_code == status
    if status == 400 and code is None:  # the client's own check, named as the request names it
        assert r.json()["error"]["param"] == "prompt_cache_key"
    assert r.json()["error"]["code"] == code and set(r.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert local.requests == []


async def test_models_lists_the_policies_and_healthz_the_engines(policy_dir: Path) -> None:
    async for http in gateway(policy_dir, ScriptedEngine("local", tokens=["x"])):
        models = (await http.get("/v1/models")).json()
        health = (await http.get("/healthz")).json()
    ids = {m["id"] for m in models["data"]}
    assert {"hybridllm/gw-local", "hybridllm/voice-assistant", "hybridllm/chat"} <= ids
    assert health["status"] == "ok"
    assert health["engines"]["cloud"] == {"configured": False}
    assert (
        health["engines"]["local"]["configured"]
        and health["engines"]["local"]["circuit"] == "closed"
    )


async def test_the_door_answers_429_with_retry_after_past_the_concurrency_limit() -> None:
    release, entered = anyio.Event(), []

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        entered.append(1)
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    door = Door(slow, GatewayLimits(max_concurrency=2), Keyring(None))
    transport = httpx.ASGITransport(app=door)
    statuses: list[int] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:

        async def one() -> None:
            r = await http.post("/v1/chat/completions", content=b"{}")
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "concurrency_limit"
                release.set()

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
                await anyio.sleep(0.01)
    assert sorted(statuses) == [200, 200, 429] and len(entered) == 2 and door.active == 0


async def test_no_cors_unless_configured_and_no_prompt_text_in_the_access_log(
    policy_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    origin = {"origin": "https://app.example"}
    caplog.set_level(logging.INFO, logger="hybridllm.gateway.access")
    async for http in gateway(policy_dir, ScriptedEngine("local", tokens=["x"])):
        r = await http.post("/v1/chat/completions", json=body("gw-local", SECRET), headers=origin)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "hybridllm.gateway.access"]
    assert lines and "POST /v1/chat/completions 200" in lines[0]
    assert "policy=gw-local engine=local" in lines[0]
    assert not any("4111" in line or "card" in line for line in lines)
    hybrid = HybridClient(local=ScriptedEngine("local", tokens=["x"]), router=None)
    app = create_app(hybrid, GatewayLimits(cors_origins=("https://app.example",)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as h:
        r = await h.get("/v1/models", headers=origin)
    assert r.headers["access-control-allow-origin"] == "https://app.example"
