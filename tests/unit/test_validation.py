"""Validation at the API's edge (issue 13, part 2): every bad argument is one typed error naming
the argument, the value and the rule, and a request the SDK judged invalid reaches no engine; a
4xx from the cloud is never retried and never counts against the circuit."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hybridllm import (
    ConfigError,
    GenerationRequest,
    HybridClient,
    LlamaCppEngine,
    OpenAIEngine,
    Policy,
    RefusedError,
)
from hybridllm.cli.main import main
from hybridllm.engines import validate
from hybridllm.errors import (
    AllEnginesFailedError,
    CloudStatusError,
    EngineError,
    InvalidArgumentError,
    PolicyError,
    PrivacyBlockedError,
)
from hybridllm.testing import ScriptedEngine
from tests.loopback import POLL_S

pytestmark = pytest.mark.anyio
NAN, INF = float("nan"), float("inf")


def pair() -> tuple[ScriptedEngine, ScriptedEngine]:
    return ScriptedEngine("local", tokens=["l"]), ScriptedEngine("cloud", tokens=["c"])


BAD_STREAM_ARGS = [
    # (keyword arguments, the argument named)
    ({"messages": None}, "messages"),
    ({"messages": ""}, "messages"),
    ({"messages": "  \n\t"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": 123}, "messages"),
    ({"messages": {"role": "user", "content": "hi"}}, "messages"),
    ({"messages": [{"role": "user", "content": "   "}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": ""}]},
        "messages[1].content",
    ),  # fmt: skip
    ({"messages": [{"role": "system", "content": " "}]}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 2.0}, "max_tokens"),
    ({"temperature": 5}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": NAN}, "temperature"),
    ({"temperature": INF}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 3}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": -0.1}, "top_p"),
    ({"top_p": NAN}, "top_p"),
    ({"stop": ""}, "stop"),
    ({"stop": ["END", ""]}, "stop[1]"),
    ({"stop": [1]}, "stop[0]"),
    ({"stop": 5}, "stop"),
    ({"stop": ["x"] * 17}, "stop"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**32}, "seed"),
    ({"seed": "3"}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"policy": 123}, "policy"),
    ({"policy": "  "}, "policy"),
    ({"engine": "gpu"}, "engine"),
    ({"engine": 1}, "engine"),
    ({"options": None}, "options"),
]


@pytest.mark.parametrize(("kwargs", "argument"), BAD_STREAM_ARGS)
async def test_bad_arguments_are_one_typed_error_and_reach_no_engine(
    kwargs: dict[str, Any], argument: str
) -> None:
    local, cloud = pair()
    call = {"messages": "hello", **kwargs}
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        with pytest.raises(InvalidArgumentError) as info:
            client.stream(**call)
        with pytest.raises(InvalidArgumentError):
            await client.complete(**call)
    err = info.value
    assert isinstance(err, ConfigError) and err.argument == argument
    assert err.argument in str(err) and err.rule in str(err) and "must be" in str(err)
    given = next(iter(kwargs.values()))
    if argument in kwargs:  # the value is the one given (NaN is itself)
        assert err.value is given or err.value == given
    assert not local.requests and not cloud.requests  # nothing reached an engine


def test_the_blocking_forms_raise_the_same_error() -> None:
    local, cloud = pair()
    with HybridClient(local=local, cloud=cloud, router=None) as client:
        with pytest.raises(InvalidArgumentError, match="top_p must be"):
            client.complete_sync("hi", top_p=3)
        with pytest.raises(InvalidArgumentError, match="messages must be"):
            list(client.stream_sync(None))  # type: ignore[arg-type]
        assert client.complete_sync("hi", engine="local").text == "l"
    assert len(local.requests) == 1 and not cloud.requests


async def test_valid_edges_pass_through_unchanged() -> None:
    local, cloud = pair()
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        for kwargs in (
            {"temperature": 0, "top_p": 1, "seed": 0, "max_tokens": 1},
            {"temperature": 2.0, "top_p": 1e-6, "seed": 2**32 - 1, "stop": ("a", "b")},
        ):
            await client.complete("hi", engine="local", **kwargs)
        await client.complete([{"role": "system", "content": ""},
                               {"role": "user", "content": "hi"}], engine="local")  # fmt: skip
    first, second, third = local.requests
    assert (first.temperature, first.top_p, first.seed, first.max_tokens) == (0, 1, 0, 1)
    assert second.stop == ("a", "b") and second.seed == 2**32 - 1
    assert third.messages[0]["content"] == ""


def test_a_request_built_directly_is_checked_too() -> None:
    msgs = ({"role": "user", "content": "q"},)
    with pytest.raises(InvalidArgumentError, match="top_p must be a finite number > 0"):
        GenerationRequest(msgs, top_p=3)
    with pytest.raises(InvalidArgumentError, match="temperature must be a finite number from 0"):
        GenerationRequest(msgs, temperature=NAN)
    assert GenerationRequest(msgs, stop=["x"]).stop == ("x",)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": 5}, "temperature"),
        ({"temperature": NAN}, "temperature"),
        ({"top_p": 3}, "top_p"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"retries": 1.0}, "retries"),
        ({"ttft_deadline_ms": INF}, "ttft_deadline_ms"),
        ({"stop": "END"}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"prefer": "gpu"}, "prefer"),
        ({"budget": {"per_day_usd": -1}}, "budget.per_day_usd"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_policy_built_in_python_raises_policy_error_naming_the_field(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(PolicyError) as info:
        Policy(**kwargs)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


def test_a_policy_file_keeps_its_path_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[sampling]\ntemperature = 5.0\n[budget]\nper_day_usd = -1.0\n")
    with pytest.raises(PolicyError) as info:
        HybridClient(local=ScriptedEngine("local"), policy=path)
    assert info.value.path == path and info.value.field in (
        "sampling.temperature",
        "budget.per_day_usd",
    )


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: OpenAIEngine(base_url="ftp://x"), "base_url"),
        (lambda: OpenAIEngine(model="  "), "model"),
        (lambda: OpenAIEngine(timeout=-1), "timeout"),
        (lambda: OpenAIEngine(timeout=NAN), "timeout"),
        (lambda: OpenAIEngine(include_usage="yes"), "include_usage"),
        (lambda: OpenAIEngine(default_headers={"x": 1}), "default_headers"),
        (lambda: OpenAIEngine(continuation="prefill"), "continuation"),  # type: ignore[arg-type]
        (lambda: LlamaCppEngine(n_threads=0), "n_threads"),
        (lambda: LlamaCppEngine(n_ctx=-512), "n_ctx"),
        (lambda: LlamaCppEngine(n_batch=True), "n_batch"),
        (lambda: LlamaCppEngine(model=""), "model"),
        (lambda: LlamaCppEngine(warm_up="no"), "warm_up"),
        (lambda: ScriptedEngine("local", ttft_s=-1), "ttft_s"),
        (lambda: ScriptedEngine("local", tpot_s=NAN), "tpot_s"),
        (lambda: ScriptedEngine("local", tokens="abc"), "tokens"),
        (lambda: ScriptedEngine("9-gpu"), "name"),  # type: ignore[arg-type]
        (lambda: HybridClient(local=ScriptedEngine("local"), privacy="maybe"), "privacy"),
        (lambda: HybridClient(local=ScriptedEngine("local"), policy=5), "policy"),
        (lambda: HybridClient(local="llama"), "local"),
        (
            lambda: HybridClient(local=ScriptedEngine("local"), policy_dirs=["/no/such/dir"]),
            "policy_dirs[0]",
        ),  # fmt: skip
    ],
)
def test_constructors_check_their_arguments(make: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert info.value.argument == argument


# ---- privacy refusals are the documented type -----------------------------------------------


async def test_a_forced_cloud_request_with_personal_data_is_privacy_blocked() -> None:
    local, cloud = pair()
    pol = Policy(name="k", privacy={"mode": "keep-local"})
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
        with pytest.raises(PrivacyBlockedError) as info:
            await client.complete("write to ada.lovelace@example.org", engine="cloud")
        assert (await client.complete("no secrets", engine="cloud")).text == "c"
    err = info.value
    assert isinstance(err, RefusedError) and not err.retryable and err.kinds == ("email",)
    assert "ada" not in str(err) and any("email found" in r for r in err.reasons)
    assert len(cloud.requests) == 1 and not local.requests


# ---- a 4xx is the request's fault: no retry, no circuit -------------------------------------


class Endpoint:
    """A loopback HTTP server answering every chat request with one status."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers or {}
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                outer.hits += 1
                self.rfile.read(int(self.headers.get("content-length", 0)))
                body = json.dumps({"error": {"message": f"bad request {outer.status}"}}).encode()
                self.send_response(outer.status)
                for k, v in {**outer.headers, "content-type": "application/json"}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(POLL_S,), daemon=True
        )

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def endpoint_400() -> Iterator[Endpoint]:
    with Endpoint(400) as ep:
        yield ep


