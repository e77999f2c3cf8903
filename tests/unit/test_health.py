"""Circuit breaker: unit tests of the state machine, and routing around an open circuit
(with `ScriptedEngine` doubles), on the virtual clock (the breaker reads `hybridllm.clock`)."""

from __future__ import annotations

import anyio
import pytest

from hybridllm import HybridClient, Policy
from hybridllm.errors import AuthenticationError, CloudConnectionError
from hybridllm.runtime.health import CircuitBreaker
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]


async def test_opens_after_threshold_and_probes_after_reset() -> None:
    cb = CircuitBreaker(threshold=2, reset_after_s=0.05)
    assert cb.allow() and cb.state == "closed"
    cb.record(CloudConnectionError("refused"))
    assert cb.state == "closed"
    cb.record(CloudConnectionError("refused"))
    assert cb.state == "open" and not cb.allow()
    await anyio.sleep(0.06)
    assert cb.state == "half-open"
    assert cb.allow() and not cb.allow()  # one probe at a time
    cb.record(CloudConnectionError("still down"))
    assert cb.state == "open"
    await anyio.sleep(0.06)
    assert cb.allow()
    cb.record(None)
    assert cb.state == "closed" and cb.failures == 0 and cb.allow()


async def test_would_allow_reads_the_state_and_leaves_the_probe() -> None:
    cb = CircuitBreaker(threshold=1, reset_after_s=0.05)
    assert cb.would_allow()
    cb.record(CloudConnectionError("refused"))
    assert not cb.would_allow() and cb.state == "open"
    await anyio.sleep(0.06)
    assert cb.would_allow() and cb.would_allow()  # asking twice takes nothing
    assert cb.allow()  # the probe is still there for a real request
    assert not cb.would_allow() and not cb.allow()  # and now it is taken


async def test_a_preview_leaves_the_half_open_probe_to_the_next_request() -> None:
    """`client.decide()` (nothing is sent) reads the circuit without taking its probe: the next
    real request still probes the cloud, and its success closes the circuit."""
    cloud = ScriptedEngine("cloud", tokens=["cloud"])
    local = ScriptedEngine("local", tokens=["local"])
    policy = Policy(name="cloudy", routing={"prefer": "cloud"})
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        breaker = client.breakers["cloud"] = CircuitBreaker(threshold=1, reset_after_s=0.05)
        breaker.record(CloudConnectionError("refused"))
        decision, _, state = client.decide("q", policy)
        assert state.cloud_circuit_open and decision.primary == "local"
        await anyio.sleep(0.06)
        for _ in range(3):  # previews, as `explain` makes them
            decision, _, state = client.decide("q", policy)
            assert not state.cloud_circuit_open and decision.primary == "cloud"
        assert breaker.state == "half-open"
        res = await client.complete("q")
    assert res.text == "cloud" and res.trace.engine == "cloud"
    assert not [c for c in res.trace.reason_codes if "circuit" in c]  # no circuit spoke
    assert breaker.state == "closed" and len(cloud.requests) == 1


def test_configuration_errors_do_not_open_the_circuit() -> None:
    cb = CircuitBreaker(threshold=1)
    cb.record(AuthenticationError("bad key", status_code=401))
    assert cb.state == "closed"


async def test_open_cloud_circuit_sends_requests_local_at_once() -> None:
    down = ScriptedEngine("cloud", script=[CloudConnectionError("refused")])
    local = ScriptedEngine("local", tokens=["local"])
    policy = Policy(
        name="cloudy", routing={"prefer": "cloud", "retries": 0}
    )  # each failure counts once
    async with HybridClient(local=local, cloud=down, policy=policy) as client:
        client.breakers["cloud"] = CircuitBreaker(threshold=2, reset_after_s=60)
        for _ in range(2):  # the cloud fails before its first token: the local engine answers
            res = await client.complete("q")
            assert res.text == "local" and res.trace.fallback_reason
        assert client.breakers["cloud"].state == "open"
        res = await client.complete("q")
        assert res.text == "local" and "cloud_circuit_open" in res.trace.reason_codes
        assert res.trace.fallback_reason is None
    assert len(down.requests) == 2


async def test_only_engine_is_tried_even_with_an_open_circuit() -> None:
    down = ScriptedEngine("cloud", script=[CloudConnectionError("refused")])
    async with HybridClient(cloud=down, policy=Policy(routing={"retries": 0})) as client:
        client.breakers["cloud"] = CircuitBreaker(threshold=1, reset_after_s=60)
        for _ in range(2):
            with pytest.raises(CloudConnectionError):
                await client.complete("q")
    assert len(down.requests) == 2


