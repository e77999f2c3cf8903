"""More than one cloud: engines by the app's names, failover across clouds before the device
(issue 44), with `ScriptedEngine` doubles on the virtual clock (timing logic only; the real
servers: tests/integration/test_two_clouds.py)."""

from __future__ import annotations

import pytest

from hybridllm import Fallback, HybridClient, Policy, Route, Token
from hybridllm.errors import (
    CloudConnectionError,
    ConfigError,
    InvalidArgumentError,
    PolicyError,
    PrivacyBlockedError,
    ServerError,
)
from hybridllm.events import Event
from hybridllm.guard.budget import ModelPrice, Prices
from hybridllm.guard.guarded import GuardedEngine
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

QUALITY = Policy(
    name="q",
    routing={"prefer": "smart", "fallback_order": ["smart", "fast", "local"], "retries": 0},
)


def trio(
    smart: list[object], fast: list[object], local: list[object] | None = None
) -> dict[str, ScriptedEngine]:
    return {
        "local": ScriptedEngine("local", script=local or [0.05, "device"]),  # type: ignore[list-item]
        "fast": ScriptedEngine("fast", script=fast),  # type: ignore[arg-type]
        "smart": ScriptedEngine("smart", script=smart),  # type: ignore[arg-type]
    }


async def events_of(client: HybridClient, **args: object) -> tuple[list[Event], object]:
    async with client.stream("q", **args) as s:  # type: ignore[arg-type]
        events = [e async for e in s.events()]
    return events, s.trace


def text_by_engine(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.engine, e.text) for e in events if isinstance(e, Token)]


# ---- the roster ------------------------------------------------------------------------------


async def test_names_are_the_apps_in_events_traces_and_stats() -> None:
    engines = trio([0.2, "smart ", 0.01, "answer"], [0.1, "fast"])
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        events, trace = await events_of(client)
        assert set(client.engines) == {"local", "fast", "smart"}
        assert client.local is engines["local"] and client.cloud is not None
        report = client.stats()
    assert text_by_engine(events) == [("smart", "smart "), ("smart", "answer")]
    route = next(e for e in events if isinstance(e, Route))
    assert route.engine == "smart"
    assert trace.engine == "smart" and tuple(trace.started) == ("smart",)  # type: ignore[attr-defined]
    assert "smart" in report.engines and report.engines["smart"].counts.requests == 1
    assert not engines["fast"].requests and not engines["local"].requests


async def test_prefer_names_the_cloud_that_serves_first() -> None:
    engines = trio([0.1, "smart"], [0.1, "fast"])
    policy = Policy(name="f", routing={"prefer": "fast"})
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        done = await client.complete("q")
        forced = await client.complete("q", engine="smart")
    assert done.text == "fast" and done.trace.engine == "fast"
    assert forced.text == "smart" and forced.trace.engine == "smart"


@pytest.mark.parametrize(
    ("routing", "field"),
    [
        ({"prefer": "gpu"}, "routing.prefer"),
        ({"fallback_order": ["fast", "mars", "local"]}, "routing.fallback_order[1]"),
    ],
)
async def test_a_policy_naming_an_engine_the_client_lacks_is_refused(
    routing: dict[str, object], field: str
) -> None:
    engines = trio([0.1, "s"], [0.1, "f"])
    with pytest.raises(PolicyError) as info:
        HybridClient(engines=engines, policy=Policy(name="p", routing=routing))
    assert info.value.field == field
    async with HybridClient(engines=trio([0.1, "s"], [0.1, "f"]), router=None) as client:
        with pytest.raises(PolicyError) as per_call:
            await client.complete("q", policy=Policy(name="p", routing=routing))
    assert per_call.value.field == field


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (
            lambda: {
                "a": ScriptedEngine("a", on_device=True),
                "b": ScriptedEngine("b", on_device=True),
            },
            ConfigError,
        ),  # noqa: E501
        (lambda: {"local": ScriptedEngine("x", on_device=False)}, ConfigError),
        (lambda: {"cloud": ScriptedEngine("x", on_device=True)}, ConfigError),
        (lambda: {"auto": ScriptedEngine("x")}, InvalidArgumentError),
        (lambda: {"two words": ScriptedEngine("x")}, InvalidArgumentError),
        (lambda: {"a": "not an engine"}, InvalidArgumentError),
        (dict, InvalidArgumentError),
    ],
)
def test_the_engines_are_checked_when_the_client_is_made(make: object, error: type) -> None:
    with pytest.raises(error):
        HybridClient(engines=make())  # type: ignore[operator]


def test_engines_and_the_shorthand_do_not_mix() -> None:
    with pytest.raises(ConfigError):
        HybridClient(local=ScriptedEngine("local"), engines={"x": ScriptedEngine("x")})


# ---- failover across clouds -----------------------------------------------------------------


SERVER_ERROR = ServerError("500", status_code=500)


async def test_a_cloud_failing_before_its_first_token_goes_to_the_next_cloud() -> None:
    engines = trio([0.05, SERVER_ERROR], [0.1, "fast answer"])
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        events, trace = await events_of(client)
    assert text_by_engine(events) == [("fast", "fast answer")]
    fb = [e for e in events if isinstance(e, Fallback)]
    assert [(f.from_engine, f.to_engine, f.cause) for f in fb] == [("smart", "fast", "failed")]
    assert not engines["local"].requests  # the device was not needed


async def test_every_cloud_failing_leaves_the_answer_to_the_device() -> None:
    engines = trio([0.05, SERVER_ERROR], [0.05, CloudConnectionError("refused")])
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        events, _ = await events_of(client)
    assert text_by_engine(events) == [("local", "device")]
    fb = [(f.from_engine, f.to_engine) for f in events if isinstance(f, Fallback)]
    assert fb == [("smart", "fast"), ("fast", "local")]