async def test_a_400_is_not_retried_and_leaves_the_circuit_closed(endpoint_400: Endpoint) -> None:
    cloud = OpenAIEngine(base_url=endpoint_400.url, api_key="k", model="m")
    pol = Policy(name="r", routing={"prefer": "cloud", "retries": 3})
    async with HybridClient(cloud=cloud, policy=pol, router=None) as client:
        for _ in range(3):
            with pytest.raises(EngineError) as info:
                await client.complete("hi")
        breaker = client.breakers["cloud"]
        assert breaker.state == "closed" and breaker.failures == 0
    err = info.value
    if isinstance(err, AllEnginesFailedError):
        err = err.attempts[-1][1]  # type: ignore[assignment]
    assert type(err) is CloudStatusError and err.status_code == 400 and not err.retryable
    assert endpoint_400.hits == 3  # one request each: never retried


async def test_a_400_falls_back_to_local_without_touching_the_circuit(
    endpoint_400: Endpoint,
) -> None:
    cloud = OpenAIEngine(base_url=endpoint_400.url, api_key="k", model="m")
    local = ScriptedEngine("local", tokens=["l"])
    pol = Policy(name="r", routing={"prefer": "cloud", "retries": 3})
    async with HybridClient(local=local, cloud=cloud, policy=pol, router=None) as client:
        for _ in range(3):
            assert (await client.complete("hi")).text == "l"
        assert client.breakers["cloud"].state == "closed"
    assert endpoint_400.hits == 3


