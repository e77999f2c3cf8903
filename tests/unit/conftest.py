"""The virtual clock of the unit tests.

A test marked `virtual_clock` (a module: `pytestmark = [pytest.mark.anyio,
pytest.mark.virtual_clock]`) runs on anyio's trio backend with
`trio.testing.MockClock(autojump_threshold=0)`: a sleep, a timeout or a deadline takes no real
time, because the clock jumps to the next one as soon as every task waits. hybridllm stamps its
events and traces with `hybridllm.clock.now()`, the event loop's clock, so a trace's figures are
exact virtual milliseconds: such a test asserts order, counts and the script's own times, never a
wall-clock bound. Worker-thread calls (`anyio.to_thread.run_sync`) run inline there, so the clock
cannot jump while a thread works. Every other async unit test runs on asyncio.

No unit test may wait on the real clock: one that spends more than `REAL_SLEEP_LIMIT_S` of real
time in sleeps (`time.sleep`, `anyio.sleep`, `asyncio.sleep`; overlapping sleeps count once)
fails, and says to move it to the virtual clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from trio.testing import MockClock

from tests.unit.models_endpoint import Models, serve_models

T = TypeVar("T")
REAL_SLEEP_LIMIT_S = 1.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "virtual_clock: run on trio's MockClock (tests/unit/conftest.py)"
    )


def virtual(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("virtual_clock") is not None


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> object:
    if not virtual(request):
        return "asyncio"
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


async def run_inline(func: Callable[..., T], *args: Any, **_: Any) -> T:
    """`anyio.to_thread.run_sync` on the virtual clock: the call runs on the loop, in no time."""
    await anyio.lowlevel.checkpoint()
    return func(*args)


@pytest.fixture(autouse=True)
def _threads_inline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if virtual(request):
        monkeypatch.setattr(anyio.to_thread, "run_sync", run_inline)


class RealSleeps:
    """The real seconds during which at least one sleep of the test was under way."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._asleep = 0
        self._since = 0.0

    def _enter(self) -> None:
        if self._asleep == 0:
            self._since = time.perf_counter()
        self._asleep += 1

    def _leave(self) -> None:
        self._asleep -= 1
        if self._asleep == 0:
            self.total_s += time.perf_counter() - self._since

    def timed(self, sleep: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        async def timed_sleep(*args: Any, **kwargs: Any) -> T:
            self._enter()
            try:
                return await sleep(*args, **kwargs)
            finally:
                self._leave()

        return timed_sleep

    def timed_sync(self, sleep: Callable[[float], None]) -> Callable[[float], None]:
        def timed_sleep(seconds: float) -> None:
            self._enter()
            try:
                sleep(seconds)
            finally:
                self._leave()

        return timed_sleep


@pytest.fixture(scope="session", autouse=True)
def _ner_loaded() -> None:
    """The privacy scan's NER pipelines loaded once, before any test (where the privacy extra
    is installed): a client with a cloud loads them by default on a background thread, whose
    waits would otherwise count against whichever test opened the first such client."""
    from hybridllm.guard.privacy_ner import default_scanner

    default_scanner().warm()


@pytest.fixture(autouse=True)
def _no_real_waiting(monkeypatch: pytest.MonkeyPatch) -> Iterator[RealSleeps]:
    sleeps = RealSleeps()
    monkeypatch.setattr(anyio, "sleep", sleeps.timed(anyio.sleep))
    monkeypatch.setattr(asyncio, "sleep", sleeps.timed(asyncio.sleep))
    monkeypatch.setattr(time, "sleep", sleeps.timed_sync(time.sleep))
    yield sleeps
    assert sleeps.total_s <= REAL_SLEEP_LIMIT_S, (
        f"this unit test slept {sleeps.total_s:.2f} s on the real clock (at most "
        f"{REAL_SLEEP_LIMIT_S} s): run it on the virtual clock (@pytest.mark.virtual_clock)"
    )


@pytest.fixture
def endpoint() -> Iterator[tuple[str, type[Models]]]:
    """An OpenAI-compatible `GET /v1/models` on loopback (`tests/unit/models_endpoint.py`)."""
    with serve_models() as found:
        yield found
