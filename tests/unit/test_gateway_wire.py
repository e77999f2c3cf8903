"""The gateway's request side without a model: a chat body as the client's call
(`gateway.wire`), its limits, the ledger URL, and `hybridllm serve`'s argument checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridllm import HybridClient, errors
from hybridllm.cli.main import main
from hybridllm.errors import InvalidArgumentError
from hybridllm.gateway.limits import GatewayLimits, is_loopback
from hybridllm.gateway.wire import chat_call
from hybridllm.guard.budget import SQLiteLedger
from hybridllm.guard.ledgers import ledger_from_url
from hybridllm.server.schema import ApiError

POLICIES = ("chat", "voice-assistant")
MSGS = [{"role": "user", "content": "hi"}]


def call(data: dict[str, Any], header: str | None = None, **limits: Any) -> Any:
    return chat_call(data, header_policy=header, policies=POLICIES, limits=GatewayLimits(**limits))


def refused(data: dict[str, Any], **limits: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(data, **limits)
    return info.value


def test_the_model_names_the_policy_prefixed_or_bare_and_the_header_overrides_it() -> None:
    assert call({"model": "hybridllm/chat", "messages": MSGS}).policy == "chat"
    assert call({"model": "voice-assistant", "messages": MSGS}).policy == "voice-assistant"
    c = call({"model": "hybridllm/chat", "messages": MSGS}, header="voice-assistant")
    assert (c.policy, c.args["policy"], c.model) == (
        "voice-assistant",
        "voice-assistant",
        "hybridllm/chat",
    )


@pytest.mark.parametrize(
    "model", ["gpt-4o", "hybridllm/nope", "../policies/chat.toml", "/etc/x.toml"]
)
def test_an_unknown_policy_or_a_path_is_a_404_model_not_found(model: str) -> None:
    err = refused({"model": model, "messages": MSGS})
    assert (err.status, err.code, err.param) == (404, "model_not_found", "model")


def test_what_the_request_sets_passes_through_and_nothing_else() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    c = call(
        {
            "model": "chat",
            "messages": MSGS,
            "temperature": 0,
            "top_p": 0.5,
            "stop": "END",
            "seed": 7,
            "max_completion_tokens": 9,
            "tools": tools,
            "tool_choice": "auto",
            "response_format": {"type": "text"},
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u-1",
        }
    )
    assert c.args == {
        "policy": "chat",
        "temperature": 0.0,
        "top_p": 0.5,
        "stop": ("END",),
        "seed": 7,
        "max_tokens": 9,
        "tools": tools,
        "tool_choice": "auto",
        "response_format": {"type": "text"},
        "user": "u-1",  # the end user: the policy's per-user caps hold it
    }
    assert (c.stream, c.include_usage) == (True, True)
    # unset: the policy's own sampling (no temperature 1.0 from the body's defaults)
    assert call({"model": "chat", "messages": MSGS}).args == {"policy": "chat"}


@pytest.mark.parametrize(
    ("name", "value"),
    [("n", 2), ("logprobs", True), ("presence_penalty", 0.5), ("logit_bias", {"1": 2}),
     ("parallel_tool_calls", False)],
)  # fmt: skip
def test_an_unsupported_parameter_is_a_400_naming_it(name: str, value: object) -> None:
    err = refused({"model": "chat", "messages": MSGS, name: value})
    assert (err.status, err.param, err.code) == (400, name, "unsupported_parameter")


def test_a_user_that_is_not_a_string_is_a_400_on_user() -> None:
    err = refused({"model": "chat", "messages": MSGS, "user": 7})
    assert (err.status, err.param) == (400, "user")


def test_prompt_cache_key_is_the_client_s_conversation() -> None:
    c = call({"model": "chat", "messages": MSGS, "prompt_cache_key": "conv-1"})
    assert c.args == {"policy": "chat", "conversation": "conv-1"}
    err = refused({"model": "chat", "messages": MSGS, "prompt_cache_key": 7})
    assert (err.status, err.param) == (400, "prompt_cache_key")


def test_null_and_openai_defaults_of_unsupported_parameters_are_accepted() -> None:
    c = call({"model": "chat", "messages": MSGS, "n": 1, "logprobs": False, "suffix": None})
    assert c.args == {"policy": "chat"}


def test_limits_on_messages_and_tokens_name_the_parameter() -> None:
    err = refused({"model": "chat", "messages": MSGS * 3}, max_messages=2)
    assert (err.status, err.param, err.code) == (400, "messages", "too_many_messages")
    err = refused({"model": "chat", "messages": MSGS, "max_tokens": 100}, max_tokens=50)
    assert (err.status, err.param) == (400, "max_tokens")
    err = refused({"model": "chat", "messages": MSGS, "temperature": 3})
    assert (err.status, err.param) == (400, "temperature")
    err = refused(
        {"model": "chat", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    )
    assert (err.status, err.param) == (400, "messages")


def test_the_limits_are_checked() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="max_concurrency"):
        GatewayLimits(max_concurrency=0)
    with pytest.raises(errors.InvalidArgumentError, match="cors_origins"):
        GatewayLimits(cors_origins=("example.com",))


def test_loopback() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "::1", "localhost", "127.3.2.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.2", "example.com", "::"]))


def test_ledger_urls(tmp_path: Path) -> None:
    ledger = ledger_from_url(str(tmp_path / "a.db"))
    assert isinstance(ledger, SQLiteLedger) and ledger.path == tmp_path / "a.db"
    b = ledger_from_url(f"sqlite://{tmp_path}/b.db")
    assert isinstance(b, SQLiteLedger) and b.path == tmp_path / "b.db"
    with pytest.raises(errors.InvalidArgumentError, match="--ledger"):
        ledger_from_url("http://x/y", argument="--ledger")


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--host", "0.0.0.0"], "a key is required to listen on 0.0.0.0"),
        (["--api-key", " "], "--api-key"),
        (["--port", "70000"], "--port"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--cors-origin", "example.com"], "--cors-origin"),
        (["--cloud-url", "ftp://x"], "--cloud-url"),
        (["--cloud", "fast"], "--cloud"),
        (["--cloud", "fast=ftp://x"], "--cloud"),
        (["--cloud", "9x=http://x"], "--cloud"),
        (["--cloud", "a=http://x", "--cloud", "a=http://y"], "--cloud"),
        (["--cloud", "a=http://x", "--cloud-url", "http://y"], "--cloud-url"),
        (["--cloud", "a=http://x", "--cloud-key", "b=k"], "--cloud-key"),
        (["--cloud", "a=http://x", "--cloud-model", "b=m"], "--cloud-model"),
        (["--ledger", "redis://127.0.0.1:1/0"], "--ledger"),  # nothing listens there
        (["--ledger", "ftp://x"], "--ledger"),
        (["--decision-log", "redis://127.0.0.1:1/0"], "--decision-log"),  # nothing listens
        (["--decision-log", "ftp://x"], "--decision-log"),
        (["--prices", "/no/such/prices.toml"], "--prices"),
        (["--local", "no-such-model"], "no-such-model"),
    ],
)
def test_serve_checks_every_argument_before_anything_loads(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYBRIDLLM_GATEWAY_KEY", raising=False)
    monkeypatch.setattr("hybridllm.gateway.command.build_client", _never)
    assert says in one_error_line(["serve", *argv], capsys)


def _never(*_: object) -> None:
    raise AssertionError("the client was built before the arguments were checked")


def _serve_args(argv: list[str]) -> object:
    import argparse

    from hybridllm.gateway.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_named_clouds_from_one_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridllm.gateway.command import named_clouds

    monkeypatch.setenv("SMART_KEY", "sk-smart")
    monkeypatch.setenv("HYBRIDLLM_KEY_FAST", "sk-fast")
    path = tmp_path / "clouds.toml"
    path.write_text(
        '[clouds.fast]\nurl = "http://127.0.0.1:9/v1"\nmodel = "m-small"\n'
        'chat_template = "smollm2-135m-instruct"\n'
        '[clouds.smart]\nurl = "https://x.test/v1"\nkey_env = "SMART_KEY"\n'
    )
    clouds = named_clouds(_serve_args(["--clouds", str(path)]))  # type: ignore[arg-type]
    assert [(c.name, c.url, c.model, c.key, c.chat_template) for c in clouds] == [
        ("fast", "http://127.0.0.1:9/v1", "m-small", "sk-fast", "smollm2-135m-instruct"),
        ("smart", "https://x.test/v1", None, "sk-smart", None),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "",  # no clouds
        "[clouds.fast]\nmodel = 'm'\n",  # no url
        "[clouds.fast]\nurl = 'ftp://x'\n",  # not http(s)
        "[clouds.fast]\nurl = 'http://x/v1'\nretries = '3'\n",  # unknown key
        "[clouds.fast]\nurl = 'http://x/v1'\nchat_template = 3\n",  # not a GGUF's name
        "[clouds.local]\nurl = 'http://x/v1'\n",  # the device's name
        "[clouds.fast]\nurl = 'http://x/v1'\nkey_env = 'NOT_SET_ANYWHERE'\n",
        "[clouds.fast]\nurl = 'http://x/v1'\nkey = 'a'\nkey_env = 'B'\n",
        "[clouds.fast\n",  # bad TOML
    ],
)
def test_a_bad_clouds_file_names_the_option(tmp_path: Path, text: str) -> None:
    from hybridllm.gateway.command import named_clouds

    path = tmp_path / "clouds.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError) as info:
        named_clouds(_serve_args(["--clouds", str(path)]))  # type: ignore[arg-type]
    assert info.value.argument == "--clouds"
    with pytest.raises(InvalidArgumentError) as info:  # one source of named clouds
        named_clouds(_serve_args(["--clouds", str(path), "--cloud", "x=http://h/v1"]))  # type: ignore[arg-type]
    assert info.value.argument == "--clouds"


def test_named_clouds_each_take_their_model_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--cloud NAME=URL` repeated: the clouds in order, each engine named so, its model from
    `--cloud-model NAME=MODEL` and its key from `--cloud-key` or `$HYBRIDLLM_KEY_<NAME>`."""
    import argparse

    from hybridllm.engines.openai_engine import OpenAIEngine
    from hybridllm.gateway.command import add_arguments, named_clouds

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.setenv("HYBRIDLLM_KEY_SMART_ONE", "sk-env")
    args = parser.parse_args(
        ["--cloud", "fast=http://127.0.0.1:9/v1", "--cloud", "smart-one=https://x.test/v1"]
        + ["--cloud-model", "fast=m-small", "--cloud-key", "fast=sk-flag"]
    )
    clouds = named_clouds(args)
    assert [(c.name, c.url, c.model, c.key) for c in clouds] == [
        ("fast", "http://127.0.0.1:9/v1", "m-small", "sk-flag"),
        ("smart-one", "https://x.test/v1", None, "sk-env"),
    ]
    engines = {c.name: OpenAIEngine(base_url=c.url, api_key=c.key, model=c.model) for c in clouds}
    client = HybridClient(engines=engines, router=None)
    assert list(client.engines) == ["fast", "smart-one"] and client.local is None
    assert [e.name for e in client.engines.values()] == ["fast", "smart-one"]
