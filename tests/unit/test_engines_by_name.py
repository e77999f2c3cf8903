"""More than one cloud: engines by the app's names, failover across clouds before the device
(issue 44), with `ScriptedEngine` doubles on the virtual clock (timing logic only; the real
servers: tests/integration/test_two_clouds.py)."""

from __future__ import annotations

import pytest

from hybridllm import Fallback, HybridClient, Policy, Route, Token
from hybridllm.errors import (
    CloudConnectionError,
    ConfigError,
    DeadlineMissError,
    InvalidArgumentError,
    PolicyError,
    PrivacyBlockedError,
    ServerError,
)
from hybridllm.events import Event
from hybridllm.guard.budget import Cap, ModelPrice, Prices
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


async def test_a_cap_per_cloud_sends_its_requests_to_the_next_cloud_once_spent() -> None:
    """`Cap(engine="smart")` holds smart's requests only: once spent, a quality request goes to
    the next cloud (not the device); the global cap holds both; the ledger keeps each cloud's
    spend."""
    engines = trio([0.05, "smart"], [0.05, "fast"])
    for name in ("smart", "fast"):
        engines[name].model, engines[name].token_count = name, 10
    price = ModelPrice(input_per_million=100.0, output_per_million=100.0)
    prices = Prices(models={"smart": price, "fast": price})
    caps = [Cap(None, "day", 0.01, engine="smart"), Cap(None, "day", 1.0)]
    async with HybridClient(
        engines=engines, policy=QUALITY, prices=prices, budget_caps=caps, router=None
    ) as client:
        served = [(await client.complete("q", max_tokens=20)).trace.engine for _ in range(3)]
        ledger = client.engines["smart"].ledger  # type: ignore[attr-defined]
        preview = client.decide("q", max_tokens=20)
    assert served[0] == "smart" and served[-1] == "fast"  # smart's cap spent on the way
    assert [c.engine for c in preview.state.clouds if c.chosen] == ["fast"]
    smart, fast = ledger.spend("day", engine="smart"), ledger.spend("day", engine="fast")
    assert smart.settled_usd > 0 and fast.settled_usd > 0
    assert ledger.spend("day").settled_usd == pytest.approx(smart.settled_usd + fast.settled_usd)


def test_a_cap_on_a_cloud_the_client_lacks_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        HybridClient(
            engines=trio([0.1, "s"], [0.1, "f"]),
            budget_caps=[Cap(None, "day", 1.0, engine="huge")],
            router=None,
        )


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


async def test_a_next_cloud_predicted_too_slow_is_probed_after_a_while() -> None:
    """A next cloud whose prediction says it cannot answer by the deadline is not started for a
    late cloud, so it would never be measured again; after `PROBE_AFTER` requests without a
    first token it starts beside the device's rescue once, and here answers first."""
    from hybridllm.routing.decide import PROBE_AFTER

    policy = QUALITY.with_(routing={"ttft_deadline_ms": 300})
    engines = trio([2.0, "late"], [0.04, "fast"], [0.05, "device"])
    engines["local"].predicted_ttft_s = 0.1
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        latency = client.routing.latency
        latency.seed("fast", overhead_s=1.0)  # predicted past the 300 ms deadline
        kept, _ = await events_of(client)
        assert 0 < latency.unmeasured["fast"] < PROBE_AFTER
        latency.unmeasured["fast"] = PROBE_AFTER
        probed, _ = await events_of(client)
        assert latency.unmeasured["fast"] == 0  # measured: its count starts again
    assert text_by_engine(kept) == [("local", "device")]
    assert text_by_engine(probed) == [("fast", "fast")]
    assert len(engines["fast"].requests) == 1


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


# ---- tiers by difficulty ---------------------------------------------------------------------


class ScoreRouter:
    """A router double: the score is the number written in the prompt ("0.55" -> 0.55); a cloud
    share reads as the score above which that share lies on a uniform calibration (1 - share)."""

    def score(self, messages: object) -> float:
        return float(messages[-1]["content"])  # type: ignore[index]

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        assert cloud_share is not None and quality_floor is None
        return 1.0 - cloud_share


TIERED = Policy(
    name="tiered",
    routing={"tiers": ["local", "fast", "smart"], "tier_bounds": [0.3, 0.7], "retries": 0},
)


@pytest.mark.parametrize(
    ("score", "engine"), [("0.1", "local"), ("0.3", "fast"), ("0.69", "fast"), ("0.7", "smart")]
)
async def test_tiers_send_each_request_to_its_steps_engine(score: str, engine: str) -> None:
    engines = trio([0.1, "smart"], [0.1, "fast"])
    async with HybridClient(engines=engines, policy=TIERED, router=ScoreRouter()) as client:
        done = await client.complete(score)
        preview = client.decide(score)
    assert done.trace.engine == engine and done.text == {"local": "device"}.get(engine, engine)
    assert "router_tier" in done.trace.reason_codes
    decision = done.trace.decision
    assert decision is not None and decision.by_router == (engine != "local")
    chosen = [c.engine for c in preview.state.clouds if c.chosen]
    assert chosen == [engine if engine != "local" else "fast"]  # the easiest cloud by default


