"""hybridllm's own log records (`hybridllm.logs`): the decision, fallbacks, refusals and circuit
changes are logged under "hybridllm.<module>", and no prompt, answer or secret reaches a record
unless the app opts in (requests run end to end with `ScriptedEngine` doubles)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import hybridllm
from hybridllm import HybridClient, Policy, RefusedError
from hybridllm.errors import CloudConnectionError, ServerError
from hybridllm.guard.budget import Cap
from hybridllm.guard.prices import ModelPrice, Prices
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

EMAIL = "ada.lovelace@example.org"
API_KEY = "sk-proj-Q7vX2mN9pL4kR8sT1wY6zB3cD5fG0hJ"
SENTENCE = "The violet heron counts seventeen lanterns at midnight"
PROMPT = f"{SENTENCE}. Write to {EMAIL} with the key {API_KEY}."
CLOUD_TEXT, LOCAL_TEXT = "Zanzibar quokka ", "marmalade finale"
SECRETS = (EMAIL, API_KEY, SENTENCE, "Zanzibar", "quokka", "marmalade")


@pytest.fixture(autouse=True)
def content_switch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("HYBRIDLLM_LOG_CONTENT", raising=False)
    hybridllm.log_content(None)
    yield
    hybridllm.log_content(None)


def engines() -> tuple[ScriptedEngine, ScriptedEngine]:
    """A cloud that fails mid-answer and a local engine that goes on from its text."""
    failure = CloudConnectionError("connection reset", received_content=True)
    cloud = ScriptedEngine("cloud", script=["Zanzibar ", 0.0, "quokka ", failure])
    return ScriptedEngine("local", tokens=["marmalade", " finale"]), cloud


async def failover(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    caplog.set_level(logging.DEBUG, logger="hybridllm")
    local, cloud = engines()
    async with HybridClient(
        local=local,
        cloud=cloud,
        policy=Policy(routing={"prefer": "cloud"}, privacy={"mode": "off"}),
    ) as client:
        done = await client.complete(PROMPT)
    assert done.text == CLOUD_TEXT + LOCAL_TEXT and EMAIL in str(cloud.requests)
    return [r for r in caplog.records if r.name.startswith("hybridllm")]


def text_of(record: logging.LogRecord) -> str:
    return f"{record.getMessage()} {record.args!r}"


def leaked(records: list[logging.LogRecord]) -> list[str]:
    return [f"{r.name}: {s!r}" for r in records for s in SECRETS if s in text_of(r)]


async def test_the_decision_and_the_fallback_are_logged_without_any_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = await failover(caplog)
    by = {(r.name, r.levelno) for r in records}
    assert ("hybridllm.client", logging.DEBUG) in by  # the decision
    assert ("hybridllm.runtime.stream", logging.INFO) in by  # the mid-stream failover
    decision = next(r for r in records if "Decision(" in r.getMessage())
    assert "plan='single'" in decision.getMessage() and "primary='cloud'" in decision.getMessage()
    assert "prompt_tokens=" in decision.getMessage()  # typed facts, not the prompt
    fallback = next(r for r in records if r.levelno == logging.INFO and "Fallback(" in text_of(r))
    assert "from_engine='cloud'" in fallback.getMessage() and "connection reset" in text_of(
        fallback
    )
    withheld = [r for r in records if "characters withheld" in r.getMessage()]
    assert len(withheld) == 2  # the prompt and the answer, by their length only
    assert leaked(records) == []


@pytest.mark.parametrize("how", ["log_content(True)", "HYBRIDLLM_LOG_CONTENT=1"])
async def test_the_app_can_opt_in_to_log_the_prompt_and_the_answer(
    how: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how.startswith("log_content"):
        hybridllm.log_content(True)
    else:
        monkeypatch.setenv("HYBRIDLLM_LOG_CONTENT", "1")
    records = await failover(caplog)
    debug = " ".join(r.getMessage() for r in records if r.levelno == logging.DEBUG)
    assert SENTENCE in debug and CLOUD_TEXT + LOCAL_TEXT in debug
    assert "characters withheld" not in debug


async def test_refusals_are_logged_by_kind_and_cap_never_by_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hybridllm")
    local, cloud = engines()
    async with HybridClient(local=local, cloud=cloud, privacy="keep-local") as client:
        with pytest.raises(RefusedError):  # routing refuses it
            await client.complete(PROMPT, engine="cloud")
        assert client.cloud is not None
        with pytest.raises(RefusedError):  # the guard, on a path that skipped routing
            client.cloud.check(client_request(PROMPT))
    prices = Prices(models={"scripted": ModelPrice(input_per_million=1, output_per_million=2)})
    async with HybridClient(
        cloud=ScriptedEngine("cloud"), prices=prices, budget_caps=[Cap(None, "request", 1e-9)]
    ) as only:
        assert only.cloud is not None
        with pytest.raises(RefusedError):
            await only.cloud.guarded_call(("hello",), 10, 10, _never_called)
    records = [r for r in caplog.records if r.name.startswith("hybridllm")]
    names = {r.name for r in records if r.levelno == logging.INFO}
    assert {"hybridllm.client", "hybridllm.guard.guarded", "hybridllm.guard.budget"} <= names
    guard = next(r for r in records if r.name == "hybridllm.guard.guarded")
    assert "api_key" in guard.getMessage() and "email" in guard.getMessage()
    assert "per-request cap" in next(r.getMessage() for r in records if "budget" in r.name)
    assert leaked(records) == []


def client_request(text: str) -> hybridllm.GenerationRequest:
    return hybridllm.GenerationRequest(messages=({"role": "user", "content": text},))


async def _never_called() -> tuple[None, None]:
    raise AssertionError("the budget refused it: nothing is sent")


def test_circuit_changes_are_logged_with_the_engine(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hybridllm.runtime.health")
    breaker = CircuitBreaker(name="cloud", threshold=2)
    for _ in range(2):
        breaker.record(ServerError("bad gateway", status_code=502))
    breaker.opened_at = -1e9  # long ago: half-open, and the probe succeeds
    breaker.record(None)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "cloud circuit open for 30 s: ServerError (2 in a row)"),
        (logging.INFO, "cloud circuit closed: a request succeeded"),
    ]
