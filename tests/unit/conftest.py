"""The virtual clock of the unit tests.

A test marked `virtual_clock` (a module: `pytestmark = [pytest.mark.anyio,
pytest.mark.virtual_clock]`) runs on anyio's trio backend with
`trio.testing.MockClock(autojump_threshold=0)`: a sleep, a timeout or a deadline takes no real
time, because the clock jumps to the next one as soon as every task waits. hybridllm stamps its
events and traces with `hybridllm.clock.now()`, the event loop's clock, so a trace's figures are
exact virtual milliseconds: such a test asserts order, counts and the script's own times, never a
wall-clock bound. Worker-thread calls (`anyio.to_thread.run_sync`) run inline there, so the clock
cannot jump while a thread works. Every other async unit test runs on asyncio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from trio.testing import MockClock

T = TypeVar("T")


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
