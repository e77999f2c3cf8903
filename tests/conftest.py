"""Shared by both kinds of test. `unit/` needs no model, no network and no server; everything
under `integration/` (the real llama-cpp-python engine on a real GGUF, the real loopback server)
is marked `integration`, so `pytest -m "not integration"` or `pytest tests/unit` runs the fast
part alone. The one exception: the Redis ledger's cases of the ledger's behavioural tests
(`unit/test_budget.py`) run against a real loopback `redis-server` (`redis_url`, below), and are
marked `integration` too."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm.testing.redis_server import RedisServer, find_redis_server

INTEGRATION = Path(__file__).parent / "integration"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of a real `redis-server` on a free loopback port with its own temporary
    directory, for the whole session (each test keeps to its own key prefix). Without the binary
    the tests that need it skip, except in CI (`CI` or `HYBRIDLLM_CI` set; `.ci/run` sets the
    latter and installs redis-server), where they fail."""
    if find_redis_server() is None:
        if os.environ.get("CI") or os.environ.get("HYBRIDLLM_CI"):
            pytest.fail("redis-server is not installed (.ci/run installs it with apt-get)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with RedisServer() as server:
        yield server.url