async def test_5xx_and_429_stay_retryable_with_retry_after() -> None:
    with Endpoint(500) as ep:
        cloud = OpenAIEngine(base_url=ep.url, api_key="k", model="m")
        pol = Policy(name="r", routing={"prefer": "cloud", "retries": 2})
        async with HybridClient(cloud=cloud, policy=pol, router=None) as client:
            with pytest.raises(EngineError):
                await client.complete("hi")
            assert client.breakers["cloud"].failures >= 1  # each failed try counts
        assert ep.hits == 3  # the first try and two retries
    with Endpoint(429, {"retry-after": "0.05"}) as ep:
        cloud = OpenAIEngine(base_url=ep.url, api_key="k", model="m")
        request = GenerationRequest(({"role": "user", "content": "q"},))
        with pytest.raises(CloudStatusError) as info:
            async for _ in cloud.stream(request):
                pass
        await cloud.aclose()
        assert info.value.retryable and info.value.retry_after == 0.05


# ---- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "   "],
        ["explain", "x", "--policy-dir", "/no/such/dir"],
        ["explain", "x", "--threads", "0"],
        ["explain", "x", "--router-score", "2"],
        ["explain", "x", "--queue-s", "-5"],
        ["explain", "x", "--max-tokens", "-1"],
        ["explain", "x", "--found", "shoe-size"],
        ["tune", "--n-ctx", "-1", "--show"],
        ["router", "train", "--seed", "-1"],
        ["demo", "--threads", "-2"],
    ],
)
def test_cli_options_are_checked_before_any_work(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    assert "error: " in capsys.readouterr().err


# ---- tool-call messages are kept whole, never stripped (issues 24, 26) -------------------------

CALL = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
ASKED = {"role": "user", "content": "what is the weather?"}


@pytest.mark.parametrize("content", ["", None])
def test_a_tool_loop_is_kept_whole(content: str | None) -> None:
    called = {"role": "assistant", "content": content, "tool_calls": CALL}
    result = {"role": "tool", "content": '{"temp": 12}', "tool_call_id": "c1"}
    out = validate.messages([ASKED, called, result])
    assert out[1] == {"role": "assistant", "content": "", "tool_calls": CALL}
    assert out[2] == result


BAD_TOOL_MESSAGES = [
    ({"role": "tool", "content": "{}"}, "messages[1].tool_call_id", "a non-blank string"),
    ({"role": "tool", "content": "{}", "tool_call_id": "zz"}, "messages[1].tool_call_id",
     "an earlier assistant message made"),
    ({"role": "assistant", "content": "", "function_call": {}}, "messages[1].function_call",
     "use tool_calls"),
    ({"role": "function", "content": "{}", "name": "f"}, "messages[1].role", "use tool_calls"),
    ({"role": "user", "content": "hi", "tool_calls": CALL}, "messages[1].tool_calls",
     "a user message holds only"),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
     "messages[1].tool_calls[0]", "'type': 'function'"),
    ({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]},
     "messages[1].tool_calls[0].function.arguments", "a string"),
]  # fmt: skip


@pytest.mark.parametrize(("message", "argument", "says"), BAD_TOOL_MESSAGES)
async def test_a_malformed_tool_message_is_refused_by_name(
    message: dict[str, Any], argument: str, says: str
) -> None:
    local, cloud = pair()
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        with pytest.raises(InvalidArgumentError) as info:
            client.stream([ASKED, message])
    assert info.value.argument == argument
    assert says in str(info.value)
    assert not local.requests and not cloud.requests


async def test_a_message_field_the_sdk_does_not_send_is_refused_and_name_is_kept() -> None:
    local, cloud = pair()
    extra = [{"role": "user", "content": "hi", "refusal": None}]
    named = [{"role": "user", "content": "hi", "name": "ada"}]
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        with pytest.raises(InvalidArgumentError, match=r"messages\[0\]\.refusal must be absent"):
            client.stream(extra)
        with pytest.raises(InvalidArgumentError, match=r"messages\[0\]\.name must be"):
            client.stream([{"role": "user", "content": "hi", "name": 3}])
        await client.complete(named, engine="cloud")
    assert [dict(m) for m in cloud.requests[0].messages] == named
