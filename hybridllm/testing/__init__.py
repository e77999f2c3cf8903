"""Public test tooling: tools for testing apps built on hybridllm (like httpx's MockTransport).

- :class:`FaultProxy` / :class:`Faults`: a loopback TCP proxy that injects latency, jitter,
  stalls and resets between a client and a real server.
- :class:`LlamaServer`: a real OpenAI-compatible server (``llama_cpp.server``) on loopback, as a
  subprocess, for integration tests.
- :class:`HybridServer`: hybridllm's own OpenAI-compatible server (`hybridllm serve-model`, with
  vLLM's ``prompt_logprobs``) on loopback, as a subprocess: the stand-in cloud.
- :class:`RedisServer`: a real ``redis-server`` on loopback, as a subprocess, for tests of the
  Redis ledger (`hybridllm.guard.budget_redis`).
- :class:`ScriptedEngine`: an engine that plays a timed script, for unit tests of orchestration.

Timing tests without waiting or flaking: run them on a virtual clock. hybridllm stamps every
event and trace with `hybridllm.clock.now()`, the running event loop's clock, so on anyio's trio
backend with trio's ``MockClock(autojump_threshold=0)`` a scripted sleep, a deadline or a hedge
timer takes no real time, and ``trace.ttft_ms`` is exactly the script's time::

    @pytest.fixture
    def anyio_backend():
        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})

The clock jumps whenever every task waits, also while a worker thread works: on it, run
``anyio.to_thread.run_sync`` calls inline (hybridllm's own unit tests do, `tests/unit/conftest.py`).
"""

from hybridllm.engines.scripted import ScriptedCall, ScriptedEngine
from hybridllm.testing.faults import StallDist, heavy_tail
from hybridllm.testing.hybrid_server import HybridServer
from hybridllm.testing.proxy import ConnectionRecord, FaultProxy, Faults
from hybridllm.testing.redis_server import RedisServer, find_redis_server
from hybridllm.testing.server import LlamaServer, ServerStartError

__all__ = [
    "ConnectionRecord",
    "FaultProxy",
    "Faults",
    "HybridServer",
    "LlamaServer",
    "RedisServer",
    "ScriptedCall",
    "ScriptedEngine",
    "StallDist",
    "heavy_tail",
    "find_redis_server",
    "ServerStartError",
]
