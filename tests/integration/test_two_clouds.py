"""Two clouds and the device (issue 44), real parts: the project's `serve-model` on SmolLM2
(`cloud_server`) reached as two clouds, "primary" and "second", each through its own
`FaultProxy`, and the real llama-cpp-python engine on the device. The first cloud fails (500s,
a stall past the deadline, a reset mid-answer) while the second serves. Both clouds are one
server process behind two proxies (two model processes would share the two cores with the
engine); what differs between them is what each proxy does, which is what these tests judge.
Each answer is checked against itself, never against another generation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import Fallback, HybridClient, LlamaCppEngine, OpenAIEngine, Policy, Token
from hybridllm.errors import PrivacyBlockedError
from hybridllm.guard.budget import Cap, ModelPrice, Prices
from hybridllm.testing import FaultProxy, Faults, HybridServer
from tests.integration.servers import ALIAS, API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ORDER = Policy(
    name="two-clouds",
    routing={"prefer": "primary", "fallback_order": ["primary", "second", "local"], "retries": 0},
    sampling={"max_tokens": 24, "temperature": 0.0},
)
COUNT = "Count from 1 to 30, separated by commas."


@pytest.fixture
def second(cloud_server: HybridServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", cloud_server.port), faults=Faults(), record=True) as p:
        yield p


def client_of(
    proxy: FaultProxy, second: FaultProxy, model_path: Path, **kw: object
) -> HybridClient:
    proxy.record = True
    engines = {
        "local": LlamaCppEngine(model_path, n_ctx=1024, n_threads=1),
        "primary": OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS),
        "second": OpenAIEngine(base_url=second.url + "/v1", api_key=API_KEY, model=ALIAS),
    }
    return HybridClient(engines=engines, policy=ORDER, router=None, **kw)  # type: ignore[arg-type]


def fallbacks(events: list[object]) -> list[tuple[str, str, str]]:
    return [(e.from_engine, e.to_engine, e.cause) for e in events if isinstance(e, Fallback)]


async def test_a_500_on_the_first_cloud_is_answered_by_the_second(
    proxy: FaultProxy, second: FaultProxy, model_path: Path
) -> None:
    proxy.faults = Faults(http_status=500)
    async with client_of(proxy, second, model_path) as client:
        async with client.stream("Say hello.") as s:
            events = [e async for e in s.events()]
        report = client.stats()
    tokens = [e for e in events if isinstance(e, Token)]
    assert tokens and {t.engine for t in tokens} == {"second"}
    assert fallbacks(events) == [("primary", "second", "failed")]
    assert proxy.connections[0].http_fault == "HTTP 500"
    assert second.connections and second.connections[0].bytes_down > 0  # the real server
    assert s.trace.engine == "second" and "local" not in s.trace.started
    assert report.engines["second"].counts.requests == 1 and "primary" not in report.engines
    assert report.overall.counts.cloud_answers == 1


async def test_a_stalled_first_cloud_is_rescued_by_the_second_before_the_device(
    proxy: FaultProxy, second: FaultProxy, model_path: Path
) -> None:
    """The first cloud holds its first byte 5 s; the deadline (1.5 s) starts the second cloud
    beside the device's held rescue, and the second cloud's token comes first."""
    proxy.faults = Faults(first_byte_stall_ms=5000)
    policy = ORDER.with_(routing={"ttft_deadline_ms": 1500})
    async with client_of(proxy, second, model_path) as client:
        async with client.stream("Say hello.", policy=policy) as s:
            events = [e async for e in s.events()]
    tokens = [e for e in events if isinstance(e, Token)]
    assert tokens and tokens[0].engine == "second"
    causes = fallbacks(events)
    assert ("primary", "second", "deadline") in causes
    assert s.trace.engine == "second"


async def test_a_reset_mid_answer_is_continued_by_the_second_cloud(
    proxy: FaultProxy, second: FaultProxy, model_path: Path
) -> None:
    proxy.faults = Faults(reset_after_bytes=1500)  # a few SSE chunks in, then a TCP reset
    async with client_of(proxy, second, model_path) as client:
        async with client.stream(COUNT, max_tokens=48) as s:
            events = [e async for e in s.events()]
    tokens = [e for e in events if isinstance(e, Token)]
    by = [t.engine for t in tokens]
    assert by[0] == "primary" and by[-1] == "second"  # the first cloud's start, the rest
    assert by == sorted(by, key=["primary", "second"].index)  # one switch, nothing interleaved
    assert fallbacks(events) == [("primary", "second", "mid_stream")]
    delivered = "".join(t.text for t in tokens if t.engine == "primary")
    sent = second.requests()[-1][1].decode()
    assert delivered.strip() and delivered.strip()[-8:] in sent  # it went on from the text
    assert [sw.to_engine for sw in s.trace.switches] == ["second"]
    assert len(s.trace.seams) == 1 and s.trace.seams[0].engine == "second"


async def test_private_data_reaches_neither_cloud(
    proxy: FaultProxy, second: FaultProxy, model_path: Path
) -> None:
    async with client_of(proxy, second, model_path, privacy="keep-local") as client:
        done = await client.complete("Write to jane.doe@example.com to say hello.")
        with pytest.raises(PrivacyBlockedError):
            await client.complete("Write to jane.doe@example.com.", engine="second")
    assert done.trace.engine == "local" and done.text
    assert not proxy.requests() and not second.requests()


async def test_a_cap_on_the_first_cloud_moves_its_requests_to_the_second_and_stats_name_both(
    proxy: FaultProxy, second: FaultProxy, model_path: Path
) -> None:
    """Both clouds priced (the same served model, two names); a day cap on "primary" that one
    request spends: the next goes to "second", not the device. The ledger keeps each cloud's
    spend (the server's reported usage), and `stats()` counts each by its name."""
    price = ModelPrice(input_per_million=100.0, output_per_million=100.0)
    caps = [Cap(None, "day", 0.011, engine="primary"), Cap(None, "day", 1.0)]
    async with client_of(
        proxy, second, model_path, prices=Prices(models={ALIAS: price}), budget_caps=caps
    ) as client:
        first = await client.complete("Say hi.", max_tokens=8)
        then = await client.complete("Say hello.", max_tokens=8)
        ledger = client.engines["primary"].ledger  # type: ignore[attr-defined]
        report = client.stats()
    assert first.trace.engine == "primary" and then.trace.engine == "second"
    assert first.text and then.text
    spent = {name: ledger.spend("day", engine=name).settled_usd for name in ("primary", "second")}
    assert all(v > 0 for v in spent.values())
    assert ledger.spend("day").settled_usd == pytest.approx(sum(spent.values()))
    assert report.engines["primary"].counts.requests == 1
    assert report.engines["second"].counts.requests == 1
    assert len(proxy.requests()) == 1 and len(second.requests()) == 1
