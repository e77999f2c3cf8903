"""Engine capabilities (`engines.capabilities`): declared, checked as types, forwarded by the
cloud guard through itself; verification through the cloud engine's own client.

A loopback HTTP recorder (a few lines of `http.server` on 127.0.0.1, no model) answers the
speculative plan's requests the way an OpenAI Predicted Outputs endpoint does, and records the
Authorization header of each."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hybridllm import (
    GuardedEngine,
    HybridClient,
    LlamaCppEngine,
    ModelPrice,
    OpenAIEngine,
    Prices,
    SQLiteLedger,
)
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.capabilities import (
    Drafted,
    Drafts,
    LimitsConcurrency,
    Outgoing,
    ReadsSignals,
    SetsApiKey,
    VerifiesAtEndpoint,
    Wraps,
)
from hybridllm.engines.scripted import ScriptedEngine
from hybridllm.errors import (
    AuthenticationError,
    CloudUnavailableError,
    ConfigError,
    PrivacyBlockedError,
)
from hybridllm.guard.guarded import RequestContext
from hybridllm.policy import Policy
from hybridllm.runtime.gather import Gatherer
from tests.loopback import POLL_S

pytestmark = pytest.mark.anyio


@contextmanager
def recorder(status: int = 200) -> Iterator[tuple[str, list[tuple[str, str, dict[str, Any]]]]]:
    """A loopback endpoint: /completions is not found (no log-probability dialect); chat
    completions with a `prediction` accept it whole and stop. Yields its base URL and the
    (path, Authorization, body) of every request."""
    seen: list[tuple[str, str, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization", ""), body))
            code, answer = status, {"error": {"message": "refused"}}
            if status == 200 and not self.path.endswith("/chat/completions"):
                code, answer = 404, {"detail": "Not Found"}
            elif status == 200:
                text = body["prediction"]["content"]
                answer = {
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": 20,
                        "completion_tokens": 2,
                        "completion_tokens_details": {
                            "accepted_prediction_tokens": 2,
                            "rejected_prediction_tokens": 0,
                        },
                    },
                }
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


class _TwoCharDrafter:
    """Drafts "ok" after any context; one character per token."""

    n_vocab = 256

    async def start(self) -> None:
        pass

    def render(self, messages: Sequence[Any]) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages)

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def piece(self, ids: Sequence[int], prev: Sequence[int] = ()) -> bytes:
        return bytes(ids)

    def is_eog(self, tok: int) -> bool:
        return False

    async def draft(self, context: Sequence[int], k: int, *args: object) -> Drafted:
        return Drafted(ids=list(b"ok"[:k]), probs=[1.0] * min(k, 2))


class DraftingScripted(ScriptedEngine):
    """A scripted local engine that declares the drafting capability."""

    def drafter(self) -> _TwoCharDrafter:
        return _TwoCharDrafter()


async def test_verification_goes_through_the_cloud_engines_client_with_a_key_set_later() -> None:
    with recorder() as (url, seen):
        cloud = OpenAIEngine(base_url=url, api_key="key-one", model="m")
        async with HybridClient(DraftingScripted("local"), cloud, router=None) as client:
            async with client.stream("hi", plan="speculative", temperature=0) as s:
                first = "".join([t async for t in s])
            spec = s.trace.speculation
            assert spec is not None and spec.verifier == "predicted-outputs", spec
            assert first == "ok" and spec.rounds == 1
            assert client.cloud is not None
            client.cloud.set_api_key("key-two")  # type: ignore[attr-defined]
            async with client.stream("hi again", plan="speculative", temperature=0) as s:
                second = "".join([t async for t in s])
    assert second == "ok"
    # the probe (two requests) and a round with the first key; then a round with the new one
    assert [(p, a) for p, a, _ in seen] == [
        ("/v1/completions", "Bearer key-one"),
        ("/v1/chat/completions", "Bearer key-one"),
        ("/v1/chat/completions", "Bearer key-one"),
        ("/v1/chat/completions", "Bearer key-two"),
    ]
    assert all(body["model"] == "m" for _, _, body in seen)  # the engine's model


async def test_a_refused_key_in_verification_stops_the_engine_as_a_stream_would() -> None:
    with recorder(status=401) as (url, seen):
        cloud = OpenAIEngine(base_url=url, api_key="bad", model="m")
        with pytest.raises(AuthenticationError), pytest.warns(RuntimeWarning, match="401"):
            await cloud.verification_post("completions", {"prompt": "x", "max_tokens": 1})
        assert cloud.unavailable is not None and "authentication failed (401)" in cloud.unavailable
        with pytest.raises(CloudUnavailableError):  # nothing is sent with a refused key
            await cloud.verification_post("completions", {"prompt": "x", "max_tokens": 1})
        await cloud.aclose()
    assert len(seen) == 1


async def test_set_api_key_on_the_guard_reaches_the_engine_or_says_it_takes_none() -> None:
    engine = OpenAIEngine(base_url="http://127.0.0.1:9/v1", model="m")  # no key: unavailable
    guard = GuardedEngine(engine, privacy="off")
    assert engine.unavailable is not None
    guard.set_api_key("sk-new")
    assert engine.api_key == "sk-new" and engine.unavailable is None
    with pytest.raises(ConfigError, match="non-empty"):
        guard.set_api_key(" ")
    with pytest.raises(ConfigError, match="takes no API key"):
        GuardedEngine(ScriptedEngine("cloud"), privacy="off").set_api_key("sk-new")


async def test_the_guard_scans_reserves_and_settles_each_verification_request() -> None:
    prices = Prices(models={"m": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    ledger = SQLiteLedger()
    settled: list[Any] = []
    context = RequestContext(on_settle=lambda usage, usd, *_: settled.append(usage))
    with recorder() as (url, seen):
        engine = OpenAIEngine(base_url=url, api_key="k", model="m")
        guard = GuardedEngine(engine, privacy="keep-local", ledger=ledger, prices=prices)
        bound = guard.bind(context)
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "prediction": {"type": "content", "content": "ok"},
        }
        # a prompt of token ids is declared as the text it encodes: that text is scanned
        flagged = Outgoing((("verification.prompt", "mail bob.jones@corp-mail.org"),), 9, 3)
        with pytest.raises(PrivacyBlockedError):
            await bound.verification_post("chat/completions", body, flagged)
        assert seen == []  # nothing was sent
        data = await bound.verification_post("chat/completions", body)
        await engine.aclose()
    assert data["choices"][0]["message"]["content"] == "ok" and len(seen) == 1
    assert [(u.prompt_tokens, u.completion_tokens) for u in settled] == [(20, 2)]
    assert ledger.spend("day").reserved_usd == 0
    assert ledger.spend("day").settled_usd == pytest.approx((20 * 1.0 + 2 * 2.0) / 1e6)


def test_engines_declare_what_they_can_do_and_the_guard_forwards_it() -> None:
    local = LlamaCppEngine("qwen2.5-coder-0.5b-instruct", warm_up=False)  # not loaded
    cloud = OpenAIEngine(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    scripted = ScriptedEngine("cloud")
    assert isinstance(local, ReadsSignals) and isinstance(local, Drafts)
    assert not isinstance(local, VerifiesAtEndpoint)
    for capability in (VerifiesAtEndpoint, SetsApiKey, LimitsConcurrency):
        assert isinstance(cloud, capability) and not isinstance(scripted, capability)
    assert not isinstance(cloud, Drafts | ReadsSignals | Wraps)
    guard = GuardedEngine(cloud, privacy="off")
    bound = guard.bind(RequestContext())
    assert isinstance(guard, Wraps) and guard.wrapped() is cloud and bound.wrapped() is cloud
    assert guard.verification_endpoint() == bound.verification_endpoint() == (cloud.base_url, "m")
    assert GuardedEngine(scripted, privacy="off").verification_endpoint() is None


async def test_routing_counts_a_request_in_the_guarded_engines_limit() -> None:
    cloud = OpenAIEngine(
        base_url="http://127.0.0.1:9/v1", api_key="k", model="m", max_concurrency=1
    )
    announced: list[str] = []
    cloud.limit.expect = announced.append  # type: ignore[method-assign]
    engines: Any = {"cloud": GuardedEngine(cloud, privacy="off")}
    request = GenerationRequest([{"role": "user", "content": "hi"}], priority="interactive")
    breakers: Any = {}
    Gatherer().decide(request, Policy(privacy={"mode": "off"}), engines, breakers)
    assert announced == ["interactive"]


async def test_the_speculative_plan_asks_capabilities_and_streams_plainly_without_them() -> None:
    cases = {
        "none: the local engine cannot draft": ScriptedEngine("local"),
        "none: the cloud engine cannot verify drafts": DraftingScripted("local"),
    }
    for why, local in cases.items():
        cloud = ScriptedEngine("cloud", tokens=["plain", " answer"])
        async with HybridClient(local, cloud, router=None) as client:
            async with client.stream("hi", plan="speculative", temperature=0) as s:
                text = "".join([t async for t in s])
        assert s.trace.speculation is not None and s.trace.speculation.verifier == why
        assert text == "plain answer" and s.trace.engine == "cloud"
