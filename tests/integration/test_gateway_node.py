"""examples/gateway_complete.mjs, the editor-style completion client in Node.js (its built-in
`fetch` only), against the gateway started as test_gateway.py starts it (in this process, over
the real local engine, Qwen2.5-Coder 0.5B): a stale request aborted after its first chunk (the
gateway cancels its engine: the trace says so), then a completion streamed whole."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import HybridClient, LlamaCppEngine
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.local.resolve import resolve_model
from tests.integration.gateway_fixture import InProcessGateway, write_policies
from tests.integration.recorded import Recorded
from tests.parts import HAS_NODE, needs

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway_complete.mjs"
KEY = "sk-gateway-node"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    path = resolve_model("qwen2.5-coder-0.5b-instruct", pull=True)
    local = LlamaCppEngine(str(path), n_threads=1, n_ctx=2048, warm_up=False)
    policies = write_policies(tmp_path_factory.mktemp("gateway-policies"))
    client = HybridClient(local=local, router=None, policy_dirs=[policies], telemetry=Recorded())
    with InProcessGateway(client, GatewayLimits(max_concurrency=2), api_key=KEY) as gw:
        yield gw


@needs(HAS_NODE, "needs Node.js 20 (node on PATH)")
def test_the_node_completion_client(gateway: InProcessGateway) -> None:
    env = {
        **os.environ,
        "HYBRIDLLM_URL": gateway.url,
        "HYBRIDLLM_KEY": KEY,
        "HYBRIDLLM_MODEL": "hybridllm/gw-local",
    }
    proc = subprocess.run(
        ["node", str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["aborted"] and summary["aborted_chunks"] == 1
    assert summary["engine"] == "local" and summary["text"]
    assert summary["gateway_ttft_ms"] > 0 and summary["client_ttft_ms"] > 0
    recorded = gateway.client.telemetry
    assert isinstance(recorded, Recorded)
    deadline = time.monotonic() + 30.0  # a liveness bound: the gateway records after the close
    while len(recorded.traces) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stale, done = sorted(recorded.traces, key=lambda t: t.t_start)
    assert stale.finish_reason == "cancelled" and stale.attempts[-1].outcome == "cancelled"
    assert done.finish_reason in ("stop", "length") and done.engine == "local"