async def test_a_cloud_reset_mid_answer_is_continued_by_the_next_cloud() -> None:
    smart = [0.05, "One, ", 0.01, "two, ", 0.01, CloudConnectionError("reset")]
    fast = [0.05, "One, ", 0.01, "two, ", 0.01, "three."]  # goes on from the delivered text
    engines = trio(smart, fast)
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        events, trace = await events_of(client)
    assert text_by_engine(events) == [("smart", "One, "), ("smart", "two, "), ("fast", "three.")]
    assert [r.assistant_prefix for r in engines["fast"].requests] == ["One, two, "]
    assert not engines["local"].requests
    fb = [e for e in events if isinstance(e, Fallback)]
    assert [(f.from_engine, f.to_engine, f.cause) for f in fb] == [("smart", "fast", "mid_stream")]


async def test_a_cloud_whose_circuit_is_open_gives_its_place_to_the_next() -> None:
    engines = trio([0.05, "smart"], [0.05, "fast"])
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        for _ in range(10):  # until its circuit opens
            client.breakers["smart"].record(ServerError("500", status_code=500))
        assert client.breakers["smart"].state == "open"
        preview = client.decide("q")
        done = await client.complete("q")
    assert preview.decision.primary == "cloud" and preview.decision.objective == "quality"
    assert done.text == "fast" and not engines["smart"].requests


# ---- the guard and the budget on every cloud --------------------------------------------------


async def test_private_data_reaches_no_cloud() -> None:
    engines = trio([0.05, "smart"], [0.05, "fast"])
    async with HybridClient(
        engines=engines, policy=QUALITY, router=None, privacy="keep-local"
    ) as client:
        done = await client.complete("Mail the report to jane.doe@example.com please.")
        assert all(isinstance(client.engines[n], GuardedEngine) for n in ("fast", "smart"))
        with pytest.raises(PrivacyBlockedError):
            await client.complete("Mail it to jane.doe@example.com", engine="fast")
    assert done.trace.engine == "local"
    assert not engines["smart"].requests and not engines["fast"].requests


async def test_each_cloud_is_priced_by_its_own_model_on_one_ledger() -> None:
    engines = {
        "fast": ScriptedEngine("fast", script=[0.05, "a"], model="cheap", token_count=10),
        "smart": ScriptedEngine("smart", script=[0.05, "b"], model="dear", token_count=10),
    }
    prices = Prices(
        models={
            "cheap": ModelPrice(input_per_million=1.0, output_per_million=1.0),
            "dear": ModelPrice(input_per_million=100.0, output_per_million=100.0),
        }
    )
    async with HybridClient(engines=engines, prices=prices, router=None) as client:
        await client.complete("q", engine="fast", max_tokens=5)
        await client.complete("q", engine="smart", max_tokens=5)
        guards = [client.engines[n] for n in ("fast", "smart")]
    ledgers = {id(g.ledger) for g in guards}  # type: ignore[attr-defined]
    assert len(ledgers) == 1  # one ledger: a cap holds over every cloud
    entries = guards[0].ledger.entries()  # type: ignore[attr-defined]
    cost = {e["model"]: e["cost_nano"] for e in entries if e["state"] == "settled"}
    assert set(cost) == {"cheap", "dear"} and cost["dear"] == pytest.approx(100 * cost["cheap"])


async def test_a_late_cloud_is_rescued_by_the_next_cloud_that_can_be_ready_in_time() -> None:
    """The first cloud says nothing by the deadline; the next cloud, predicted to answer in
    50 ms, starts with the device's rescue and answers before the rescue is released."""
    policy = QUALITY.with_(routing={"ttft_deadline_ms": 300})
    engines = trio([2.0, "late"], [0.04, "fast"], [0.05, "device"])
    engines["fast"].predicted_ttft_s = 0.05
    engines["local"].predicted_ttft_s = 0.1
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        events, trace = await events_of(client)
    assert text_by_engine(events) == [("fast", "fast")]
    fb = [(f.from_engine, f.to_engine, f.cause) for f in events if isinstance(f, Fallback)]
    assert set(fb) == {("smart", "fast", "deadline"), ("smart", "local", "deadline")}
    started = trace.segments_ms["fallback_started"]  # type: ignore[attr-defined]
    assert started <= 300 - 50  # the next cloud by its predicted TTFT ahead of the deadline
    assert trace.ttft_ms < 300  # type: ignore[attr-defined]


async def test_a_next_cloud_that_cannot_be_ready_in_time_leaves_it_to_the_device() -> None:
    policy = QUALITY.with_(routing={"ttft_deadline_ms": 300})
    engines = trio([2.0, "late"], [1.0, "fast"], [0.05, "device"])
    engines["fast"].predicted_ttft_s = 1.0  # past the deadline: not started for it
    engines["local"].predicted_ttft_s = 0.1
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        events, trace = await events_of(client)
    assert text_by_engine(events) == [("local", "device")]
    assert not engines["fast"].requests


async def test_decide_says_which_clouds_were_weighed_and_why() -> None:
    engines = trio([0.05, "smart"], [0.05, "fast"])
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        first = client.decide("q").state.clouds
        for _ in range(10):
            client.breakers["smart"].record(SERVER_ERROR)
        second = client.decide("q").state.clouds
    assert [(c.engine, c.chosen, c.passed_over) for c in first] == [
        ("smart", True, None),
        ("fast", False, None),
    ]
    assert [(c.engine, c.chosen, c.passed_over) for c in second] == [
        ("smart", False, "circuit_open"),
        ("fast", True, None),
    ]