async def test_tier_shares_read_on_the_routers_calibration() -> None:
    policy = Policy(
        name="shares",
        routing={"tiers": ["local", "fast", "smart"], "tier_shares": [0.5, 0.2]},
    )
    engines = trio([0.1, "smart"], [0.1, "fast"])
    async with HybridClient(engines=engines, policy=policy, router=ScoreRouter()) as client:
        got = [(await client.complete(s)).trace.engine for s in ("0.49", "0.5", "0.79", "0.8")]
    assert got == ["local", "fast", "fast", "smart"]  # cuts at 1-0.5 and 1-0.2


async def test_a_failing_tier_cloud_fails_over_to_the_harder_tier_before_the_device() -> None:
    engines = trio([0.2, "smart"], [0.05, SERVER_ERROR])
    async with HybridClient(engines=engines, policy=TIERED, router=ScoreRouter()) as client:
        done = await client.complete("0.5")
    assert done.text == "smart" and done.trace.engine == "smart"
    assert engines["fast"].requests and not engines["local"].requests


async def test_the_hardest_tier_down_falls_to_the_nearest_easier_cloud() -> None:
    engines = trio([0.05, SERVER_ERROR], [0.1, "fast"])
    async with HybridClient(engines=engines, policy=TIERED, router=ScoreRouter()) as client:
        done = await client.complete("0.9")
    assert done.text == "fast" and not engines["local"].requests


async def test_tiers_without_a_router_serve_locally_first() -> None:
    engines = trio([0.1, "smart"], [0.1, "fast"])
    async with HybridClient(engines=engines, policy=TIERED, router=None) as client:
        done = await client.complete("0.9")
    assert done.trace.engine == "local" and "no_router_score" in done.trace.reason_codes


async def test_tiers_of_clouds_only_never_serve_on_the_device_first() -> None:
    policy = Policy(name="c", routing={"tiers": ["fast", "smart"], "tier_bounds": [0.6]})
    engines = trio([0.1, "smart"], [0.1, "fast"])
    async with HybridClient(engines=engines, policy=policy, router=ScoreRouter()) as client:
        got = [(await client.complete(s)).trace.engine for s in ("0.0", "0.59", "0.6")]
    assert got == ["fast", "fast", "smart"]


