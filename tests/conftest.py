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


def _share_the_cores() -> None:
    """In a pytest-xdist worker, give BLAS and OpenMP (numpy, scikit-learn) the worker's share
    of the cores, before either is loaded: each library otherwise starts a thread per core in
    every worker, and their spinning threads slow the other workers' tests several times over."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        affinity = getattr(os, "sched_getaffinity", None)
        cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
        share = str(max(1, cores // workers))
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, share)


_share_the_cores()

import pytest  # noqa: E402

from hybridllm.testing.redis_server import RedisServer, find_redis_server  # noqa: E402

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