def test_deadline_misses_open_the_circuit_by_rate_not_one_unlucky_pair() -> None:
    from hybridllm.errors import DeadlineMissError

    miss = DeadlineMissError("late", engine="cloud")
    tail = CircuitBreaker(threshold=2, window=10, miss_rate=0.5)
    for i in range(100):  # one request in ten misses, sometimes two close together
        tail.record(miss if i % 10 in (3, 5) else None)
    assert tail.state == "closed"

    stuck = CircuitBreaker(threshold=2, window=10, miss_rate=0.5)
    for _ in range(6):
        stuck.record(None)
    stuck.record(miss)
    stuck.record(miss)
    assert stuck.state == "closed"  # 2 of 8: still a tail, not a stuck endpoint
    while stuck.state == "closed":
        stuck.record(miss)
    assert stuck.recent_miss_rate == 0.0  # cleared when it opened
    assert stuck.failures == 0  # misses never count as hard failures

    fresh = CircuitBreaker(threshold=2)
    for _ in range(4):
        fresh.record(miss)
    # two misses at the start (issue 25: the heavy tail's first two draws opened it) and four
    # say no more than a heavy tail would: judged over `min_outcomes` (5) outcomes
    assert fresh.state == "closed" and not fresh.slow
    fresh.record(miss)
    assert fresh.state == "open" and fresh.slow  # an endpoint that stalls on every request


def test_hard_failures_keep_opening_the_circuit_after_two() -> None:
    from hybridllm.errors import CloudConnectionError

    b = CircuitBreaker(threshold=2)
    b.record(CloudConnectionError("refused"))
    b.record(CloudConnectionError("refused"))
    assert b.state == "open" and not b.slow  # broken, not slow: no quality decision goes


def test_a_cloud_failing_one_request_in_ten_is_not_opened_by_two_in_a_row() -> None:
    """Two hard failures in a row open the circuit where failures are half the recent outcomes;
    an endpoint failing 10% of requests that fails twice in a row by chance keeps serving (a
    second cloud or the device answers those two); one that goes down after serving well opens
    at twice the threshold."""
    from hybridllm.errors import ServerError

    fail = ServerError("500", status_code=500)
    flaky = CircuitBreaker(threshold=2, window=10)
    for i in range(100):
        flaky.record(fail if i % 10 in (4, 5) else None)  # two in a row every ten
    assert flaky.state == "closed"

    down = CircuitBreaker(threshold=2, window=10)
    for _ in range(8):
        down.record(None)
    for _ in range(3):
        down.record(fail)
    assert down.state == "closed"  # 3 of 10: not yet said
    down.record(fail)
    assert down.state == "open" and not down.slow  # 4 in a row: down whatever came before


def test_one_failure_after_a_circuit_opened_for_lateness_does_not_make_it_broken() -> None:
    """Outcomes are judged afresh once a circuit opens: a cloud opened for deadline misses that
    still takes a quality request which fails once stays "slow" (its quality decisions keep it),
    not shut out for 30 s as broken by a failure counted before it opened."""
    from hybridllm.errors import DeadlineMissError, ServerError

    miss, fail = DeadlineMissError("late", engine="a"), ServerError("500", status_code=500)
    cb = CircuitBreaker(threshold=2, window=10)
    for outcome in (fail, None, miss, miss, fail, miss, miss, miss):
        cb.record(outcome)
    assert cb.state == "open" and cb.slow
    cb.record(fail)  # one more, after it opened
    assert cb.slow
    cb.record(fail)
    assert cb.state == "open" and not cb.slow  # two in a row since it opened: broken


async def test_two_early_misses_do_not_trip_and_a_miss_opened_circuit_probes_sooner() -> None:
    from hybridllm.errors import DeadlineMissError

    miss = DeadlineMissError("late", engine="cloud")
    cb = CircuitBreaker(threshold=2, window=10, reset_after_s=60, miss_reset_after_s=0.05)
    for outcome in (None, miss, None, miss):
        cb.record(outcome)
    assert cb.state == "closed"  # 2 of 4 seen: not yet judged
    cb.record(miss)
    assert cb.state == "open"  # 3 of 5: half a window, over the rate
    await anyio.sleep(0.06)
    assert cb.state == "half-open"  # opened by misses: the short reset applies