@pytest.mark.parametrize(
    ("routing", "field"),
    [
        ({"tiers": ["local", "fast"]}, "routing"),  # no bound
        ({"tiers": ["local", "fast"], "tier_bounds": [0.3, 0.6]}, "routing"),  # one too many
        ({"tiers": ["local", "fast", "smart"], "tier_bounds": [0.6, 0.3]}, "routing"),
        ({"tiers": ["local", "fast", "smart"], "tier_shares": [0.2, 0.5]}, "routing"),
        ({"tiers": ["fast", "local"], "tier_bounds": [0.5]}, "routing"),  # device after a cloud
        ({"tiers": ["local", "fast"], "tier_bounds": [0.5], "router_threshold": 0.4}, "routing"),
        ({"tiers": ["local", "fast"], "tier_bounds": [0.5], "prefer": "fast"}, "routing"),
        ({"tiers": ["local", "fast"], "tier_bounds": [1.5]}, "routing"),
        ({"tier_bounds": [0.5]}, "routing"),
    ],
)
def test_bad_tiers_are_policy_errors(routing: dict[str, object], field: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy(name="bad", routing=routing)
    assert info.value.field is not None and info.value.field.startswith(field)


async def test_tiers_naming_an_engine_the_client_lacks_or_the_device_late() -> None:
    lacking = Policy(name="x", routing={"tiers": ["local", "huge"], "tier_bounds": [0.5]})
    with pytest.raises(PolicyError) as info:
        HybridClient(engines=trio([0.1, "s"], [0.1, "f"]), policy=lacking, router=None)
    assert info.value.field == "routing.tiers[1]"
    engines = {
        "phone": ScriptedEngine("phone", tokens=["p"], on_device=True),
        "fast": ScriptedEngine("fast", tokens=["f"]),
    }
    late = Policy(name="y", routing={"tiers": ["fast", "phone"], "tier_bounds": [0.5]})
    with pytest.raises(PolicyError) as info:
        HybridClient(engines=engines, policy=late, router=None)
    assert info.value.field == "routing.tiers[1]"


# ---- plans that pair two engines name their cloud --------------------------------------------


def three(local: ScriptedEngine) -> dict[str, ScriptedEngine]:
    return {
        "local": local,
        "fast": ScriptedEngine("fast", script=[0.02, "F", 0.01, "F"]),
        "smart": ScriptedEngine("smart", script=[0.02, "S", 0.01, "S"]),
    }


CONTINUED_BY_SMART = Policy(
    name="h",
    routing={"prefer": "local", "retries": 0},
    handoff={"after_tokens": 2, "continuer": "smart"},
)


async def test_the_handoffs_continuer_is_the_cloud_its_table_names() -> None:
    engines = three(ScriptedEngine("local", tokens=["a", "b", "c", "d"], ttft_s=0.01, tpot_s=0.01))
    policy = CONTINUED_BY_SMART
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        events, trace = await events_of(client, plan="handoff")
    assert text_by_engine(events) == [
        ("local", "a"),
        ("local", "b"),
        ("smart", "S"),
        ("smart", "S"),
    ]
    assert engines["smart"].requests[0].assistant_prefix == "ab"
    assert not engines["fast"].requests


async def test_a_continuer_whose_circuit_is_open_leaves_the_handoff_to_the_first_cloud() -> None:
    engines = three(ScriptedEngine("local", tokens=["a", "b", "c", "d"], ttft_s=0.01, tpot_s=0.01))
    policy = CONTINUED_BY_SMART
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        client.breakers["smart"].opened_at = 0.0
        events, _ = await events_of(client, plan="handoff")
    assert [who for who, _ in text_by_engine(events)][-1] == "fast"
    assert not engines["smart"].requests


async def test_the_cascades_escalation_is_the_cloud_its_table_names() -> None:
    from tests.unit.test_cascade_scripted import FakeRouter, SignalScriptedEngine

    local = SignalScriptedEngine(hold_s=0.05, tokens=["l1", "l2"], tpot_s=0.01)
    engines = three(local)
    policy = Policy(
        name="c",
        plans=("single", "hedge", "cascade"),
        routing={"router_threshold": 0.5, "retries": 0},
        cascade={"escalation": "smart"},
    )
    router = FakeRouter(0.6, combined=0.9)  # stage 2: the cloud answers
    async with HybridClient(engines=engines, policy=policy, router=router) as client:  # type: ignore[arg-type]
        events, trace = await events_of(client, plan="cascade")
    assert trace.plan == "cascade"  # type: ignore[attr-defined]
    assert {who for who, _ in text_by_engine(events)} == {"smart"}
    assert not engines["fast"].requests


async def test_the_speculative_verifier_is_the_cloud_its_table_names() -> None:
    engines = three(ScriptedEngine("local", tokens=["a"], ttft_s=0.01))
    policy = Policy(
        name="s", routing={"prefer": "cloud", "retries": 0}, speculative={"verifier": "smart"}
    )
    async with HybridClient(engines=engines, policy=policy, router=None) as client:
        events, trace = await events_of(client, plan="speculative")
    # scripted engines cannot draft or verify: the plan streams its verifier plainly
    assert trace.plan == "speculative"  # type: ignore[attr-defined]
    assert {who for who, _ in text_by_engine(events)} == {"smart"} and not engines["fast"].requests


@pytest.mark.parametrize(
    ("table", "name"),
    [("handoff", "continuer"), ("cascade", "escalation"), ("speculative", "verifier")],
)
@pytest.mark.parametrize("named", ["huge", "local"])
def test_a_plans_cloud_must_be_one_of_the_clients_clouds(table: str, name: str, named: str) -> None:
    policy = Policy(name="p", **{table: {name: named}})  # type: ignore[arg-type]
    with pytest.raises(PolicyError) as info:
        HybridClient(engines=trio([0.1, "s"], [0.1, "f"]), policy=policy, router=None)
    assert info.value.field == f"{table}.{name}"


async def test_a_cloud_slow_for_its_deadline_still_serves_a_quality_decision() -> None:
    """Opened for deadline misses alone, the preferred cloud keeps a quality request (its
    rescues cover the deadline); a latency-first request goes to the next cloud."""
    engines = trio([0.05, "smart"], [0.05, "fast"])
    latency_first = Policy(
        name="l",
        routing={
            "prefer": "smart",
            "fallback_order": ["smart", "fast", "local"],
            "objective": "latency",
            "retries": 0,
        },
    )
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        for _ in range(5):
            client.breakers["smart"].record(DeadlineMissError("no token", engine="smart"))
        assert client.breakers["smart"].slow and not client.breakers["smart"].would_allow()
        latency = await client.complete("q", policy=latency_first)
        quality = await client.complete("q")  # its answer closes the circuit
        assert client.breakers["smart"].would_allow()
    assert quality.trace.engine == "smart"
    assert "cloud_circuit_slow_quality" in quality.trace.reason_codes
    assert latency.trace.engine == "fast"


async def test_a_cloud_whose_circuit_opened_for_failures_is_passed_over_even_for_quality() -> None:
    engines = trio([0.05, "smart"], [0.05, "fast"])
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        for _ in range(2):
            client.breakers["smart"].record(SERVER_ERROR)
        done = await client.complete("q")
    assert done.trace.engine == "fast" and not engines["smart"].requests
